/* `nopad serve` in a build without libmicrohttpd (CMake found no libmicrohttpd-dev). */
#include "cli.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    print_error("this nopad was built without libmicrohttpd, so it cannot serve: install "
                "libmicrohttpd-dev (scripts/install_deps.sh) and build again");
    return EXIT_ERROR;
}
