/*
 * Adasum under mpirun (2, 3 and 4 ranks, and across pretend hosts): the scenarios of
 * tests/adasum/cases.c over the MPI transport's point to point, each on a fresh context, every
 * rank's failures agreed at the end of each test. With CFX_TEST_LOCAL_SIZE=k and equal hosts the
 * engine takes the hierarchical form (the host's average, then Adasum between hosts), and the
 * references expect exactly that.
 */
#include <stdlib.h>

#include "mpitest.h"
#include "../adasum/cases.h"

double ad_get(const void *buf, cfx_dtype dt, size_t i) { return mt_get(buf, dt, i); }
void ad_put(void *buf, cfx_dtype dt, size_t i, double v) { mt_put(buf, dt, i, v); }

/* Hosts of CFX_TEST_LOCAL_SIZE ranks, when they divide the job into two or more equal ones. */
static int host_size(void)
{
    const char *v = getenv("CFX_TEST_LOCAL_SIZE");
    int k = v ? atoi(v) : 0;
    return k > 0 && mt_size % k == 0 && mt_size / k > 1 ? k : 0;
}

static void run(void **state)
{
    const ad_case *c = *state;
    ad_host_size = host_size();
    cfx_context *ctx = mt_open();
    mt_failures += c->run(ctx);
    mt_close(ctx);
    mt_finish();
}

int main(int argc, char **argv)
{
    struct CMUnitTest tests[16];
    for (size_t i = 0; i < ad_ncases && i < 16; i++)
        tests[i] = (struct CMUnitTest){ad_cases[i].name, run, NULL, NULL, (void *)&ad_cases[i]};
    return mt_main(argc, argv, __FILE__, tests, ad_ncases < 16 ? ad_ncases : 16);
}
