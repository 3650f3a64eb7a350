/* nopad-worker: one rank of a tensor-parallel model whose leader (a process that called
 * nopad_model_load with tp_size > 1 and no launcher) started it. It loads its shard and runs the
 * leader's steps until the leader frees the model. Not for running by hand. */
#include <stdio.h>
#include <string.h>

#include "../cpu_settings.h"
#include "nopad.h"

int main(int argc, char **argv) {
    restart_with_cpu_settings(argv); /* as the CLI: the leader's process may not pass them on */
    if (argc == 2 && strcmp(argv[1], "--tp-worker-check") == 0) { /* the leader's check: the same build? */
        puts(nopad_build_id());
        return 0;
    }
    if (argc != 2 || strcmp(argv[1], "--tp-worker") != 0) {
        fprintf(stderr, "nopad-worker: a tensor-parallel worker that nopad_model_load starts (tp_size > 1, no "
                        "launcher); it is not run by hand. To start the ranks yourself: mpirun -np N nopad ... --tp N\n");
        return 2;
    }
    const nopad_status st = nopad_tp_worker();
    if (st != NOPAD_OK) {
        fprintf(stderr, "nopad-worker: %s\n", nopad_last_error());
        return 1;
    }
    return 0;
}
