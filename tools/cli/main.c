/* nopad — the command-line front end: `nopad <command> [options]`.
 *
 * One file per subcommand (embed.c, info.c, bench.c, ...), each `cmd_NAME(argc, argv)` with
 * argv[0] the command's name; a new one is a file and a line in `commands` below. Shared helpers
 * are in cli.h, the embedding writers in output.h. Uses the public API only (include/nopad.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cpu_settings.h"
#include "cli.h"
#include "nopad.h"

typedef struct command {
    const char *name;
    const char *summary; /* one line of `nopad --help` */
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"embed", "embed lines of text (or token ids), one embedding per line", cmd_embed},
    {"classify", "label lines of text with the model's classification head", cmd_classify},
    {"rerank", "score a query against lines of text with a cross-encoder", cmd_rerank},
    {"generate", "generate text with a decoder, streamed as it is produced", cmd_generate},
    {"info", "describe a model (a folder or a .gguf file)", cmd_info},
    {"bench", "time the encoder on random batches (the ENC workload)", cmd_bench},
    {"tokenize", "token ids (or token strings) of lines of text; --decode: text of ids", cmd_tokenize},
    {"serve", "an OpenAI-compatible HTTP server (completions, chat, embeddings)", cmd_serve},
    {"train", "fine-tune or train a BERT model on the CPU (classification, masked LM)", cmd_train},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void print_main_help(FILE *f) {
    fputs("usage: nopad <command> [options]\n"
          "\n"
          "Padding-free inference for encoders (BERT, RoBERTa, DistilBERT, ALBERT, DeBERTa-v2/v3:\n"
          "nopad embed, classify, rerank)\n"
          "and decoders (GPT-2, LLaMA, Mistral, Qwen2: nopad generate).\n"
          "\n"
          "commands:\n",
          f);
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fputs("\n"
          "options:\n"
          "  -h, --help       show this help; 'nopad <command> --help' shows a command's options\n"
          "  -V, --version    print the version\n"
          "\n"
          "exit status: 0 success, 1 error (message on stderr), 2 bad command line.\n",
          f);
}

int main(int argc, char **argv) {
    restart_with_cpu_settings(argv);
    cli_argv = argv;
    if (argc < 2) {
        print_main_help(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "help") == 0) {
        print_main_help(stdout);
        return EXIT_OK;
    }
    if (strcmp(name, "-V") == 0 || strcmp(name, "--version") == 0) {
        printf("nopad %s (build %s)\n", nopad_version(), nopad_build_id());
        return EXIT_OK;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    if (name[0] == '-') print_error("unknown option '%s'", name);
    else print_error("unknown command '%s'", name);
    print_main_help(stderr);
    return EXIT_USAGE;
}
