/* launch_env - what the launcher's environment says about the job (see launch_env.h). */
#include "base/launch_env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* torchrun's MASTER_PORT belongs to torch's own TCPStore: Conflux's store takes the next port
 * (CFX_RENDEZVOUS_PORT overrides). Slurm gives no port at all: one is derived from the job and
 * step ids so every task of the step computes the same one. A derived port can be held by any
 * other socket of the host (MASTER_PORT + 1 is of the parity Linux gives outgoing connections):
 * the store may move up to DERIVED_PORT_SPAN - 1 ports on, and the job's token tells it apart. */
#define SLURM_PORT_BASE 20000
#define SLURM_PORT_SPAN 20000
#define DERIVED_PORT_SPAN 8
#define DEFAULT_RENDEZVOUS_TIMEOUT_S 60.0
#define DEFAULT_TRANSPORT_TIMEOUT_S 30.0

typedef struct reader {
    cx_launch_lookup lookup;
    void *user;
} reader;

static const char *env_var(const reader *r, const char *name)
{
    const char *v = r->lookup ? r->lookup(name, r->user) : getenv(name);
    return v && *v ? v : NULL;
}

const char *cx_launcher_name(cx_launcher l)
{
    switch (l) {
    case CX_LAUNCHER_CFX: return "CFX_RANK/CFX_SIZE (cfxrun or by hand)";
    case CX_LAUNCHER_OPENMPI: return "Open MPI (mpirun)";
    case CX_LAUNCHER_TORCHRUN: return "torchrun";
    case CX_LAUNCHER_SLURM: return "Slurm (srun)";
    case CX_LAUNCHER_HOROVOD: return "Horovod's Gloo launcher (horovodrun --gloo)";
    default: return "no launcher";
    }
}

const char *cx_launcher_command(cx_launcher l)
{
    switch (l) {
    case CX_LAUNCHER_CFX: return "cfxrun";
    case CX_LAUNCHER_OPENMPI: return "mpirun";
    case CX_LAUNCHER_TORCHRUN: return "torchrun";
    case CX_LAUNCHER_SLURM: return "srun";
    case CX_LAUNCHER_HOROVOD: return "horovodrun";
    default: return "no launcher";
    }
}

/* An integer variable; *out stays as it was when the variable is unset. */
static cfx_status read_int(const reader *r, const char *name, long lo, long hi, int *out)
{
    const char *v = env_var(r, name);
    if (!v)
        return CFX_OK;
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected an integer in %ld..%ld", name, v, lo, hi);
    *out = (int)n;
    return CFX_OK;
}

static cfx_status check_rank(const char *rank_var, const char *size_var, const cx_launch *l)
{
    if (l->rank >= 0 && l->size > 0 && l->rank >= l->size)
        return cx_fail(CFX_ERR_CONFIG, "%s=%d is not below %s=%d", rank_var, l->rank, size_var,
                       l->size);
    return CFX_OK;
}

/* "host:port" (the last colon splits; "[v6addr]:port" keeps the brackets out of the host). */
static cfx_status parse_addr(const char *var, const char *text, cx_launch *l)
{
    const char *colon = strrchr(text, ':');
    const char *host = text;
    size_t host_len = colon ? (size_t)(colon - text) : 0;
    if (host_len >= 2 && host[0] == '[' && host[host_len - 1] == ']') {
        host++;
        host_len -= 2;
    }
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || host_len == 0 || host_len >= sizeof l->store_host || end == colon + 1 || *end ||
        port < 1 || port > 65535)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected host:port (port 1..65535)", var, text);
    memcpy(l->store_host, host, host_len);
    l->store_host[host_len] = '\0';
    l->store_port = (int)port;
    return CFX_OK;
}

static void set_host(cx_launch *l, const char *host, size_t len)
{
    if (len >= sizeof l->store_host)
        len = sizeof l->store_host - 1;
    memcpy(l->store_host, host, len);
    l->store_host[len] = '\0';
}

/* The first host of a Slurm host list: "node[01-04,7],gpu3" -> "node01". */
static void first_slurm_host(const char *list, cx_launch *l)
{
    size_t n = strcspn(list, ",[");
    char host[CX_LAUNCH_HOST_MAX];
    if (n >= sizeof host)
        n = sizeof host - 1;
    memcpy(host, list, n);
    host[n] = '\0';
    if (list[n] == '[') {
        const char *first = list + n + 1;
        size_t digits = strspn(first, "0123456789");
        if (digits && n + digits < sizeof host) {
            memcpy(host + n, first, digits);
            host[n + digits] = '\0';
        }
    }
    set_host(l, host, strlen(host));
}

static void lacking(cx_launch *l, const char *fmt, const char *a, const char *b)
{
    snprintf(l->missing, sizeof l->missing, fmt, a, b);
}

/* The launcher's own rank/size variables, in the documented order. */
static cfx_status find_launcher(const reader *r, cx_launch *l)
{
    cfx_status st;
    if (env_var(r, "CFX_RANK") || env_var(r, "CFX_SIZE")) {
        l->launcher = CX_LAUNCHER_CFX;
        if ((st = read_int(r, "CFX_RANK", 0, 1 << 24, &l->rank)) ||
            (st = read_int(r, "CFX_SIZE", 1, 1 << 24, &l->size)) ||
            (st = read_int(r, "CFX_LOCAL_RANK", 0, 1 << 24, &l->local_rank)) ||
            (st = read_int(r, "CFX_LOCAL_SIZE", 1, 1 << 24, &l->local_size)))
            return st;
        if (l->rank < 0 || l->size < 0)
            lacking(l, "%s is unset (CFX_RANK and CFX_SIZE go together)%s",
                    l->rank < 0 ? "CFX_RANK" : "CFX_SIZE", "");
        return check_rank("CFX_RANK", "CFX_SIZE", l);
    }
    if (env_var(r, "OMPI_COMM_WORLD_SIZE")) {
        l->launcher = CX_LAUNCHER_OPENMPI;
        if ((st = read_int(r, "OMPI_COMM_WORLD_RANK", 0, 1 << 24, &l->rank)) ||
            (st = read_int(r, "OMPI_COMM_WORLD_SIZE", 1, 1 << 24, &l->size)) ||
            (st = read_int(r, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 24, &l->local_rank)) ||
            (st = read_int(r, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1 << 24, &l->local_size)))
            return st;
        return check_rank("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", l);
    }
    if (env_var(r, "WORLD_SIZE") && env_var(r, "RANK")) {
        l->launcher = CX_LAUNCHER_TORCHRUN;
        if ((st = read_int(r, "RANK", 0, 1 << 24, &l->rank)) ||
            (st = read_int(r, "WORLD_SIZE", 1, 1 << 24, &l->size)) ||
            (st = read_int(r, "LOCAL_RANK", 0, 1 << 24, &l->local_rank)) ||
            (st = read_int(r, "LOCAL_WORLD_SIZE", 1, 1 << 24, &l->local_size)))
            return st;
        return check_rank("RANK", "WORLD_SIZE", l);
    }
    if (env_var(r, "SLURM_PROCID") && env_var(r, "SLURM_NTASKS")) {
        l->launcher = CX_LAUNCHER_SLURM;
        if ((st = read_int(r, "SLURM_PROCID", 0, 1 << 24, &l->rank)) ||
            (st = read_int(r, "SLURM_NTASKS", 1, 1 << 24, &l->size)) ||
            (st = read_int(r, "SLURM_LOCALID", 0, 1 << 24, &l->local_rank)))
            return st;
        return check_rank("SLURM_PROCID", "SLURM_NTASKS", l);
    }
    if (env_var(r, "HOROVOD_RANK") && env_var(r, "HOROVOD_SIZE")) {
        l->launcher = CX_LAUNCHER_HOROVOD;
        if ((st = read_int(r, "HOROVOD_RANK", 0, 1 << 24, &l->rank)) ||
            (st = read_int(r, "HOROVOD_SIZE", 1, 1 << 24, &l->size)) ||
            (st = read_int(r, "HOROVOD_LOCAL_RANK", 0, 1 << 24, &l->local_rank)) ||
            (st = read_int(r, "HOROVOD_LOCAL_SIZE", 1, 1 << 24, &l->local_size)))
            return st;
        return check_rank("HOROVOD_RANK", "HOROVOD_SIZE", l);
    }
    return CFX_OK;
}

/* Where the ranks meet when no CFX_RENDEZVOUS_ADDR/DIR says: from the launcher's variables. */
static cfx_status launcher_meeting_place(const reader *r, cx_launch *l, int own_port)
{
    cfx_status st;
    switch (l->launcher) {
    case CX_LAUNCHER_TORCHRUN: {
        const char *addr = env_var(r, "MASTER_ADDR");
        int master_port = 0;
        if ((st = read_int(r, "MASTER_PORT", 1, 65535, &master_port)))
            return st;
        if (!addr || !master_port) {
            lacking(l, "%s is unset (torchrun sets MASTER_ADDR and MASTER_PORT; or set "
                    "CFX_RENDEZVOUS_ADDR=host:port)%s", !addr ? "MASTER_ADDR" : "MASTER_PORT", "");
            return CFX_OK;
        }
        if (own_port == master_port)
            return cx_fail(CFX_ERR_CONFIG, "CFX_RENDEZVOUS_PORT=%d is torchrun's MASTER_PORT, which "
                           "torch's own store listens on: choose another port", own_port);
        set_host(l, addr, strlen(addr));
        l->store_port = own_port ? own_port
            : master_port + DERIVED_PORT_SPAN <= 65535 ? master_port + 1
                                                        : master_port - DERIVED_PORT_SPAN;
        snprintf(l->store_source, sizeof l->store_source, "MASTER_ADDR and %s",
                 own_port ? "CFX_RENDEZVOUS_PORT" : "MASTER_PORT + 1");
        if (!own_port) {
            /* torchrun names each run and counts its restarts: a restarted group meets anew. */
            const char *run = env_var(r, "TORCHELASTIC_RUN_ID");
            const char *restart = env_var(r, "TORCHELASTIC_RESTART_COUNT");
            l->store_port_span = DERIVED_PORT_SPAN;
            snprintf(l->store_token, sizeof l->store_token, "torchrun run %.80s at %.120s:%d "
                     "restart %.16s", run ? run : "-", addr, master_port, restart ? restart : "0");
        }
        return CFX_OK;
    }
    case CX_LAUNCHER_SLURM: {
        const char *nodes = env_var(r, "SLURM_STEP_NODELIST");
        if (!nodes)
            nodes = env_var(r, "SLURM_JOB_NODELIST");
        if (!nodes) {
            lacking(l, "%s is unset (srun sets it)%s", "SLURM_STEP_NODELIST", "");
            return CFX_OK;
        }
        first_slurm_host(nodes, l);
        int job = 0, step = 0;
        if ((st = read_int(r, "SLURM_JOB_ID", 0, 0x7fffffff, &job)) ||
            (st = read_int(r, "SLURM_STEP_ID", 0, 0x7fffffff, &step)))
            return st;
        l->store_port = own_port ? own_port
            : SLURM_PORT_BASE + (int)(((unsigned)job * 31u + (unsigned)step) % SLURM_PORT_SPAN);
        snprintf(l->store_source, sizeof l->store_source, "the first node of SLURM_STEP_NODELIST "
                 "and %s", own_port ? "CFX_RENDEZVOUS_PORT" : "a port from SLURM_JOB_ID/STEP_ID");
        if (!own_port) {
            l->store_port_span = DERIVED_PORT_SPAN;
            snprintf(l->store_token, sizeof l->store_token, "slurm job %d step %d at %.200s",
                     job, step, l->store_host);
        }
        return CFX_OK;
    }
    case CX_LAUNCHER_HOROVOD:
        lacking(l, "Horovod's rendezvous server (%s) speaks HTTP, which Conflux's stores do not: "
                "set CFX_RENDEZVOUS_ADDR=host:port (rank 0's host) or CFX_RENDEZVOUS_DIR%s",
                "HOROVOD_GLOO_RENDEZVOUS_ADDR", "");
        return CFX_OK;
    case CX_LAUNCHER_OPENMPI:
        return CFX_OK; /* MPI's own launch: no store needed unless asked for */
    default:
        lacking(l, "%s%s", "CFX_RENDEZVOUS_ADDR (host:port) or CFX_RENDEZVOUS_DIR is unset", "");
        return CFX_OK;
    }
}

/* CFX_RENDEZVOUS_SCOPE: a name that becomes part of store keys (letters, digits, '.', '_', '-'). */
static cfx_status read_scope(const reader *r, cx_launch *l)
{
    const char *v = env_var(r, "CFX_RENDEZVOUS_SCOPE");
    if (!v)
        return CFX_OK;
    size_t n = strlen(v);
    if (n >= sizeof l->store_scope)
        return cx_fail(CFX_ERR_CONFIG, "CFX_RENDEZVOUS_SCOPE is %zu characters long; at most %zu",
                       n, sizeof l->store_scope - 1);
    size_t ok = strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-");
    if (ok != n)
        return cx_fail(CFX_ERR_CONFIG, "CFX_RENDEZVOUS_SCOPE is \"%s\": character %zu ('%c') is "
                       "not a letter, digit, '.', '_' or '-'", v, ok + 1, v[ok]);
    snprintf(l->store_scope, sizeof l->store_scope, "%s", v);
    return CFX_OK;
}

cfx_status cx_launch_detect(cx_launch *l, cx_launch_lookup lookup, void *user)
{
    reader r = {lookup, user};
    memset(l, 0, sizeof *l);
    l->rank = l->size = l->local_rank = l->local_size = -1;
    l->mpi_launch = env_var(&r, "OMPI_COMM_WORLD_SIZE") != NULL;
    l->elastic_id = -1;
    cfx_status st = read_int(&r, "CFX_ELASTIC_ID", 0, 1000000, &l->elastic_id);
    if (!st)
        st = read_int(&r, "CFX_ELASTIC", 0, 1, &l->elastic);
    if (!st)
        st = read_scope(&r, l);
    if (!st)
        st = find_launcher(&r, l);
    if (st || l->launcher == CX_LAUNCHER_NONE || l->missing[0])
        return st;
    const char *addr = env_var(&r, "CFX_RENDEZVOUS_ADDR");
    const char *dir = env_var(&r, "CFX_RENDEZVOUS_DIR");
    int own_port = 0;
    if ((st = read_int(&r, "CFX_RENDEZVOUS_PORT", 1, 65535, &own_port)))
        return st;
    l->store_served_by_launcher = 0;
    if ((st = read_int(&r, "CFX_RENDEZVOUS_EXTERNAL", 0, 1, &l->store_served_by_launcher)))
        return st;
    if (addr) {
        if ((st = parse_addr("CFX_RENDEZVOUS_ADDR", addr, l)))
            return st;
        snprintf(l->store_source, sizeof l->store_source, "CFX_RENDEZVOUS_ADDR");
    } else if (dir) {
        if (strlen(dir) >= sizeof l->store_dir)
            return cx_fail(CFX_ERR_CONFIG, "CFX_RENDEZVOUS_DIR is %zu characters long; at most %zu",
                           strlen(dir), sizeof l->store_dir - 1);
        snprintf(l->store_dir, sizeof l->store_dir, "%s", dir);
        snprintf(l->store_source, sizeof l->store_source, "CFX_RENDEZVOUS_DIR");
    } else if ((st = launcher_meeting_place(&r, l, own_port))) {
        return st;
    }
    return CFX_OK;
}

static cfx_status read_seconds(const reader *r, const char *name, double dflt, double *out)
{
    const char *v = env_var(r, name);
    *out = dflt;
    if (!v)
        return CFX_OK;
    char *end = NULL;
    double s = strtod(v, &end);
    if (end == v || *end || !(s > 0 && s <= 86400))
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected seconds in (0, 86400]", name, v);
    *out = s;
    return CFX_OK;
}

cfx_status cx_launch_timeouts(cx_launch_lookup lookup, void *user, double *rendezvous_s,
                              double *transport_s)
{
    reader r = {lookup, user};
    cfx_status st = read_seconds(&r, "CFX_RENDEZVOUS_TIMEOUT_S", DEFAULT_RENDEZVOUS_TIMEOUT_S,
                                 rendezvous_s);
    return st ? st : read_seconds(&r, "CFX_TRANSPORT_TIMEOUT_S", DEFAULT_TRANSPORT_TIMEOUT_S,
                                  transport_s);
}

cfx_status cx_launch_elastic_defaults(cx_launch_lookup lookup, void *user, cx_elastic_defaults *out)
{
    reader r = {lookup, user};
    out->min_size = 1;
    out->max_size = 0;
    cfx_status st = read_int(&r, "CFX_ELASTIC_MIN_SIZE", 1, 1 << 24, &out->min_size);
    if (!st)
        st = read_int(&r, "CFX_ELASTIC_MAX_SIZE", 0, 1 << 24, &out->max_size);
    if (!st)
        st = read_seconds(&r, "CFX_ELASTIC_TIMEOUT_S", 60, &out->timeout_s);
    return st ? st : read_seconds(&r, "CFX_ELASTIC_SETTLE_S", 10, &out->settle_s);
}
