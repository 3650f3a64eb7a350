/* `nopad bench`: the ENC workload on nopad alone. */
#ifndef NOPAD_TOOLS_BENCH_H
#define NOPAD_TOOLS_BENCH_H

/* argv[0] is "nopad", argv[1] "bench". Returns the process exit code. */
int cmd_bench(int argc, char **argv);

#endif
