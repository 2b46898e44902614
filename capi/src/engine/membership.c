/* membership - elastic worlds' membership rounds (see membership.h). */
#include "engine/membership.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/launch_env.h"
#include "transport/registry.h"

/* How many ids past the largest known a round looks at for newcomers: the driver numbers the
 * workers it starts, and some may die before they say hello. */
#define NEWCOMER_WINDOW 16
/* How often a participant looks at the store while a round is open. */
#define POLL_S 0.02
/* How long past the deadline a participant waits for the leader's decision (the leader publishes
 * a failure at the deadline itself). */
#define DECISION_GRACE_S 5.0
#define KEY_MAX 64

struct cx_membership {
    cx_store *store;   /* the "elastic/" view; lives across rounds */
    int id;            /* this process's member id */
    int first_size;    /* the launcher's size: world 0 is ids 0 .. first_size - 1 */
    int round;         /* the round of the current world (0 before any) */
    int *ids;          /* the current world's member ids, in rank order */
    size_t n;
    int max_id;        /* the largest id any decision named */
    const cx_transport_entry *transport; /* what each world is made of (CX_ENTRY_ELASTIC) */
    double rendezvous_s, transport_s;
    int test_local_size;
    char left[512];
};

/* ---- opening ------------------------------------------------------------------------------ */

static cfx_status open_store(const cx_launch *l, double timeout_s, cx_store **out)
{
    if (l->store_dir[0])
        return cx_store_file_create(l->store_dir, out);
    if (l->store_port && l->store_served_by_launcher)
        return cx_store_tcp_create(&(cx_tcp_store_params){.host = l->store_host,
                                                           .port = l->store_port,
                                                           .generation = 1,
                                                           .timeout_s = timeout_s},
                                   out);
    return cx_fail(CFX_ERR_CONFIG, "cfx_elastic_init: an elastic job meets through a store that "
                   "outlives every worker: the one cfxrun --elastic serves (CFX_RENDEZVOUS_ADDR "
                   "with CFX_RENDEZVOUS_EXTERNAL=1) or a file store (CFX_RENDEZVOUS_DIR); %s",
                   l->store_port ? "here rank 0 would serve the store, and rank 0 may be the one "
                                   "that leaves" : "none is set");
}

cfx_status cx_membership_open(const cx_config *cfg, cx_membership **out)
{
    *out = NULL;
    const cx_launch *lp;
    cfx_status st = cx_config_launch(cfg, &lp);
    if (st)
        return st;
    const cx_launch l = *lp;
    /* The transport asked for (CFX_TRANSPORT), else the first that membership can form. */
    const cx_transport_entry *e = NULL;
    if ((st = cx_transport_asked(cfg, &e)))
        return st;
    size_t n;
    const cx_transport_entry *all = cx_transport_entries(&n);
    for (size_t i = 0; !e && i < n; i++)
        if (all[i].caps & CX_ENTRY_ELASTIC)
            e = &all[i];
    if (!e || !(e->caps & CX_ENTRY_ELASTIC))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_elastic_init: an elastic world runs over a "
                       "transport that membership rounds can form again, but %s%s (an MPI world "
                       "cannot shrink)", e ? "the transport asked for is " : "this build has none",
                       e ? e->name : "");
    cx_transport *none;
    if (!e->built) /* says so before any round */
        return cx_transport_create(e, &(cx_transport_params){0}, CFX_ERR_UNSUPPORTED,
                                   "cfx_elastic_init", &none);
    if (l.launcher == CX_LAUNCHER_NONE || l.rank < 0 || l.size < 1)
        return cx_fail(CFX_ERR_CONFIG, "cfx_elastic_init: no launcher's variables give this "
                       "process's rank and the first world's size (start the job with cfxrun "
                       "--elastic, or set CFX_RANK and CFX_SIZE)");
    cx_membership *m = calloc(1, sizeof *m);
    if (!m)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the membership");
    m->id = l.rank;
    m->first_size = l.size;
    m->max_id = l.size - 1;
    m->test_local_size = cfg->test.local_size;
    m->transport = e;
    m->rendezvous_s = cfg->rendezvous_timeout_s;
    m->transport_s = cfg->transport_timeout_s;
    snprintf(m->left, sizeof m->left, "none");
    if (l.elastic_id >= 0)
        m->id = l.elastic_id;
    cx_store *base = NULL;
    if (!(st = open_store(&l, m->rendezvous_s, &base)))
        st = cx_store_prefixed(base, "elastic", 1, &m->store);
    if (st) {
        free(m);
        return st;
    }
    *out = m;
    return CFX_OK;
}

void cx_membership_close(cx_membership *m)
{
    if (!m)
        return;
    cx_store_destroy(m->store);
    free(m->ids);
    free(m);
}

int cx_membership_round(const cx_membership *m) { return m->round; }

int cx_membership_id(const cx_membership *m) { return m->id; }

const char *cx_membership_left(const cx_membership *m) { return m->left; }

/* ---- the store's keys ----------------------------------------------------------------------- */

static cfx_status present(cx_membership *m, const char *key, int *yes)
{
    return m->store->ops->check(m->store, key, yes);
}

static cfx_status hello_of(cx_membership *m, int round, int id, int *yes)
{
    char key[KEY_MAX], gone[KEY_MAX];
    snprintf(key, sizeof key, "r%d/hello/%d", round, id);
    snprintf(gone, sizeof gone, "gone/%d", id);
    int is_gone = 0;
    cfx_status st = present(m, key, yes);
    if (!st && *yes && !(st = present(m, gone, &is_gone)))
        *yes = !is_gone; /* said hello, then died: not a participant */
    return st;
}

/* A decision's text: "ok id id ..." or "fail message". *text malloc'ed, NULL when undecided. */
static cfx_status decision_of(cx_membership *m, int round, char **text)
{
    char key[KEY_MAX];
    snprintf(key, sizeof key, "r%d/decision", round);
    *text = NULL;
    int yes = 0;
    cfx_status st = present(m, key, &yes);
    if (st || !yes)
        return st;
    void *data;
    size_t len;
    if ((st = m->store->ops->get(m->store, key, &data, &len)))
        return st;
    char *t = realloc(data, len + 1);
    if (!t) {
        free(data);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d's decision", round);
    }
    t[len] = '\0';
    *text = t;
    return CFX_OK;
}

/* The ids of an "ok" decision (*ids malloc'ed). */
static cfx_status parse_ids(const char *text, int round, int **ids, size_t *n)
{
    size_t cap = 1;
    for (const char *p = text; *p; p++)
        cap += *p == ' ';
    int *v = malloc(cap * sizeof *v);
    if (!v)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d's members", round);
    size_t k = 0;
    const char *p = text + 2; /* past "ok" */
    while (*p == ' ') {
        char *end;
        long id = strtol(p + 1, &end, 10);
        if (end == p + 1 || k == cap) {
            free(v);
            return cx_fail(CFX_ERR_INTERNAL, "round %d's decision is malformed: \"%.80s\"", round,
                           text);
        }
        v[k++] = (int)id;
        p = end;
    }
    *ids = v;
    *n = k;
    return CFX_OK;
}

static int index_of(const int *ids, size_t n, int id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return (int)i;
    return -1;
}

/* The members of world round - 1 (world 0: the launcher's ids 0 .. first_size - 1). A failed
 * decision ended the job: CFX_ERR_MEMBERSHIP_CHANGED with its message. */
static cfx_status world_before(cx_membership *m, int round, int **ids, size_t *n)
{
    if (round == 1) {
        *ids = malloc((size_t)m->first_size * sizeof **ids);
        if (!*ids)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the first world's members");
        for (int i = 0; i < m->first_size; i++)
            (*ids)[i] = i;
        *n = (size_t)m->first_size;
        return CFX_OK;
    }
    char *text;
    cfx_status st = decision_of(m, round - 1, &text);
    if (!st && !text)
        st = cx_fail(CFX_ERR_INTERNAL, "round %d has no decision, yet round %d was opened",
                     round - 1, round);
    if (!st && strncmp(text, "ok", 2) != 0)
        st = cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "the elastic job ended at round %d: %s",
                     round - 1, text + 5);
    if (!st)
        st = parse_ids(text, round - 1, ids, n);
    free(text);
    return st;
}

/* ---- one round ------------------------------------------------------------------------------ */

typedef struct round_view {
    int *prev;      /* world round - 1 */
    size_t nprev;
    int *here;      /* prev members present (1) or not (0), by old rank */
    int newcomers[NEWCOMER_WINDOW];
    size_t nnew;    /* newcomers present, ascending ids */
    int leader;     /* the first present participant's id, -1 when none */
    int accounted;  /* every member of prev is present or gone */
} round_view;

static cfx_status look(cx_membership *m, int round, int first_new, round_view *v)
{
    cfx_status st = CFX_OK;
    v->leader = -1;
    v->accounted = 1;
    v->nnew = 0;
    for (size_t i = 0; !st && i < v->nprev; i++) {
        char gone[KEY_MAX];
        int is_gone = 0;
        st = hello_of(m, round, v->prev[i], &v->here[i]);
        snprintf(gone, sizeof gone, "gone/%d", v->prev[i]);
        /* Gone wins over a hello: the launcher marks a worker gone as it stops it (a failed
         * worker's host leaving whole), and a member that said hello first must not be counted
         * on to form the world. */
        if (!st)
            st = present(m, gone, &is_gone);
        v->here[i] = v->here[i] && !is_gone;
        v->accounted = v->accounted && (v->here[i] || is_gone);
        if (v->here[i] && v->leader < 0)
            v->leader = v->prev[i];
    }
    for (int id = first_new; !st && id < first_new + NEWCOMER_WINDOW; id++) {
        int yes = 0;
        if (index_of(v->prev, v->nprev, id) < 0 && !(st = hello_of(m, round, id, &yes)) && yes) {
            v->newcomers[v->nnew++] = id;
            if (v->leader < 0)
                v->leader = id;
        }
    }
    return st;
}

/* The leader's decision: ok with the members in rank order, or a failure naming who is missing. */
static cfx_status decide(cx_membership *m, int round, const round_view *v,
                         const cfx_reform_options *o, int final, int *decided)
{
    size_t count = 0, cap = o->max_size > 0 ? (size_t)o->max_size : (size_t)-1;
    size_t textcap = 16 + 12 * (v->nprev + NEWCOMER_WINDOW) + 512;
    char *text = malloc(textcap);
    if (!text)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d's decision", round);
    size_t len = (size_t)snprintf(text, textcap, "ok");
    for (size_t i = 0; i < v->nprev && count < cap; i++)
        if (v->here[i]) {
            len += (size_t)snprintf(text + len, textcap - len, " %d", v->prev[i]);
            count++;
        }
    for (size_t i = 0; i < v->nnew && count < cap; i++) {
        len += (size_t)snprintf(text + len, textcap - len, " %d", v->newcomers[i]);
        count++;
    }
    *decided = 0;
    if (count < (size_t)o->min_size) {
        if (!final) {
            free(text);
            return CFX_OK; /* newcomers may still come before the deadline */
        }
        len = (size_t)snprintf(text, textcap, "fail round %d: %zu member%s came before the "
                               "deadline (%g s), fewer than the minimum %d; missing from the "
                               "world before:", round, count, count == 1 ? "" : "s",
                               o->timeout_s, o->min_size);
        for (size_t i = 0; i < v->nprev && len < textcap - 32; i++)
            if (!v->here[i])
                len += (size_t)snprintf(text + len, textcap - len, " id %d (rank %zu)",
                                        v->prev[i], i);
    }
    char key[KEY_MAX];
    snprintf(key, sizeof key, "r%d/decision", round);
    cfx_status st = cx_store_set(m->store, key, text, strlen(text));
    free(text);
    *decided = !st;
    return st;
}

/* Text naming the members of `prev` that `now` lacks. */
static void describe_left(char *out, size_t cap, const int *prev, size_t nprev, const int *now,
                          size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < nprev && len + 40 < cap; i++)
        if (index_of(now, n, prev[i]) < 0)
            len += (size_t)snprintf(out + len, cap - len, "%sid %d (rank %zu)", len ? ", " : "",
                                    prev[i], i);
    if (!len)
        snprintf(out, cap, "none");
}

/* Takes part in round `round`: *included = 1 with m's world updated, or 0 when the decision left
 * this process out (it tries the next round). */
static cfx_status take_part(cx_membership *m, int round, const cfx_reform_options *o,
                            double deadline, int *included)
{
    *included = 0;
    round_view v = {0};
    cfx_status st = world_before(m, round, &v.prev, &v.nprev);
    if (st)
        return st;
    v.here = calloc(v.nprev ? v.nprev : 1, sizeof *v.here);
    if (!v.here) {
        free(v.prev);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d", round);
    }
    int first_new = m->max_id + 1;
    for (size_t i = 0; i < v.nprev; i++)
        first_new = v.prev[i] + 1 > first_new ? v.prev[i] + 1 : first_new;
    char key[KEY_MAX], mine[32];
    snprintf(key, sizeof key, "r%d/hello/%d", round, m->id);
    snprintf(mine, sizeof mine, "%d", index_of(v.prev, v.nprev, m->id));
    st = cx_store_set(m->store, key, mine, strlen(mine));
    double settle_end = cx_now_s() + o->settle_s;
    if (settle_end > deadline)
        settle_end = deadline;
    char *text = NULL;
    while (!st) {
        if ((st = decision_of(m, round, &text)) || text)
            break;
        double now = cx_now_s();
        if (now > deadline + DECISION_GRACE_S) {
            st = cx_fail(CFX_ERR_TIMEOUT, "membership round %d: no decision by the deadline "
                         "(%g s); the round's leader (member id %d) did not decide", round,
                         o->timeout_s, v.leader);
            break;
        }
        if ((st = look(m, round, first_new, &v)))
            break;
        int decided = 0;
        if (v.leader == m->id && (v.accounted || now >= settle_end) &&
            (st = decide(m, round, &v, o, now >= deadline, &decided)))
            break;
        if (!decided) {
            struct timespec ts = {0, (long)(POLL_S * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    if (!st && strncmp(text, "ok", 2) != 0)
        st = cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "membership: %s", text + 5);
    int *ids = NULL;
    size_t n = 0;
    if (!st)
        st = parse_ids(text, round, &ids, &n);
    for (size_t i = 0; !st && i < n; i++)
        m->max_id = ids[i] > m->max_id ? ids[i] : m->max_id;
    if (!st && index_of(ids, n, m->id) >= 0) {
        *included = 1;
        describe_left(m->left, sizeof m->left, v.prev, v.nprev, ids, n);
        free(m->ids);
        m->ids = ids;
        m->n = n;
        m->round = round;
        ids = NULL;
    }
    free(ids);
    free(text);
    free(v.prev);
    free(v.here);
    return st;
}

static cfx_status build_transport(cx_membership *m, cx_transport **out)
{
    char space[KEY_MAX];
    snprintf(space, sizeof space, "r%d/world", m->round);
    cx_store *view;
    cfx_status st = cx_store_prefixed(m->store, space, 0, &view);
    if (st)
        return st;
    cx_transport_params p = {.rank = index_of(m->ids, m->n, m->id), .size = (int)m->n,
                             .store = view, .timeout_s = m->transport_s,
                             .rendezvous_s = m->rendezvous_s,
                             .pretend_local_size = m->test_local_size};
    return cx_transport_create(m->transport, &p, CFX_ERR_UNSUPPORTED, "membership", out);
}

cfx_status cx_membership_form(cx_membership *m, const cfx_reform_options *o, const cx_logger *log,
                              cx_transport **out)
{
    *out = NULL;
    if (o->min_size < 1 || (o->max_size && o->max_size < o->min_size) || !(o->timeout_s > 0) ||
        !(o->settle_s >= 0))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "membership: min_size %d, max_size %d, timeout_s "
                       "%g, settle_s %g: need 1 <= min_size <= max_size (or max_size 0), a positive "
                       "timeout and a settle time >= 0", o->min_size, o->max_size, o->timeout_s,
                       o->settle_s);
    double start = cx_now_s(), deadline = start + o->timeout_s;
    int round = m->round + 1;
    for (;;) {
        char *text = NULL;
        cfx_status st = decision_of(m, round, &text);
        if (st)
            return st;
        if (text) { /* decided without this process: a failure ended the job, else try the next */
            int ok = strncmp(text, "ok", 2) == 0;
            if (!ok)
                st = cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "the elastic job ended at round %d: %s",
                             round, text + 5);
            free(text);
            if (st)
                return st;
            round++;
            continue;
        }
        int included = 0;
        if ((st = take_part(m, round, o, deadline, &included)))
            return st;
        if (included)
            break;
        if (cx_now_s() > deadline)
            return cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "membership: member id %d was left out of "
                           "every round up to %d before the deadline (%g s; the world is full at "
                           "max_size %d?)", m->id, round, o->timeout_s, o->max_size);
        round++;
    }
    int rank = index_of(m->ids, m->n, m->id);
    cx_log(log, CX_LOG_INFO, "membership", "round %d: member id %d is rank %d of %zu (%.3f s); "
           "left since the world before: %s", m->round, m->id, rank, m->n, cx_now_s() - start,
           m->left);
    return build_transport(m, out);
}

cfx_status cx_membership_pending(cx_membership *m, int *count)
{
    *count = 0;
    int first_new = m->max_id + 1;
    cfx_status st = CFX_OK;
    for (int id = first_new; !st && id < first_new + NEWCOMER_WINDOW; id++) {
        int yes = 0;
        if (!(st = hello_of(m, m->round + 1, id, &yes)))
            *count += yes;
    }
    return st;
}
