/* `nopad serve`: an OpenAI-compatible HTTP server (see serve.h for its files and docs/serve.md). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"

static const char serve_help[] =
    "usage: nopad serve [--model M] [--embedding-model DIR] [options]\n"
    "\n"
    "Serves a decoder and an encoder over HTTP with the routes OpenAI clients, vLLM and TEI\n"
    "users expect: POST /v1/completions, /v1/chat/completions (tool calls too) and /v1/responses\n"
    "(plain JSON or stream: true, Server-Sent Events), POST /v1/embeddings and /embed, TEI's\n"
    "/predict and /rerank (an encoder with a classification head), GET /v1/models, /health and\n"
    "/metrics (Prometheus). Generation runs on the engine, which fuses every running request into one\n"
    "packed step; embedding requests that arrive together share one packed encoder batch.\n"
    "Without --model and --embedding-model it serves the default models (SmolLM2-135M-Instruct\n"
    "Q4_1 and all-MiniLM-L6-v2 in $NOPAD_CACHE, default ~/.cache/nopad: scripts/\n"
    "fetch_default_decoder.sh and scripts/fetch_default_model.sh put them there).\n"
    "\n"
    "options:\n"
    "  --model M               a decoder (.gguf file or folder) for generation, or an encoder\n"
    "                          folder for embeddings\n"
    "  --embedding-model DIR   an encoder folder for /v1/embeddings and /embed (and /predict,\n"
    "                          /rerank when it has a *ForSequenceClassification head)\n"
    "  --host H                address to listen on (default 127.0.0.1)\n"
    "  --port P                TCP port (default 8080; 0: any free port, printed at the start)\n"
    "  --api-key KEY           requests must send 'Authorization: Bearer KEY' (/health and\n"
    "                          /metrics excepted), else 401\n"
    "  --chat-template NAME    the chat format instead of the one recognised from the model's\n"
    "                          template: chatml, llama3, llama2, llama2-sys, llama2-sys-bos,\n"
    "                          llama2-sys-strip, mistral-v1, mistral-v3, mistral-v3-tekken,\n"
    "                          mistral-v7\n"
    "  --max-queue N           requests waiting at most (generation and embeddings each); one\n"
    "                          more gets 429 with Retry-After (default 1024)\n"
    "  --max-body-bytes N      larger request bodies get 413 (default 2000000)\n"
    "  --kv-tokens N           the engine's KV pool in tokens (default 8192); prompt + max_tokens\n"
    "                          of one request must fit it and the model's context\n"
    "  --max-running N         generation requests running at once (default 256)\n"
    "  --step-tokens N         tokens in one engine step (default 2048)\n"
    "  --embed-batch-tokens N  tokens in one encoder batch (default 16384); a larger request\n"
    "                          runs in turns of this many with the others\n"
    "  --http-threads N        threads serving connections (default 4)\n"
    "  --shutdown-timeout S    on SIGTERM or SIGINT: seconds to finish in-flight requests\n"
    "                          before cancelling them (default 10); then exit 0\n"
    "  --device D              cpu (default) or cuda\n"
    "  --dtype T               compute dtype: fp32 (CPU default), fp16 (CUDA default) or bf16\n"
    "  --threads N             CPU threads (default: OpenMP's default)\n"
    "  --weights W             a GGUF file's quantized weights: auto (default: as stored on the\n"
    "                          CPU), native, f32, f16, bf16 (dequantised; the compute dtype's)\n"
    TP_HELP
    "                          It splits --model (else --embedding-model); the other model\n"
    "                          runs whole on rank 0, which alone serves HTTP\n"
    "  -h, --help              show this help\n"
    "\n"
    "exit status: 0 after a shutdown by signal, 1 when the server cannot start (message on\n"
    "stderr), 2 for a bad command line.\n";

enum {
    OPT_MODEL = 256,
    OPT_EMBEDDING_MODEL,
    OPT_HOST,
    OPT_PORT,
    OPT_API_KEY,
    OPT_CHAT_TEMPLATE,
    OPT_MAX_QUEUE,
    OPT_MAX_BODY,
    OPT_KV_TOKENS,
    OPT_MAX_RUNNING,
    OPT_STEP_TOKENS,
    OPT_EMBED_BATCH,
    OPT_HTTP_THREADS,
    OPT_SHUTDOWN,
    OPT_DEVICE,
    OPT_DTYPE,
    OPT_THREADS,
    OPT_TP,
    OPT_WEIGHTS,
};

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"embedding-model", required_argument, NULL, OPT_EMBEDDING_MODEL},
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
    {"max-queue", required_argument, NULL, OPT_MAX_QUEUE},
    {"max-body-bytes", required_argument, NULL, OPT_MAX_BODY},
    {"kv-tokens", required_argument, NULL, OPT_KV_TOKENS},
    {"max-running", required_argument, NULL, OPT_MAX_RUNNING},
    {"step-tokens", required_argument, NULL, OPT_STEP_TOKENS},
    {"embed-batch-tokens", required_argument, NULL, OPT_EMBED_BATCH},
    {"http-threads", required_argument, NULL, OPT_HTTP_THREADS},
    {"shutdown-timeout", required_argument, NULL, OPT_SHUTDOWN},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"tp", required_argument, NULL, OPT_TP},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

double serve_now(void) { return now_seconds(); }

/* 0 to run, 1 after --help, -1 on a usage error (reported). */
static int parse_options(int argc, char **argv, serve_options *o) {
    *o = (serve_options){.host = "127.0.0.1", .port = 8080, .max_queue = 1024,
                         .max_body_bytes = 2000000, .http_threads = 4, .kv_tokens = 8192,
                         .max_running = 256, .step_tokens = 2048, .embed_batch_tokens = 16384,
                         .shutdown_timeout = 10, .tp = 1};
    cli_parser p = cli_parser_start(argc, argv, long_options);
    int c;
    while ((c = cli_getopt(&p)) != -1) {
        const char *v = optarg;
        int bad = 0;
        switch (c) {
        case 'h': fputs(serve_help, stdout); return 1;
        case OPT_MODEL: o->model = v; break;
        case OPT_EMBEDDING_MODEL: o->embedding_model = v; break;
        case OPT_HOST: o->host = v; break;
        case OPT_PORT: bad = parse_int("--port", v, 0, 65535, &o->port); break;
        case OPT_API_KEY:
            o->api_key = v;
            if (!v[0]) {
                print_error("--api-key must not be empty");
                bad = 1;
            }
            break;
        case OPT_CHAT_TEMPLATE: o->chat_template = v; break;
        case OPT_MAX_QUEUE: bad = parse_int("--max-queue", v, 1, 1 << 20, &o->max_queue); break;
        case OPT_MAX_BODY: bad = parse_int("--max-body-bytes", v, 64, 1L << 30, &o->max_body_bytes); break;
        case OPT_KV_TOKENS: bad = parse_int("--kv-tokens", v, 16, INT32_MAX, &o->kv_tokens); break;
        case OPT_MAX_RUNNING: bad = parse_int("--max-running", v, 1, 65536, &o->max_running); break;
        case OPT_STEP_TOKENS: bad = parse_int("--step-tokens", v, 1, 1 << 20, &o->step_tokens); break;
        case OPT_EMBED_BATCH:
            bad = parse_int("--embed-batch-tokens", v, 1, 1 << 24, &o->embed_batch_tokens);
            break;
        case OPT_HTTP_THREADS: bad = parse_int("--http-threads", v, 1, 256, &o->http_threads); break;
        case OPT_SHUTDOWN: bad = parse_int("--shutdown-timeout", v, 0, 3600, &o->shutdown_timeout); break;
        case OPT_DEVICE: bad = parse_device(v, &o->device); break;
        case OPT_DTYPE:
            bad = parse_dtype(v, &o->dtype);
            o->dtype_given = 1;
            break;
        case OPT_THREADS: bad = parse_int("--threads", v, 0, 4096, &o->threads); break;
        case OPT_TP: bad = parse_int("--tp", v, 1, TP_MAX, &o->tp); break;
        case OPT_WEIGHTS: bad = parse_weights(v, &o->weights); break;
        default: cli_print_opt_error(&p); return -1;
        }
        if (bad) return -1;
    }
    if (o->chat_template) {
        chat_template t;
        if (chat_template_by_name(o->chat_template, &t) != 0) {
            print_error("--chat-template '%s' is not one nopad knows: %s", o->chat_template,
                        chat_template_names());
            return -1;
        }
    }
    return 0;
}

/* The served name of a model: its file or folder name, without ".gguf". */
static void model_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && path[start - 1] != '/') start--;
    size_t len = n - start;
    if (len > 5 && strncmp(path + start + len - 5, ".gguf", 5) == 0) len -= 5;
    if (len >= cap) len = cap - 1;
    memcpy(out, path + start, len);
    out[len] = '\0';
}

/* $NOPAD_CACHE/name (default ~/.cache/nopad), where the fetch scripts put the default models. */
static const char *default_path(const char *name, char *buf, size_t cap) {
    const char *cache = getenv("NOPAD_CACHE");
    const char *home = getenv("HOME");
    if (cache && cache[0]) snprintf(buf, cap, "%s/%s", cache, name);
    else snprintf(buf, cap, "%s/.cache/nopad/%s", home ? home : ".", name);
    return buf;
}

/* What a model is loaded with, split over `tp` ranks (every rank builds the same). */
static nopad_model_params load_params(const serve_options *o, long tp) {
    nopad_model_params mp = model_params(o->device, o->dtype, o->dtype_given, (int)o->threads);
    mp.tp_size = (int32_t)tp;
    mp.weights = o->weights;
    return mp;
}

static nopad_model *load(const serve_options *o, const char *path, long tp) {
    const nopad_model_params mp = load_params(o, tp);
    return open_model_with(path, &mp);
}

/* The decoder, its engine and its chat template. */
static int setup_decoder(server *s, nopad_model *m, const char *path) {
    s->decoder = m;
    nopad_model_get_info(m, &s->dec_info);
    s->dec_tok = nopad_model_tokenizer(m);
    if (!s->dec_tok) {
        print_error("model '%s' has no tokenizer nopad can use%s%s: the server needs one", path,
                    nopad_model_tokenizer_error(m) ? ": " : "",
                    nopad_model_tokenizer_error(m) ? nopad_model_tokenizer_error(m) : "");
        return -1;
    }
    model_name(path, s->decoder_name, sizeof s->decoder_name);
    const char *text = nopad_model_chat_template(m);
    if (s->o.chat_template) {
        chat_template_by_name(s->o.chat_template, &s->tmpl);
        s->has_template = 1;
    } else if (text) {
        if (chat_template_detect(text, &s->tmpl) != 0) {
            char markers[512];
            chat_template_markers(text, markers, sizeof markers);
            print_error("model '%s' has a chat template nopad does not recognise (not ChatML, "
                        "Llama-3, Llama-2 or Mistral); %s%s%s. If the model was trained on one of "
                        "nopad's formats, start the server with --chat-template NAME (%s); a model "
                        "of another format has no chat route yet (any NAME serves /v1/completions "
                        "with prompts in the model's own format, but chat would write NAME's "
                        "format). The template begins: %.200s",
                        path, markers[0] ? "it holds the markers " : "it holds no turn marker nopad knows",
                        markers, markers[0] ? " (none of which is a format nopad writes)" : "",
                        chat_template_names(), text);
            return -1;
        }
        s->has_template = 1;
    }
    nopad_engine_params ep = nopad_engine_default_params();
    ep.kv_cache_tokens = (int32_t)s->o.kv_tokens;
    ep.max_running = (int32_t)s->o.max_running;
    ep.max_step_tokens = (int32_t)s->o.step_tokens;
    if (ep.max_running > ep.max_step_tokens) ep.max_running = ep.max_step_tokens;
    ep.max_queue = (int32_t)s->o.max_queue;
    nopad_status st = nopad_engine_create(m, &ep, &s->engine);
    if (st != NOPAD_OK) {
        print_error("%s", library_error(st));
        return -1;
    }
    nopad_engine_stats es;
    nopad_engine_get_stats(s->engine, &es);
    int64_t pool = (int64_t)es.kv_blocks_total * es.kv_block_size;
    s->context_tokens = s->dec_info.max_position_embeddings;
    if (pool < s->context_tokens) s->context_tokens = (int32_t)pool;
    return 0;
}

static int setup_encoder(server *s, nopad_model *m, const char *path) {
    s->encoder = m;
    nopad_model_get_info(m, &s->enc_info);
    s->enc_tok = nopad_model_tokenizer(m);
    if (!s->enc_tok) {
        print_error("model '%s' has no tokenizer nopad can use: the server needs one", path);
        return -1;
    }
    if (s->enc_info.pooling == NOPAD_POOLING_NONE) {
        print_error("model '%s' pools nothing: /v1/embeddings needs a pooled output", path);
        return -1;
    }
    model_name(path, s->encoder_name, sizeof s->encoder_name);
    if (embed_batcher_start(s, &s->batcher) != NOPAD_OK) {
        print_error("cannot start the embedding thread");
        return -1;
    }
    return 0;
}

#define DEFAULT_DECODER "SmolLM2-135M-Instruct.Q4_1.gguf"

/* The model --tp splits: --model, else --embedding-model, else the default decoder. One model
 * only, because a rank follows one model (nopad_tp_follow); the other runs whole on rank 0. */
static const char *split_model(const serve_options *o, char *buf, size_t cap) {
    if (o->model) return o->model;
    if (o->embedding_model) return o->embedding_model;
    return default_path(DEFAULT_DECODER, buf, cap);
}

/* Loads what the options name, or the default models. */
static int load_models(server *s) {
    const serve_options *o = &s->o;
    char dec_buf[4096], enc_buf[4096];
    const char *model = o->model, *emb = o->embedding_model;
    if (!model && !emb) {
        model = default_path(DEFAULT_DECODER, dec_buf, sizeof dec_buf);
        emb = default_path("all-MiniLM-L6-v2", enc_buf, sizeof enc_buf);
        struct stat sb;
        if (stat(model, &sb) != 0) {
            print_error("no --model given and the default decoder is not at %s: run "
                        "scripts/fetch_default_decoder.sh, or give --model", model);
            return -1;
        }
        if (stat(emb, &sb) != 0) {
            print_error("no --embedding-model given and the default encoder is not at %s: run "
                        "scripts/fetch_default_model.sh, or give --model / --embedding-model", emb);
            return -1;
        }
    }
    if (model) {
        nopad_model *m = load(o, model, o->tp);
        if (!m) return -1;
        if (model_is_decoder(m)) {
            if (setup_decoder(s, m, model)) return -1;
        } else if (emb) {
            nopad_model_free(m);
            print_error("--model '%s' is an encoder and --embedding-model is given too: give a "
                        "decoder as --model", model);
            return -1;
        } else if (setup_encoder(s, m, model)) {
            return -1;
        }
    }
    if (emb) {
        nopad_model *m = load(o, emb, model ? 1 : o->tp);
        if (!m) return -1;
        if (model_is_decoder(m)) {
            nopad_model_free(m);
            print_error("--embedding-model '%s' is a decoder: give an encoder folder (bert, "
                        "roberta, ...)", emb);
            return -1;
        }
        if (setup_encoder(s, m, emb)) return -1;
    }
    return 0;
}

/* ---- the step-time poller -------------------------------------------------------------------- */

typedef struct poller {
    server *s;
    pthread_t thread;
    atomic_int stop;
} poller;

static void *poll_main(void *arg) {
    poller *p = arg;
    while (!atomic_load(&p->stop)) {
        nopad_engine_stats st;
        int busy = 0;
        if (nopad_engine_get_stats(p->s->engine, &st) == NOPAD_OK) {
            metrics_engine_steps(&p->s->metrics, &st);
            busy = st.running + st.waiting > 0;
        }
        struct timespec ts = {0, busy ? 2000000L : 50000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* What a request that sets none of the sampling fields gets, as the request parser fills it in
 * (OpenAI's temperature 1 samples: a small model answers better at a lower one). */
static void log_generation_defaults(void) {
    static const char body[] = "{\"prompt\": \"x\"}";
    gen_request r;
    api_error e;
    if (openai_parse_generation(body, sizeof body - 1, GEN_COMPLETION, &r, &e)) return;
    char top_k[16] = "off", max_tokens[16] = "16";
    if (r.top_k > 0) snprintf(top_k, sizeof top_k, "%d", r.top_k);
    if (r.max_tokens > 0) snprintf(max_tokens, sizeof max_tokens, "%d", r.max_tokens);
    fprintf(stderr,
            "nopad serve: generation defaults: temperature %g top_p %g top_k %s min_p %g "
            "repetition_penalty %g max_tokens %s (chat: what the context leaves) seed random\n",
            r.temperature, r.top_p, top_k, r.min_p, r.repetition_penalty, max_tokens);
    gen_request_free(&r);
}

/* ---- the command ----------------------------------------------------------------------------- */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int cmd_serve(int argc, char **argv) {
    static server srv; /* one server per process; its threads outlive no call */
    server *s = &srv;
    memset(s, 0, sizeof *s);
    int rc = parse_options(argc, argv, &s->o);
    if (rc) return rc > 0 ? EXIT_OK : EXIT_USAGE;
    const int rank = tp_begin(s->o.tp, s->o.device);
    if (rank < 0) return EXIT_ERROR;
    if (rank > 0) { /* HTTP is rank 0's: this one runs its share of the split model's steps */
        char buf[4096];
        const nopad_model_params mp = load_params(&s->o, s->o.tp);
        return tp_follow(split_model(&s->o, buf, sizeof buf), &mp);
    }
    /* SIGTERM / SIGINT are taken by sigwait below, so every thread started from here blocks
     * them; a broken client socket must not kill the server */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics_init(&s->metrics);
    pthread_mutex_init(&s->jobs_lock, NULL);
    atomic_init(&s->next_id, 1);
    s->created = (long long)time(NULL);
    int exit_code = EXIT_ERROR;
    struct MHD_Daemon *d = NULL;
    poller pl = {.s = s};
    int poller_started = 0;
    if (load_models(s)) goto done;
    if (waker_start(s)) print_error("no waker thread: connections are resumed on the engine's thread");
    if (s->engine && pthread_create(&pl.thread, NULL, poll_main, &pl) == 0) poller_started = 1;
    char err[512];
    d = http_start(s, err, sizeof err);
    if (!d) {
        print_error("%s", err);
        goto done;
    }
    fprintf(stderr, "nopad serve: listening on http://%s%s%s:%d/", strchr(s->o.host, ':') ? "[" : "",
            s->o.host, strchr(s->o.host, ':') ? "]" : "", http_port(d));
    if (s->engine)
        fprintf(stderr, " generation: %s (chat template: %s, context %d tokens)", s->decoder_name,
                s->has_template ? chat_family_name(s->tmpl.family) : "none", s->context_tokens);
    if (s->batcher) fprintf(stderr, " embeddings: %s", s->encoder_name);
    fputc('\n', stderr);
    if (s->engine) log_generation_defaults();

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    /* stop accepting; answer what is in flight until the deadline, then cancel the rest */
    fprintf(stderr, "nopad serve: %s: stopping (in flight: %d)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            atomic_load(&s->inflight));
    atomic_store(&s->draining, 1);
    const int listen_fd = MHD_quiesce_daemon(d);
    if (listen_fd >= 0) close(listen_fd);
    const double deadline = now_seconds() + (double)s->o.shutdown_timeout;
    while (atomic_load(&s->inflight) > 0 && now_seconds() < deadline) sleep_ms(20);
    if (atomic_load(&s->inflight) > 0) {
        /* each request still waiting is answered now (503, or a stream's error event), not when
         * the engine's step or the encoder's batch ends: MHD_stop_daemon aborts the process while
         * a connection is suspended */
        fprintf(stderr, "nopad serve: cancelling %d requests still in flight\n", atomic_load(&s->inflight));
        if (s->engine) gen_cancel_all(s);
        embed_cancel_all(s->batcher);
        const double grace = now_seconds() + 5.0; /* for the answers to go out */
        while (atomic_load(&s->inflight) > 0 && now_seconds() < grace) sleep_ms(20);
    }
    exit_code = EXIT_OK;
done:
    if (d) MHD_stop_daemon(d);
    if (poller_started) {
        atomic_store(&pl.stop, 1);
        pthread_join(pl.thread, NULL);
    }
    embed_batcher_stop(s->batcher);
    nopad_engine_stats es;
    if (s->engine && nopad_engine_get_stats(s->engine, &es) == NOPAD_OK && es.running > 0)
        fprintf(stderr, "nopad serve: waiting for the engine's step in progress to end (up to "
                        "--step-tokens tokens)\n");
    nopad_engine_free(s->engine); /* its last calls may still post resumes */
    waker_stop(s);
    nopad_model_free(s->decoder);
    nopad_model_free(s->encoder);
    chat_template_free(&s->tmpl);
    pthread_mutex_destroy(&s->jobs_lock);
    metrics_destroy(&s->metrics);
    if (exit_code == EXIT_OK) fprintf(stderr, "nopad serve: stopped\n");
    return exit_code;
}
