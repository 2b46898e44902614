/* world - how a context finds its world and builds its transport (see world.h). */
#include "engine/world.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/launch_env.h"
#include "base/log.h"
#include "rendezvous/store.h"
#include "transport/transport_local.h"
#if CFX_HAVE_MPI
#include "transport/transport_mpi.h"
#endif
#if CFX_HAVE_GLOO
#include "transport/transport_gloo.h"
#endif

static cfx_status world_of_one(cx_transport **out)
{
    cx_local_world *w;
    cfx_status st = cx_local_world_create(1, &w);
    if (st)
        return st;
    st = cx_transport_local_create(w, 0, out);
    cx_local_world_release(w);
    return st;
}

/* What a process started by mpirun (or by nothing) gets: MPI when built, else a world of one. */
static cfx_status mpi_or_alone(const cx_config *cfg, const cx_launch *l, cx_transport **out)
{
#if CFX_HAVE_MPI
    (void)l;
    return cx_transport_mpi_create(cfg->test.local_size, out);
#else
    (void)cfg;
    if (l->launcher == CX_LAUNCHER_OPENMPI && l->size > 1)
        return cx_fail(CFX_ERR_CONFIG, "cfx_init: started by %s as rank %d of %d, but this build of "
                       "Conflux has no MPI transport (configure with CONFLUX_WITH_MPI=ON), and no "
                       "CFX_RENDEZVOUS_ADDR/CFX_RENDEZVOUS_DIR says where to meet over Gloo",
                       cx_launcher_name(l->launcher), l->rank, l->size);
    return world_of_one(out);
#endif
}

/* The launcher's world cannot be joined: the one error every such case gives. */
static cfx_status cannot_join(const cx_launch *l, const char *why)
{
    return cx_fail(CFX_ERR_CONFIG, "cfx_init: started by %s as rank %d of %d, but cannot join that "
                   "world: %s. Refusing to run as a world of one (docs/launching.md)",
                   cx_launcher_name(l->launcher), l->rank, l->size, why);
}

#if CFX_HAVE_GLOO
/* The worlds this process joined over Gloo (process-wide: each names its store key space). */
static atomic_uint worlds_joined;

static cfx_status join_over_gloo(const cx_config *cfg, const cx_launch *l,
                                 const cfx_store_callbacks *handed, const char *group_space,
                                 cx_transport **out)
{
    double rendezvous_s, transport_s;
    cfx_status st = cx_launch_timeouts(NULL, NULL, &rendezvous_s, &transport_s);
    if (st)
        return st;
    /* Every world this process joins gets its own key space (contexts made one after another in
     * one job meet through the same store); every rank of a job calls cfx_init alike. A group's
     * members are not every rank of the job, so their counts may differ: a group meets in the
     * space its caller names (the store handed in is the group's own). */
    unsigned generation = (unsigned)atomic_fetch_add(&worlds_joined, 1) + 1;
    char space[32];
    if (group_space)
        snprintf(space, sizeof space, "%s", group_space);
    else
        snprintf(space, sizeof space, "world%u", generation);
    cx_store *store = NULL;
    int store_on_rank0 = !handed && !l->store_dir[0] && !l->store_served_by_launcher;
    int serve = l->rank == 0 && store_on_rank0;
    if (handed)
        st = cx_store_from_callbacks(handed, &store);
    else if (l->store_dir[0])
        st = cx_store_file_create(l->store_dir, &store);
    else
        st = cx_store_tcp_create(&(cx_tcp_store_params){.host = l->store_host,
                                                        .port = l->store_port,
                                                        .port_span = l->store_port_span,
                                                        .job_token = l->store_token[0]
                                                                         ? l->store_token : NULL,
                                                        .serve = serve,
                                                        .generation = generation,
                                                        .timeout_s = rendezvous_s},
                                 &store);
    if (!st)
        st = cx_store_prefixed(store, space, 1, &store);
    cx_logger lg = {.level = cfg->log_level, .rank = l->rank, .fd = 2, .owns_fd = 0};
    if (!st)
        cx_log(&lg, CX_LOG_INFO, "world", "rank %d of %d from %s; meeting through the %s%s%s%s",
               l->rank, l->size, cx_launcher_name(l->launcher), store->where,
               l->store_source[0] ? " (from " : "", l->store_source,
               l->store_source[0] ? ")" : "");
    if (!st)
        st = cx_transport_gloo_create(store, &(cx_gloo_params){l->rank, l->size, transport_s,
                                                               rendezvous_s, cfg->test.local_size,
                                                               store_on_rank0},
                                      out);
    if (st) {
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        if (group_space)
            return cx_fail(st, "cfx_init_group: joining the group as rank %d of %d: %s", l->rank,
                           l->size, msg);
        return cx_fail(st, "cfx_init: joining the world of %s as rank %d of %d: %s",
                       cx_launcher_name(l->launcher), l->rank, l->size, msg);
    }
    return CFX_OK;
}
#endif

static cfx_status over_gloo(const cx_config *cfg, const cx_launch *l,
                            const cfx_store_callbacks *handed, cx_transport **out)
{
    if (l->launcher == CX_LAUNCHER_NONE || l->rank < 0 || l->size < 0)
        return cx_fail(CFX_ERR_CONFIG, "cfx_init: the Gloo transport needs this process's rank and "
                       "the world's size, and no launcher's variables give them (set CFX_RANK and "
                       "CFX_SIZE, or start the job with cfxrun --transport gloo or torchrun)");
    if (l->missing[0] && !handed)
        return cannot_join(l, l->missing);
#if CFX_HAVE_GLOO
    return join_over_gloo(cfg, l, handed, NULL, out);
#else
    (void)cfg;
    (void)out;
    return cx_fail(handed ? CFX_ERR_UNSUPPORTED : CFX_ERR_CONFIG, "cfx_init: started by %s as rank "
                   "%d of %d, but this build of Conflux has no Gloo transport (configure with "
                   "CONFLUX_WITH_GLOO=ON; Debian: libgloo-dev), and MPI did not start the job (use "
                   "mpirun or cfxrun)", cx_launcher_name(l->launcher), l->rank, l->size);
#endif
}

cfx_status cx_world_create_transport(const cx_config *cfg, const cfx_store_callbacks *handed,
                                     cx_transport **out)
{
    cx_launch l;
    cfx_status st = cx_launch_detect(&l, NULL, NULL);
    if (st)
        return st;
    int kind = cfg->transport;
    if (handed && kind != CFX_TRANSPORT_AUTO && kind != CFX_TRANSPORT_GLOO)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_with_store: a handed-in store joins a "
                       "Gloo world, but the transport asked for is %d", kind);
    if (kind == CFX_TRANSPORT_LOCAL)
        return world_of_one(out);
    if (kind == CFX_TRANSPORT_GLOO || handed)
        return over_gloo(cfg, &l, handed, out);
    int launched_by_other = l.launcher != CX_LAUNCHER_NONE && l.launcher != CX_LAUNCHER_OPENMPI;
    if (kind == CFX_TRANSPORT_MPI) {
#if CFX_HAVE_MPI
        if (launched_by_other && l.size > 1 && !l.mpi_launch)
            return cannot_join(&l, "the transport asked for is MPI (CFX_TRANSPORT or options), and "
                               "mpirun did not start this process, so MPI would see a world of one");
        return cx_transport_mpi_create(cfg->test.local_size, out);
#else
        return cx_fail(CFX_ERR_UNSUPPORTED, "cfx_init: this build of Conflux has no MPI transport "
                       "(configure with CONFLUX_WITH_MPI=ON)");
#endif
    }
    /* AUTO: MPI where mpirun started the job; Gloo where another launcher did (or where mpirun
     * did, this build has no MPI, and CFX_RENDEZVOUS_* say where to meet). */
    if (launched_by_other && l.size > 1)
        return over_gloo(cfg, &l, NULL, out);
    if (!CFX_HAVE_MPI && l.launcher == CX_LAUNCHER_OPENMPI && (l.store_port || l.store_dir[0]))
        return over_gloo(cfg, &l, NULL, out);
    return mpi_or_alone(cfg, &l, out);
}

cfx_status cx_world_join_group(const cx_config *cfg, const cfx_store_callbacks *store, int rank,
                               int size, cx_transport **out)
{
    if (size == 1)
        return world_of_one(out); /* nobody to meet */
#if CFX_HAVE_GLOO
    cx_launch l;
    memset(&l, 0, sizeof l);
    l.launcher = CX_LAUNCHER_NONE;
    l.rank = rank;
    l.size = size;
    return join_over_gloo(cfg, &l, store, "group", out);
#else
    (void)cfg;
    (void)store;
    (void)out;
    return cx_fail(CFX_ERR_UNSUPPORTED, "cfx_init_group: rank %d of %d: this build of Conflux has "
                   "no Gloo transport (configure with CONFLUX_WITH_GLOO=ON; Debian: libgloo-dev), "
                   "which a group meets over", rank, size);
#endif
}
