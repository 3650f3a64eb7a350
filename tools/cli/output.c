/* The writers of output.h. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "output.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* ---- .npy -------------------------------------------------------------------------------- */

/* .npy format 1.0: magic, version, a little-endian u16 header length, then a Python dict literal
 * padded with spaces and ending in '\n' so that the data starts at a multiple of 64 bytes. The
 * header is always NPY_HEADER_BYTES long, room for any shape, so that it can be rewritten in
 * place once the row count is known. */
enum { NPY_HEADER_BYTES = 128 };

static int write_npy_header(FILE *f, int64_t rows, int32_t cols) {
    const uint16_t one = 1;
    const char endian = *(const unsigned char *)&one == 1 ? '<' : '>'; /* floats are host order */
    char header[NPY_HEADER_BYTES];
    memset(header, ' ', sizeof header);
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    header[8] = (char)((NPY_HEADER_BYTES - 10) & 0xff);
    header[9] = (char)((NPY_HEADER_BYTES - 10) >> 8);
    char dict[NPY_HEADER_BYTES];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '%cf4', 'fortran_order': False, 'shape': (%" PRId64 ", %" PRId32
                     "), }",
                     endian, rows, cols);
    if (n < 0 || n > NPY_HEADER_BYTES - 11) return -1; /* cannot happen: the dict is < 100 bytes */
    memcpy(header + 10, dict, (size_t)n);
    header[NPY_HEADER_BYTES - 1] = '\n';
    return fwrite(header, 1, sizeof header, f) == sizeof header ? 0 : -1;
}

/* ---- writer ------------------------------------------------------------------------------ */

static int writer_failed(writer *w) {
    print_error("cannot write %s: %s", w->name, errno ? strerror(errno) : "write error");
    return -1;
}

int writer_begin(writer *w) {
    if (w->format != FORMAT_NPY) return 0;
    struct stat st;
    w->seekable = 0;
    int flags = fcntl(fileno(w->f), F_GETFL);
    if (fstat(fileno(w->f), &st) == 0 && S_ISREG(st.st_mode) && flags >= 0 && !(flags & O_APPEND)) {
        w->header_pos = ftello(w->f);
        w->seekable = w->header_pos >= 0;
    }
    if (w->seekable && write_npy_header(w->f, 0, w->hidden) != 0) return writer_failed(w);
    return 0;
}

/* One JSON array of n floats. "%.9g" round-trips a float32 exactly; values are finite (checked
 * by the caller) since JSON has no NaN or infinity. */
static void write_json_row(FILE *f, const float *x, int32_t n) {
    fputc('[', f);
    for (int32_t i = 0; i < n; i++) {
        if (i) fputc(',', f);
        fprintf(f, "%.9g", (double)x[i]);
    }
    fputc(']', f);
}

int writer_batch(writer *w, int32_t n_seqs, const int32_t *cu_seqlens, const float *out) {
    const int32_t H = w->hidden;
    const size_t rows = (size_t)(w->per_token ? cu_seqlens[n_seqs] : n_seqs);
    errno = 0;
    if (w->format == FORMAT_NPY) {
        if (w->seekable) {
            if (fwrite(out, sizeof(float) * (size_t)H, rows, w->f) != rows) return writer_failed(w);
        } else {
            size_t have = (size_t)w->rows * (size_t)H;
            if (reserve((void **)&w->held, &w->held_cap, have + rows * (size_t)H, sizeof(float)))
                return -1;
            memcpy(w->held + have, out, rows * (size_t)H * sizeof(float));
        }
        w->rows += (int64_t)rows;
        return 0;
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        if (w->per_token) {
            fputc('[', w->f);
            for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
                if (t > cu_seqlens[s]) fputc(',', w->f);
                write_json_row(w->f, out + (size_t)t * (size_t)H, H);
            }
            fputc(']', w->f);
        } else {
            write_json_row(w->f, out + (size_t)s * (size_t)H, H);
        }
        fputc('\n', w->f);
    }
    if (ferror(w->f)) return writer_failed(w);
    return 0;
}

int writer_end(writer *w) {
    errno = 0;
    if (w->format == FORMAT_NPY) {
        if (w->seekable) {
            if (fseeko(w->f, w->header_pos, SEEK_SET) != 0 ||
                write_npy_header(w->f, w->rows, w->hidden) != 0 || fseeko(w->f, 0, SEEK_END) != 0)
                return writer_failed(w);
        } else {
            size_t n = (size_t)w->rows;
            if (write_npy_header(w->f, w->rows, w->hidden) != 0 ||
                (n && fwrite(w->held, sizeof(float) * (size_t)w->hidden, n, w->f) != n))
                return writer_failed(w);
        }
    }
    if (fflush(w->f) != 0 || ferror(w->f)) return writer_failed(w);
    return 0;
}

void writer_free(writer *w) {
    free(w->held);
    w->held = NULL;
    w->held_cap = 0;
}

/* ---- output files written whole --------------------------------------------------------- */

/* The temporary a signal removes: one output at a time per process. */
static char signal_tmp[PATH_MAX + 64];
static struct sigaction old_actions[3];
static const int CLEANUP_SIGNALS[3] = {SIGINT, SIGTERM, SIGHUP};

static void remove_tmp_on_signal(int sig) {
    if (signal_tmp[0]) unlink(signal_tmp); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void watch_signals(const char *tmp) {
    snprintf(signal_tmp, sizeof signal_tmp, "%s", tmp);
    struct sigaction sa = {.sa_handler = remove_tmp_on_signal};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaction(CLEANUP_SIGNALS[i], &sa, &old_actions[i]);
}

static void unwatch_signals(void) {
    for (int i = 0; i < 3; i++) sigaction(CLEANUP_SIGNALS[i], &old_actions[i], NULL);
    signal_tmp[0] = 0;
}

int output_check(const char *output, const char *input) {
    if (output && !output[0]) {
        print_error("--output '': expected a file name ('-': stdout)");
        return -1;
    }
    struct stat in, out;
    if (!output || stat(output, &out) != 0) return 0; /* a new file cannot be the input */
    const int have_in = input ? stat(input, &in) == 0 : fstat(STDIN_FILENO, &in) == 0;
    if (have_in && in.st_dev == out.st_dev && in.st_ino == out.st_ino && S_ISREG(out.st_mode)) {
        print_error("--output '%s' is the input file%s%s%s: writing it would destroy the input; "
                    "give another output file", output, input ? " '" : " (stdin)",
                    input ? input : "", input ? "'" : "");
        return -1;
    }
    return 0;
}

int output_open(output_file *of, const char *path) {
    *of = (output_file){.f = stdout, .name = "stdout"};
    if (!path) return 0;
    of->name = path;
    struct stat sb;
    const int exists = stat(path, &sb) == 0;
    char *target = NULL;
    if (exists && S_ISREG(sb.st_mode)) target = realpath(path, NULL); /* through any link */
    else if (!exists && lstat(path, &sb) != 0) target = strdup(path); /* a dangling link: in place */
    if (!target) {
        of->f = fopen(path, "wb");
        if (!of->f) print_error("cannot open output '%s': %s", path, strerror(errno));
        return of->f ? 0 : -1;
    }
    const char *slash = strrchr(target, '/');
    const int dir_len = slash ? (int)(slash - target) + 1 : 0;
    const size_t cap = strlen(target) + 64;
    of->tmp = malloc(cap);
    if (!of->tmp) {
        free(target);
        print_error("out of memory");
        return -1;
    }
    snprintf(of->tmp, cap, "%.*s.%s.nopad-%ld.tmp", dir_len, target, target + dir_len,
             (long)getpid());
    of->path = target;
    const int fd = open(of->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd >= 0 && exists) (void)fchmod(fd, sb.st_mode & 07777); /* the replaced file's mode */
    of->f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!of->f) {
        print_error("cannot open output '%s': %s (writing its temporary %s)", path,
                    strerror(errno), of->tmp);
        if (fd >= 0) close(fd), unlink(of->tmp);
        free(of->tmp), free(of->path);
        of->tmp = of->path = NULL;
        return -1;
    }
    watch_signals(of->tmp);
    return 0;
}

/* fsync of the folder holding path, so that the rename itself is durable. */
static void sync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
}

int output_commit(output_file *of) {
    if (!of->f) return -1;
    errno = 0;
    int bad = fflush(of->f) != 0 || ferror(of->f);
    if (!bad && of->tmp && fsync(fileno(of->f)) != 0 && errno != EINVAL) bad = 1;
    int err = errno;
    if (of->f != stdout && fclose(of->f) != 0 && !bad) bad = 1, err = errno;
    of->f = NULL;
    if (!bad && of->tmp && rename(of->tmp, of->path) != 0) bad = 1, err = errno;
    if (bad) {
        print_error("cannot write %s: %s", of->name, err ? strerror(err) : "write error");
        output_discard(of);
        return -1;
    }
    if (of->tmp) sync_parent(of->path);
    output_discard(of);
    return 0;
}

void output_discard(output_file *of) {
    if (of->f && of->f != stdout) fclose(of->f);
    of->f = NULL;
    if (of->tmp) {
        unlink(of->tmp); /* after a commit it is gone already */
        unwatch_signals();
    }
    free(of->tmp), free(of->path);
    of->tmp = of->path = NULL;
}

/* ---- progress ---------------------------------------------------------------------------- */

void progress_show(progress *p, int final) {
    if (!p->enabled) return;
    double t = now_seconds();
    if (!final && (t - p->start < 1.0 || t - p->last < 0.25)) return;
    if (final && !p->shown) return;
    double elapsed = t - p->start > 1e-9 ? t - p->start : 1e-9;
    fprintf(stderr, "\r embedded %" PRId64 " lines, %" PRId64 " tokens, %.0f tokens/s ", p->lines,
            p->tokens, (double)p->tokens / elapsed);
    if (final) fputc('\n', stderr);
    fflush(stderr);
    progress_line_open = !final;
    p->shown = 1;
    p->last = t;
}
