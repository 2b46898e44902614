/*
 * The stall inspector and shutdown under mpirun (3 ranks), through the public ABI:
 * - stall: rank 2 never submits "stall.t"; ranks 0 and 1 get CFX_ERR_STALL within the deadline
 *   (CFX_STALL_TIMEOUT_S-like options: warning 0.5 s, timeout 2 s), naming the tensor and rank 2;
 *   rank 0's log (CFX_LOG_FILE) has the warning naming rank 2 as missing; the job goes on.
 * - shutdown: rank 1 calls cfx_shutdown while ranks 0 and 2 wait on "sd.t"; their handles fail
 *   with CFX_ERR_SHUT_DOWN naming rank 1.
 * argv[1]: a scratch directory for the log file.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

static const char *scratch = "/tmp";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static cfx_context *open_with_stalls(double warning_s, double timeout_s)
{
    cfx_init_options o;
    CHECK_OK(cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION));
    o.transport = CFX_TRANSPORT_MPI;
    o.stall_warning_s = warning_s;
    o.stall_timeout_s = timeout_s;
    cfx_context *ctx = NULL;
    CHECK_OK(cfx_init(&o, &ctx));
    if (!ctx)
        MPI_Abort(MPI_COMM_WORLD, 2);
    return ctx;
}

static void allreduce_one(cfx_context *ctx, const char *name, cfx_status want)
{
    float v = 1;
    int64_t shape[1] = {1};
    cfx_tensor x = {&v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    CHECK_OK(cfx_allreduce_async(ctx, name, &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
    mt_wait_expect(ctx, h, want, name);
}

static void stall_names_missing_rank(void **state)
{
    (void)state;
    char log[512];
    snprintf(log, sizeof log, "%s/stall.%d.log", scratch, (int)getppid());
    if (mt_rank == 0)
        unlink(log);
    mt_barrier();
    setenv("CFX_LOG_FILE", log, 1);
    setenv("CFX_LOG_LEVEL", "warning", 1);
    const double timeout = 2.0;
    cfx_context *ctx = open_with_stalls(0.5, timeout);
    unsetenv("CFX_LOG_FILE");
    allreduce_one(ctx, "warm", CFX_OK);
    if (mt_rank != 2) {
        float v = 1;
        int64_t shape[1] = {1};
        cfx_tensor x = {&v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_handle h;
        double t0 = now_s();
        CHECK_OK(cfx_allreduce_async(ctx, "stall.t", &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
        cfx_status st = cfx_wait(ctx, h, 20);
        double waited = now_s() - t0;
        CHECK(st == CFX_ERR_STALL, "stall.t: status %d (%s), expected CFX_ERR_STALL", st,
              cfx_status_string(st));
        CHECK(waited >= timeout * 0.9 && waited < timeout + 3.0, "stalled after %.2f s (deadline %g)",
              waited, timeout);
        const char *msg = cfx_handle_message(ctx, h);
        CHECK(msg && strstr(msg, "'stall.t'") && strstr(msg, "never by ranks [2]"),
              "stall message: %s", msg ? msg : "(none)");
        cfx_handle_release(ctx, h);
    } else {
        usleep((useconds_t)((timeout + 1.5) * 1e6)); /* never submits stall.t */
    }
    allreduce_one(ctx, "after", CFX_OK); /* the job goes on */
    mt_close(ctx);
    if (mt_rank == 0) {
        FILE *f = fopen(log, "r");
        CHECK(f != NULL, "no log file %s", log);
        char line[4096];
        int warned = 0, errored = 0;
        while (f && fgets(line, sizeof line, f)) {
            if (strstr(line, "stall warning]") && strstr(line, "'stall.t'") &&
                strstr(line, "ready on ranks [0, 1], missing on ranks [2]"))
                warned++;
            if (strstr(line, "stall error]") && strstr(line, "never by ranks [2]"))
                errored++;
            /* every line: [time conflux rank R module level] */
            CHECK(line[0] == '[' && strstr(line, "Z conflux rank "), "log line format: %s", line);
        }
        if (f)
            fclose(f);
        CHECK(warned >= 1, "no stall warning naming rank 2 in %s", log);
        CHECK(errored == 1, "%d stall errors in %s", errored, log);
    }
    mt_finish();
}

static void shutdown_while_others_wait(void **state)
{
    (void)state;
    cfx_context *ctx = open_with_stalls(60, 600);
    allreduce_one(ctx, "warm", CFX_OK);
    if (mt_rank == 1) {
        usleep(300000);
        CHECK_OK(cfx_shutdown(ctx));
        CHECK(cfx_is_running(ctx) == 0, "running after shutdown");
    } else {
        float v = 1;
        int64_t shape[1] = {1};
        cfx_tensor x = {&v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_handle h;
        double t0 = now_s();
        CHECK_OK(cfx_allreduce_async(ctx, "sd.t", &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
        cfx_status st = cfx_wait(ctx, h, 20);
        CHECK(st == CFX_ERR_SHUT_DOWN, "sd.t: status %d (%s)", st, cfx_status_string(st));
        CHECK(now_s() - t0 < 10, "took %.1f s", now_s() - t0);
        const char *msg = cfx_handle_message(ctx, h);
        CHECK(msg && strstr(msg, "'sd.t'") && strstr(msg, "shut down by rank(s) [1]"),
              "message: %s", msg ? msg : "(none)");
        cfx_handle_release(ctx, h);
        cfx_handle h2;
        CHECK(cfx_allreduce_async(ctx, "later", &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h2) ==
              CFX_ERR_SHUT_DOWN, "submit after the job shut down");
    }
    mt_close(ctx);
    mt_finish();
}

int main(int argc, char **argv)
{
    if (argc > 1)
        scratch = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stall_names_missing_rank),
        cmocka_unit_test(shutdown_while_others_wait),
    };
    return MT_RUN(argc, argv, tests);
}
