/*
 * test_store_abi - the public rendezvous store (cfx_store_*, conflux.h) through the ABI alone, as
 * a launcher uses it: served and spoken to, keys set and read from both sides, the SET events
 * with the connection that set each key (none for keys the server sets), a CLOSED event for a
 * client that disconnects and for one whose process is killed, a server that goes away, and the
 * errors: bad arguments, a taken port, nothing at the address, a foreign program there.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "conflux/conflux.h"

#define EVENT_WAIT_S 10.0

static cfx_store *serve(void)
{
    cfx_store *s = NULL;
    assert_int_equal(cfx_store_serve(0, 1, &s), CFX_OK);
    assert_non_null(s);
    assert_true(cfx_store_port(s) > 0);
    return s;
}

static cfx_store *connect_to(const cfx_store *server)
{
    cfx_store *c = NULL;
    assert_int_equal(cfx_store_connect("127.0.0.1", cfx_store_port(server), 5.0, &c), CFX_OK);
    assert_non_null(c);
    assert_int_equal(cfx_store_port(c), cfx_store_port(server));
    return c;
}

/* Asserts that `key` holds the string `want` in s (and that the look says it is set). */
static void expect_stored(cfx_store *s, const char *key, const char *want)
{
    char buf[256];
    size_t len = 99;
    int present = -1;
    assert_int_equal(cfx_store_get(s, key, buf, sizeof buf, &len, &present), CFX_OK);
    assert_int_equal(present, 1);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(buf, want, len);
}

static void expect_unset(cfx_store *s, const char *key)
{
    size_t len = 99;
    int present = -1;
    assert_int_equal(cfx_store_get(s, key, NULL, 0, &len, &present), CFX_OK);
    assert_int_equal(present, 0);
    assert_int_equal(len, 0);
}

static cfx_store_event next_event(cfx_store *s, cfx_status want)
{
    cfx_store_event ev = {.version = CFX_STORE_EVENT_VERSION};
    assert_int_equal(cfx_store_next_event(s, want == CFX_OK ? EVENT_WAIT_S : 0.2, &ev), want);
    return ev;
}

static void expect_set_event(cfx_store *s, uint64_t connection, const char *key, const char *value)
{
    cfx_store_event ev = next_event(s, CFX_OK);
    assert_int_equal(ev.kind, CFX_STORE_EVENT_SET);
    assert_int_equal(ev.connection, connection);
    assert_string_equal(ev.key, key);
    assert_int_equal(ev.len, strlen(value));
    assert_memory_equal(ev.value, value, ev.len);
}

/* ---- keys from both sides, and their events ------------------------------------------------- */

static void test_set_get_both_sides(void **state)
{
    (void)state;
    cfx_store *server = serve(), *a = connect_to(server), *b = connect_to(server);
    assert_int_equal(cfx_store_set(a, "from/a", "alpha", 5), CFX_OK);
    assert_int_equal(cfx_store_set(server, "from/server", "sigma", 5), CFX_OK);
    expect_stored(server, "from/a", "alpha");
    expect_stored(b, "from/a", "alpha");
    expect_stored(a, "from/server", "sigma");
    expect_stored(server, "from/server", "sigma");
    expect_unset(server, "missing");
    expect_unset(b, "missing");
    /* An empty value is set; setting again replaces. */
    assert_int_equal(cfx_store_set(b, "empty", NULL, 0), CFX_OK);
    expect_stored(server, "empty", "");
    assert_int_equal(cfx_store_set(b, "from/a", "replaced", 8), CFX_OK);
    expect_stored(a, "from/a", "replaced");
    /* A buffer too small: the full length, the first cap bytes. */
    char small[3] = {0};
    size_t len = 0;
    int present = 0;
    assert_int_equal(cfx_store_get(a, "from/a", small, sizeof small, &len, &present), CFX_OK);
    assert_int_equal(present, 1);
    assert_int_equal(len, 8);
    assert_memory_equal(small, "rep", 3);
    /* Binary values keep every byte. */
    unsigned char bin[300];
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = (unsigned char)(i * 7);
    assert_int_equal(cfx_store_set(a, "binary", bin, sizeof bin), CFX_OK);
    unsigned char got[300];
    assert_int_equal(cfx_store_get(server, "binary", got, sizeof got, &len, &present), CFX_OK);
    assert_int_equal(len, sizeof bin);
    assert_memory_equal(got, bin, sizeof bin);
    cfx_store_free(a);
    cfx_store_free(b);
    cfx_store_free(server);
}

static void test_set_events_name_the_connection(void **state)
{
    (void)state;
    cfx_store *server = serve(), *a = connect_to(server), *b = connect_to(server);
    assert_int_equal(cfx_store_set(a, "k1", "one", 3), CFX_OK);
    cfx_store_event ev = next_event(server, CFX_OK);
    assert_int_equal(ev.kind, CFX_STORE_EVENT_SET);
    uint64_t id_a = ev.connection;
    assert_true(id_a >= 1);
    assert_string_equal(ev.key, "k1");
    assert_int_equal(cfx_store_set(b, "k2", "two", 3), CFX_OK);
    ev = next_event(server, CFX_OK);
    uint64_t id_b = ev.connection;
    assert_true(id_b >= 1 && id_b != id_a);
    assert_string_equal(ev.key, "k2");
    /* The server's own keys make no event; the events keep their order. */
    assert_int_equal(cfx_store_set(server, "mine", "x", 1), CFX_OK);
    assert_int_equal(cfx_store_set(a, "k3", "three", 5), CFX_OK);
    assert_int_equal(cfx_store_set(b, "k4", "", 0), CFX_OK);
    expect_set_event(server, id_a, "k3", "three");
    expect_set_event(server, id_b, "k4", "");
    ev = next_event(server, CFX_ERR_TIMEOUT);
    assert_int_equal(ev.kind, CFX_STORE_EVENT_NONE);
    assert_non_null(strstr(cfx_last_error(), "no event"));
    /* A client that disconnects: CLOSED with its id, after its SET. */
    assert_int_equal(cfx_store_set(b, "k5", "five", 4), CFX_OK);
    cfx_store_free(b);
    expect_set_event(server, id_b, "k5", "five");
    ev = next_event(server, CFX_OK);
    assert_int_equal(ev.kind, CFX_STORE_EVENT_CLOSED);
    assert_int_equal(ev.connection, id_b);
    assert_null(ev.key);
    assert_null(ev.value);
    cfx_store_free(a);
    ev = next_event(server, CFX_OK);
    assert_int_equal(ev.kind, CFX_STORE_EVENT_CLOSED);
    assert_int_equal(ev.connection, id_a);
    cfx_store_free(server);
}

/* A client in a process that is killed (SIGKILL: nothing of it says goodbye): CLOSED. */
static void test_killed_client_process_closes(void **state)
{
    (void)state;
    cfx_store *server = serve();
    int port = cfx_store_port(server);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        cfx_store *c = NULL;
        if (cfx_store_connect("127.0.0.1", port, 5.0, &c) != CFX_OK ||
            cfx_store_set(c, "child/started", "1", 1) != CFX_OK)
            _exit(3);
        for (;;)
            pause();
    }
    expect_set_event(server, 1, "child/started", "1"); /* the first connection */
    assert_int_equal(kill(child, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    cfx_store_event ev = next_event(server, CFX_OK);
    assert_int_equal(ev.kind, CFX_STORE_EVENT_CLOSED);
    assert_int_equal(ev.connection, 1);
    expect_stored(server, "child/started", "1");
    cfx_store_free(server);
}

/* A client whose server went away: the next request fails, naming the store. */
static void test_server_gone(void **state)
{
    (void)state;
    cfx_store *server = serve(), *c = connect_to(server);
    cfx_store_free(server);
    assert_int_equal(cfx_store_set(c, "late", "x", 1), CFX_ERR_PEER_LOST);
    assert_non_null(strstr(cfx_last_error(), "stopped answering"));
    cfx_store_free(c);
}

/* ---- errors --------------------------------------------------------------------------------- */

static void expect_error(cfx_status got, cfx_status want, const char *text)
{
    assert_int_equal(got, want);
    if (!strstr(cfx_last_error(), text))
        fail_msg("message \"%s\" does not say \"%s\"", cfx_last_error(), text);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    cfx_store *s = NULL;
    expect_error(cfx_store_serve(-1, 1, &s), CFX_ERR_INVALID_ARGUMENT, "port -1");
    expect_error(cfx_store_serve(70000, 1, &s), CFX_ERR_INVALID_ARGUMENT, "port 70000");
    expect_error(cfx_store_serve(0, 2, &s), CFX_ERR_INVALID_ARGUMENT, "events 2");
    expect_error(cfx_store_serve(0, 1, NULL), CFX_ERR_INVALID_ARGUMENT, "out");
    expect_error(cfx_store_connect(NULL, 1, 1.0, &s), CFX_ERR_INVALID_ARGUMENT, "host is NULL");
    expect_error(cfx_store_connect("", 1, 1.0, &s), CFX_ERR_INVALID_ARGUMENT, "host is empty");
    expect_error(cfx_store_connect("127.0.0.1", 0, 1.0, &s), CFX_ERR_INVALID_ARGUMENT, "port 0");
    expect_error(cfx_store_connect("127.0.0.1", 1, -1.0, &s), CFX_ERR_INVALID_ARGUMENT,
                 "timeout_s");
    assert_null(s);
    assert_int_equal(cfx_store_port(NULL), -1);
    cfx_store_free(NULL);

    cfx_store *server = serve(), *c = connect_to(server);
    char buf[4];
    size_t len = 0;
    int present = 0;
    expect_error(cfx_store_set(NULL, "k", "v", 1), CFX_ERR_INVALID_ARGUMENT, "store is NULL");
    expect_error(cfx_store_set(c, NULL, "v", 1), CFX_ERR_INVALID_ARGUMENT, "key is NULL");
    expect_error(cfx_store_set(server, "k", NULL, 3), CFX_ERR_INVALID_ARGUMENT, "data is NULL");
    char *long_key = malloc(5000);
    memset(long_key, 'k', 4999);
    long_key[4999] = '\0';
    expect_error(cfx_store_set(c, long_key, "v", 1), CFX_ERR_INVALID_ARGUMENT, "4999 bytes");
    free(long_key);
    expect_error(cfx_store_get(c, "k", buf, sizeof buf, NULL, &present), CFX_ERR_INVALID_ARGUMENT,
                 "len is NULL");
    expect_error(cfx_store_get(c, "k", buf, sizeof buf, &len, NULL), CFX_ERR_INVALID_ARGUMENT,
                 "present is NULL");
    expect_error(cfx_store_get(server, "k", NULL, 4, &len, &present), CFX_ERR_INVALID_ARGUMENT,
                 "buf is NULL");
    cfx_store_event ev = {.version = CFX_STORE_EVENT_VERSION};
    expect_error(cfx_store_next_event(c, 0.1, &ev), CFX_ERR_INVALID_ARGUMENT, "client");
    expect_error(cfx_store_next_event(server, -1.0, &ev), CFX_ERR_INVALID_ARGUMENT, "timeout_s");
    expect_error(cfx_store_next_event(server, 0.1, NULL), CFX_ERR_INVALID_ARGUMENT, "out is NULL");
    ev.version = 99;
    expect_error(cfx_store_next_event(server, 0.1, &ev), CFX_ERR_VERSION, "version 99");
    cfx_store_free(c);
    cfx_store_free(server);

    /* Served without events: keys work, events are refused (none were kept). */
    assert_int_equal(cfx_store_serve(0, 0, &server), CFX_OK);
    c = connect_to(server);
    assert_int_equal(cfx_store_set(c, "k", "v", 1), CFX_OK);
    expect_stored(server, "k", "v");
    ev.version = CFX_STORE_EVENT_VERSION;
    expect_error(cfx_store_next_event(server, 0.1, &ev), CFX_ERR_INVALID_ARGUMENT,
                 "without events");
    cfx_store_free(c);
    cfx_store_free(server);
}

static void test_port_taken(void **state)
{
    (void)state;
    cfx_store *first = serve(), *second = NULL;
    int port = cfx_store_port(first);
    char want[32];
    snprintf(want, sizeof want, "port %d", port);
    expect_error(cfx_store_serve(port, 0, &second), CFX_ERR_CONFIG, want);
    assert_non_null(strstr(cfx_last_error(), "CFX_RENDEZVOUS_PORT"));
    assert_null(second);
    cfx_store_free(first);
}

static void test_nothing_there_times_out(void **state)
{
    (void)state;
    cfx_store *gone = serve(), *c = NULL;
    int port = cfx_store_port(gone); /* nothing listens there once it is freed */
    cfx_store_free(gone);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_error(cfx_store_connect("127.0.0.1", port, 0.3, &c), CFX_ERR_TIMEOUT, "within 0.3 s");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9 < 5.0);
    assert_null(c);
}

/* Another program at the address: it greets with something else. */
static void *foreign_server(void *arg)
{
    int c = accept(*(int *)arg, NULL, NULL);
    if (c >= 0) {
        const char hello[] = "SSH-2.0-not-a-store\r\n";
        if (write(c, hello, sizeof hello - 1) < 0)
            perror("foreign_server");
        sleep(1);
        close(c);
    }
    return NULL;
}

static void test_foreign_program(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, foreign_server, &fd), 0);
    cfx_store *c = NULL;
    expect_error(cfx_store_connect("127.0.0.1", ntohs(a.sin_port), 3.0, &c), CFX_ERR_CONFIG,
                 "something other than a Conflux store");
    pthread_join(th, NULL);
    close(fd);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_get_both_sides),
        cmocka_unit_test(test_set_events_name_the_connection),
        cmocka_unit_test(test_killed_client_process_closes),
        cmocka_unit_test(test_server_gone),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_port_taken),
        cmocka_unit_test(test_nothing_there_times_out),
        cmocka_unit_test(test_foreign_program),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
