/*
 * cfx-store - the engine's TCP store (capi/src/rendezvous/store_tcp.c), served by a launcher:
 * cfxrun --transport gloo and cfxrun --elastic run it, so the ranks meet through the one store
 * implementation there is, whoever serves it. Built from capi's store code (linked with the
 * engine's internals), installed beside cfxrun.
 *
 *   cfx-store [PORT]     serves the store on PORT (default 0: a free port the system picks), for
 *                        every world the job forms (generation 0), and prints "port N" once it
 *                        listens. Then it reads commands from its standard input, one a line:
 *                          set KEY VALUE   sets KEY (no spaces) to VALUE (the rest of the line);
 *                                          prints "ok"
 *                          get KEY         prints "1 LEN", then LEN bytes and a newline; "0" when
 *                                          KEY is not set
 *                        and ends when its input ends (its launcher is gone) or on "quit".
 * A port it cannot serve on: "error MESSAGE" on standard output, exit status 2.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "rendezvous/store.h"

#define LINE_MAX_BYTES (1 << 20)

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0;
    if (argc > 2 || port < 0 || port > 65535) {
        fprintf(stderr, "usage: cfx-store [PORT]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    cx_store *store = NULL;
    cfx_status st = cx_store_tcp_create(&(cx_tcp_store_params){.host = "127.0.0.1", .port = port,
                                                                .serve = 1, .generation = 0,
                                                                .timeout_s = 30},
                                        &store);
    if (st) {
        printf("error %s\n", cx_error_message());
        return 2;
    }
    const char *colon = strrchr(store->where, ':');
    printf("port %d\n", colon ? atoi(colon + 1) : port);
    fflush(stdout);
    char *line = malloc(LINE_MAX_BYTES);
    int status = 0;
    while (line && fgets(line, LINE_MAX_BYTES, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *key = strchr(line, ' ');
        if (key)
            *key++ = '\0';
        if (!strcmp(line, "quit"))
            break;
        if (!strcmp(line, "set") && key && strchr(key, ' ')) {
            char *value = strchr(key, ' ');
            *value++ = '\0';
            st = cx_store_set(store, key, value, strlen(value));
            printf(st ? "error %s\n" : "ok\n", cx_error_message());
        } else if (!strcmp(line, "get") && key) {
            int present = 0;
            void *data = NULL;
            size_t len = 0;
            st = store->ops->check(store, key, &present);
            if (!st && present)
                st = store->ops->get(store, key, &data, &len);
            if (st)
                printf("error %s\n", cx_error_message());
            else if (!present)
                printf("0\n");
            else {
                printf("1 %zu\n", len);
                fwrite(data, 1, len, stdout);
                printf("\n");
            }
            free(data);
        } else {
            printf("error unknown command \"%.40s\"\n", line);
        }
        fflush(stdout);
    }
    free(line);
    cx_store_destroy(store);
    return status;
}
