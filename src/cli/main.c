/* loom command-line interface. */
#include <stdio.h>
#include <string.h>

#include "loom.h"

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: loom <command> [options]\n");
        return argc < 2;
    }
    fprintf(stderr, "loom: unknown command '%s'\n", argv[1]);
    return 2;
}
