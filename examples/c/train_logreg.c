/*
 * train_logreg - data-parallel logistic regression through Conflux's C ABI.
 *
 * Every rank generates its own shard of a synthetic data set, computes the gradient on it into a
 * gradient set's owned storage, and Conflux averages the gradients across ranks each step. Rank 0 prints the loss per epoch; at the
 * end every rank's weights are gathered and compared bitwise.
 *
 *   cfxrun -np 3 build/examples/c/cfx_train_logreg [epochs]
 */
#include <conflux/conflux.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FEATURES 16
#define SAMPLES_PER_RANK 2000
#define LEARNING_RATE 0.5

/* A small deterministic generator, so every run and every rank count sees the same data. */
static uint64_t next_random(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 11;
}

static double uniform(uint64_t *state) { return (double)next_random(state) / 9007199254740992.0; }

static int check(cfx_status st, const char *what)
{
    if (st != CFX_OK)
        fprintf(stderr, "train_logreg: %s failed: %s (%s)\n", what, cfx_status_string(st),
                cfx_last_error());
    return st == CFX_OK;
}

/* Blocking allreduce of n doubles, in place. */
static int allreduce(cfx_context *ctx, const char *name, double *v, int64_t n, cfx_reduce_op op)
{
    cfx_tensor t = {v, &n, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    if (!check(cfx_allreduce_async(ctx, name, &t, NULL, op, 1.0, 1.0, &h), name))
        return 0;
    int ok = check(cfx_wait(ctx, h, -1), name);
    cfx_handle_release(ctx, h);
    return ok;
}

int main(int argc, char **argv)
{
    int epochs = argc > 1 ? atoi(argv[1]) : 20;
    cfx_context *ctx;
    if (!check(cfx_init(NULL, &ctx), "cfx_init"))
        return 1;
    int rank = cfx_rank(ctx), size = cfx_size(ctx);

    /* The true model, and this rank's shard labelled by it. */
    uint64_t seed = 12345;
    double truth[FEATURES + 1];
    for (int j = 0; j <= FEATURES; j++)
        truth[j] = uniform(&seed) * 4 - 2;
    double (*x)[FEATURES] = malloc(sizeof *x * SAMPLES_PER_RANK);
    double *y = malloc(sizeof *y * SAMPLES_PER_RANK);
    uint64_t data_seed = 1000 + (uint64_t)rank;
    for (int i = 0; i < SAMPLES_PER_RANK; i++) {
        double z = truth[FEATURES];
        for (int j = 0; j < FEATURES; j++) {
            x[i][j] = uniform(&data_seed) * 2 - 1;
            z += truth[j] * x[i][j];
        }
        y[i] = uniform(&data_seed) < 1 / (1 + exp(-z)) ? 1.0 : 0.0;
    }

    /* Rank 0 initialises the weights; a broadcast gives every rank the same start. */
    double w[FEATURES + 1] = {0};
    if (rank == 0) {
        uint64_t init = 7;
        for (int j = 0; j <= FEATURES; j++)
            w[j] = (uniform(&init) - 0.5) * 0.1;
    }
    int64_t wn = FEATURES + 1;
    cfx_tensor wt = {w, &wn, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    if (!check(cfx_broadcast_async(ctx, "weights.init", &wt, 0, &h), "broadcast") ||
        !check(cfx_wait(ctx, h, -1), "broadcast"))
        return 1;
    cfx_handle_release(ctx, h);

    /* The gradients live in a gradient set: registered once, with storage owned by Conflux (shared
     * memory, so the averaging takes the direct path), then each epoch only marked ready. */
    cfx_gradset *set = NULL;
    int64_t gn = FEATURES, one = 1;
    int32_t i_weights, i_bias, i_loss;
    double *gw = NULL, *gb = NULL, *gloss = NULL;
    int ok = check(cfx_gradset_create(ctx, "logreg", NULL, &set), "cfx_gradset_create") &&
             check(cfx_gradset_add(set, "weights", &(cfx_tensor){NULL, &gn, 1, CFX_FLOAT64,
                                                                 CFX_DEVICE_CPU, NULL}, &i_weights),
                   "cfx_gradset_add") &&
             check(cfx_gradset_add(set, "bias", &(cfx_tensor){NULL, &one, 1, CFX_FLOAT64,
                                                              CFX_DEVICE_CPU, NULL}, &i_bias),
                   "cfx_gradset_add") &&
             check(cfx_gradset_add(set, "loss", &(cfx_tensor){NULL, &one, 1, CFX_FLOAT64,
                                                              CFX_DEVICE_CPU, NULL}, &i_loss),
                   "cfx_gradset_add") &&
             check(cfx_gradset_commit(set), "cfx_gradset_commit") &&
             check(cfx_gradset_data(set, i_weights, (void **)&gw), "cfx_gradset_data") &&
             check(cfx_gradset_data(set, i_bias, (void **)&gb), "cfx_gradset_data") &&
             check(cfx_gradset_data(set, i_loss, (void **)&gloss), "cfx_gradset_data");
    for (int epoch = 0; epoch < epochs && ok; epoch++) {
        memset(gw, 0, sizeof *gw * FEATURES);
        *gb = *gloss = 0;
        for (int i = 0; i < SAMPLES_PER_RANK; i++) {
            double z = w[FEATURES];
            for (int j = 0; j < FEATURES; j++)
                z += w[j] * x[i][j];
            double p = 1 / (1 + exp(-z));
            double err = p - y[i];
            for (int j = 0; j < FEATURES; j++)
                gw[j] += err * x[i][j] / SAMPLES_PER_RANK;
            *gb += err / SAMPLES_PER_RANK;
            *gloss -= (y[i] * log(p + 1e-12) + (1 - y[i]) * log(1 - p + 1e-12)) / SAMPLES_PER_RANK;
        }
        /* Each gradient is ready as soon as it is computed; wait ends the step with the averages. */
        ok = check(cfx_gradset_ready(set, i_loss), "cfx_gradset_ready") &&
             check(cfx_gradset_ready(set, i_bias), "cfx_gradset_ready") &&
             check(cfx_gradset_ready(set, i_weights), "cfx_gradset_ready") &&
             check(cfx_gradset_wait(set, -1), "cfx_gradset_wait");
        for (int j = 0; j < FEATURES && ok; j++)
            w[j] -= LEARNING_RATE * gw[j];
        if (ok)
            w[FEATURES] -= LEARNING_RATE * *gb;
        if (ok && rank == 0)
            printf("epoch %3d  loss %.6f\n", epoch + 1, *gloss);
    }

    /* Every rank must now hold bitwise the same weights. */
    int identical = 0;
    if (ok && check(cfx_allgather_async(ctx, "weights.final", &wt, &h), "allgather") &&
        check(cfx_wait(ctx, h, -1), "allgather")) {
        cfx_tensor all;
        if (check(cfx_handle_output(ctx, h, 0, &all), "allgather output")) {
            identical = 1;
            const double *rows = all.data;
            for (int r = 0; r < size; r++)
                if (memcmp(rows + (size_t)r * (FEATURES + 1), w, sizeof w) != 0)
                    identical = 0;
        }
        cfx_handle_release(ctx, h);
    }
    double flag = identical;
    ok = ok && allreduce(ctx, "weights.identical", &flag, 1, CFX_OP_MIN);
    if (rank == 0)
        printf("weights identical on all %d ranks: %s\n", size, ok && flag == 1.0 ? "yes" : "NO");
    cfx_gradset_free(set);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    free(x);
    free(y);
    return ok && flag == 1.0 ? 0 : 1;
}
