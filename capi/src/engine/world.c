/* world - how a context finds its world and builds its transport (see world.h). */
#include "engine/world.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/launch_env.h"
#include "base/log.h"
#include "rendezvous/store.h"
#include "transport/registry.h"

/* The launcher's world cannot be joined: the one error every such case gives. */
static cfx_status cannot_join(const cx_launch *l, const char *why)
{
    return cx_fail(CFX_ERR_CONFIG, "cfx_init: started by %s as rank %d of %d, but cannot join that "
                   "world: %s. Refusing to run as a world of one (docs/launching.md)",
                   cx_launcher_name(l->launcher), l->rank, l->size, why);
}

static cx_transport_params params_of(const cx_config *cfg, int rank, int size)
{
    return (cx_transport_params){.rank = rank, .size = size,
                                 .timeout_s = cfg->transport_timeout_s,
                                 .rendezvous_s = cfg->rendezvous_timeout_s,
                                 .pretend_local_size = cfg->test.local_size};
}

/* A process on its own: the first transport that meets within one process, as a world of one. */
static cfx_status world_of_one(const cx_config *cfg, cx_transport **out)
{
    const cx_transport_entry *e = cx_transport_first_meeting(CX_MEETS_IN_PROCESS);
    if (!e)
        return cx_fail(CFX_ERR_INTERNAL, "cfx_init: no transport of this build makes a world of one");
    cx_transport_params p = params_of(cfg, 0, 1);
    return cx_transport_create(e, &p, CFX_ERR_UNSUPPORTED, "cfx_init", out);
}

/* The worlds this process joined through a store (process-wide: each names its store key space),
 * and those joined under the current CFX_RENDEZVOUS_SCOPE (counted again from 1 in a new scope). */
static atomic_uint worlds_joined;
static pthread_mutex_t scope_lock = PTHREAD_MUTEX_INITIALIZER;
static char scope_now[sizeof ((cx_launch *)0)->store_scope];
static unsigned worlds_in_scope;

/* "world<n>", or "<scope>/world<k>" under a launcher's scope (launch_env.h, store_scope). */
static void world_space(const cx_launch *l, unsigned generation, char *space, size_t size)
{
    if (!l->store_scope[0]) {
        snprintf(space, size, "world%u", generation);
        return;
    }
    pthread_mutex_lock(&scope_lock);
    if (strcmp(scope_now, l->store_scope) != 0) {
        snprintf(scope_now, sizeof scope_now, "%s", l->store_scope);
        worlds_in_scope = 0;
    }
    unsigned k = ++worlds_in_scope;
    pthread_mutex_unlock(&scope_lock);
    snprintf(space, size, "%s/world%u", l->store_scope, k);
}

/* Joins over `e` (it meets through a store): the store handed in, the launcher's, or a file store. */
static cfx_status join_through_store(const cx_config *cfg, const cx_transport_entry *e,
                                     const cx_launch *l, const cfx_store_callbacks *handed,
                                     const char *group_space, cx_transport **out)
{
    /* Every world this process joins gets its own key space (contexts made one after another in
     * one job meet through the same store); every rank of a job calls cfx_init alike. A group's
     * members are not every rank of the job, so their counts may differ: a group meets in the
     * space its caller names (the store handed in is the group's own). */
    unsigned generation = (unsigned)atomic_fetch_add(&worlds_joined, 1) + 1;
    char space[96];
    if (group_space)
        snprintf(space, sizeof space, "%s", group_space);
    else
        world_space(l, generation, space, sizeof space);
    cx_store *store = NULL;
    int store_on_rank0 = !handed && !l->store_dir[0] && !l->store_served_by_launcher;
    int serve = l->rank == 0 && store_on_rank0;
    cfx_status st = CFX_OK;
    if (!e->built) /* said before any store is opened or served */
        st = cx_transport_create(e, &(cx_transport_params){0},
                                 handed ? CFX_ERR_UNSUPPORTED : CFX_ERR_CONFIG,
                                 group_space ? "cfx_init_group" : "cfx_init", out);
    else if (handed)
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
                                                        .timeout_s = cfg->rendezvous_timeout_s},
                                 &store);
    if (!e->built)
        return st;
    if (!st)
        st = cx_store_prefixed(store, space, 1, &store);
    cx_logger lg = {.level = cfg->log_level, .rank = l->rank, .fd = 2, .owns_fd = 0};
    if (!st)
        cx_log(&lg, CX_LOG_INFO, "world", "rank %d of %d from %s; meeting through the %s%s%s%s",
               l->rank, l->size, cx_launcher_name(l->launcher), store->where,
               l->store_source[0] ? " (from " : "", l->store_source,
               l->store_source[0] ? ")" : "");
    if (!st) {
        cx_transport_params p = params_of(cfg, l->rank, l->size);
        p.store = store;
        p.store_on_rank0 = store_on_rank0;
        st = cx_transport_create(e, &p, CFX_ERR_CONFIG, "cfx_init", out);
    }
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

/* A launcher's world over `e`, a transport that meets through a store. */
static cfx_status over_store(const cx_config *cfg, const cx_transport_entry *e, const cx_launch *l,
                             const cfx_store_callbacks *handed, cx_transport **out)
{
    if (l->launcher == CX_LAUNCHER_NONE || l->rank < 0 || l->size < 0)
        return cx_fail(CFX_ERR_CONFIG, "cfx_init: the %s transport needs this process's rank and "
                       "the world's size, and no launcher's variables give them (set CFX_RANK and "
                       "CFX_SIZE, or start the job with cfxrun --transport %s or torchrun)",
                       e->name, e->name);
    if (l->missing[0] && !handed)
        return cannot_join(l, l->missing);
    if (!e->built && !handed)
        return cx_fail(CFX_ERR_CONFIG, "cfx_init: started by %s as rank %d of %d, but this build "
                       "of Conflux has no %s transport (see cfx_features), and no launcher whose "
                       "world it can join without one started the job (use mpirun or cfxrun)",
                       cx_launcher_name(l->launcher), l->rank, l->size, e->name);
    return join_through_store(cfg, e, l, handed, NULL, out);
}

/* A launcher's world over `e`, a transport that joins it where that launcher started the job. */
static cfx_status over_launch(const cx_config *cfg, const cx_transport_entry *e, cx_transport **out)
{
    cx_transport_params p = params_of(cfg, -1, -1);
    return cx_transport_create(e, &p, CFX_ERR_UNSUPPORTED, "cfx_init", out);
}

cfx_status cx_world_create_transport(const cx_config *cfg, const cfx_store_callbacks *handed,
                                     cx_transport **out)
{
    const cx_launch *lp;
    cfx_status st = cx_config_launch(cfg, &lp);
    const cx_launch l = st ? (cx_launch){0} : *lp;
    const cx_transport_entry *asked = NULL;
    if (!st)
        st = cx_transport_asked(cfg, &asked);
    if (st)
        return st;
    if (handed && asked && asked->meets != CX_MEETS_STORE)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_with_store: a handed-in store joins a "
                       "world over a transport that meets through a store, but the transport asked "
                       "for is %s", asked->name);
    const cx_transport_entry *by_store = asked && asked->meets == CX_MEETS_STORE
                                             ? asked : cx_transport_first_meeting(CX_MEETS_STORE);
    if (handed || (asked && asked->meets == CX_MEETS_STORE)) {
        if (!by_store)
            return cx_fail(CFX_ERR_UNSUPPORTED, "cfx_init_with_store: no transport of this build "
                           "meets through a store");
        return over_store(cfg, by_store, &l, handed, out);
    }
    if (asked && asked->meets == CX_MEETS_IN_PROCESS)
        return world_of_one(cfg, out);
    const cx_transport_entry *by_launch = asked ? asked : cx_transport_first_meeting(CX_MEETS_LAUNCH);
    int launched_by_other = l.launcher != CX_LAUNCHER_NONE &&
                            (!by_launch || l.launcher != by_launch->launcher);
    if (asked) { /* meets in its launcher's world */
        if (!asked->built)
            return over_launch(cfg, asked, out); /* says how to build it */
        if (launched_by_other && l.size > 1 && !l.mpi_launch) {
            char why[256];
            snprintf(why, sizeof why, "the transport asked for is %s (CFX_TRANSPORT or options), "
                     "and %s did not start this process, so %s would see a world of one",
                     asked->name, cx_launcher_command(asked->launcher), asked->name);
            return cannot_join(&l, why);
        }
        return over_launch(cfg, asked, out);
    }
    /* AUTO: the launcher's own transport where it started the job (mpirun: MPI); a transport that
     * meets through a store where another launcher did (or where that launcher did, this build
     * lacks its transport, and CFX_RENDEZVOUS_* say where to meet); a world of one without any. */
    int launch_built = by_launch && by_launch->built;
    if (by_store && launched_by_other && l.size > 1)
        return over_store(cfg, by_store, &l, NULL, out);
    if (by_store && !launch_built && by_launch && l.launcher == by_launch->launcher &&
        (l.store_port || l.store_dir[0]))
        return over_store(cfg, by_store, &l, NULL, out);
    if (launch_built)
        return over_launch(cfg, by_launch, out);
    if (by_launch && l.launcher == by_launch->launcher && l.size > 1)
        return cx_fail(CFX_ERR_CONFIG, "cfx_init: started by %s as rank %d of %d, but this build of "
                       "Conflux has no %s transport (see cfx_features), and no "
                       "CFX_RENDEZVOUS_ADDR/CFX_RENDEZVOUS_DIR says where to meet over %s",
                       cx_launcher_name(l.launcher), l.rank, l.size, by_launch->name,
                       by_store ? by_store->name : "a store");
    return world_of_one(cfg, out);
}

cfx_status cx_world_join_group(const cx_config *cfg, const cfx_store_callbacks *store, int rank,
                               int size, cx_transport **out)
{
    const cx_transport_entry *asked = NULL;
    cfx_status st = cx_transport_asked(cfg, &asked);
    if (st)
        return st;
    const cx_transport_entry *by_store = cx_transport_first_meeting(CX_MEETS_STORE);
    if (asked && asked->meets != CX_MEETS_STORE && !(size == 1 && asked->meets == CX_MEETS_IN_PROCESS))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_group: rank %d of %d: a group meets "
                       "over a transport that meets through a store (%s), but the %s transport "
                       "was asked for", rank, size, by_store ? by_store->name : "none built",
                       asked->name);
    if (size == 1)
        return world_of_one(cfg, out); /* nobody to meet */
    const cx_transport_entry *e = asked ? asked : by_store;
    if (!e)
        return cx_fail(CFX_ERR_UNSUPPORTED, "cfx_init_group: rank %d of %d: no transport of this "
                       "build meets through a store", rank, size);
    cx_launch l;
    memset(&l, 0, sizeof l);
    l.launcher = CX_LAUNCHER_NONE;
    l.rank = rank;
    l.size = size;
    return join_through_store(cfg, e, &l, store, "group", out);
}
