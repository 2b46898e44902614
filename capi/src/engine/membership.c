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
    int *back;         /* members of the world before that the current one left out: they came
                        * too late, and may come back in the next round */
    size_t nback;
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
    free(m->back);
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

/* Whether the launcher marked member `id` gone ("gone/<id>"). `store` is the "elastic/" view. */
static cfx_status gone_of(cx_store *store, int id, int *yes)
{
    char key[KEY_MAX];
    snprintf(key, sizeof key, "gone/%d", id);
    return store->ops->check(store, key, yes);
}

static cfx_status hello_of(cx_membership *m, int round, int id, int *yes)
{
    char key[KEY_MAX];
    snprintf(key, sizeof key, "r%d/hello/%d", round, id);
    int is_gone = 0;
    cfx_status st = present(m, key, yes);
    if (!st && *yes && !(st = gone_of(m->store, id, &is_gone)))
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

/* The ids of `a` that `b` lacks, in a's order (*out malloc'ed, also when empty). */
static cfx_status left_out(const int *a, size_t na, const int *b, size_t nb, int **out, size_t *n)
{
    *n = 0;
    if (!(*out = malloc((na ? na : 1) * sizeof **out)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a round's members");
    for (size_t i = 0; i < na; i++)
        if (index_of(b, nb, a[i]) < 0)
            (*out)[(*n)++] = a[i];
    return CFX_OK;
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
    int *gone;      /* prev members marked gone (1) or not (0), by old rank */
    int *back;      /* members of world round - 2 that world round - 1 left out */
    size_t nback;
    int *joiners;   /* present and not in prev: those of back, then newcomers by id */
    size_t njoin;
    size_t waiting; /* prev members neither present nor gone: they may still come */
    int leader;     /* the participant that decides now, -1 when none may */
    int accounted;  /* every member of prev is present or gone */
    int me_gone;    /* this process is marked gone: no round counts on it */
} round_view;

/* Who leads: the first member of world round - 1 present; a newcomer only once no member of that
 * world may still come (every one is gone). The members come to a round only at their next
 * commit or check, which may be long after a newcomer started: a newcomer that led while they may
 * still come would decide a world without them after settle_s, which splits the job or loses its
 * trained state. New workers wait for the existing ones, as in Horovod; at its deadline such a
 * newcomer gives up without deciding (no_leader). */
static cfx_status look(cx_membership *m, int round, int first_new, round_view *v)
{
    cfx_status st = CFX_OK;
    int first_prev = -1;
    v->waiting = 0;
    v->njoin = 0;
    for (size_t i = 0; !st && i < v->nprev; i++) {
        st = hello_of(m, round, v->prev[i], &v->here[i]);
        v->gone[i] = 0;
        if (!st && !v->here[i])
            st = gone_of(m->store, v->prev[i], &v->gone[i]);
        v->waiting += !v->here[i] && !v->gone[i];
        if (v->here[i] && first_prev < 0)
            first_prev = v->prev[i];
    }
    /* A member that a round left out for coming too late is no newcomer (its id is below the
     * window): without this it would wait in this round, counted by nobody, until its deadline. */
    for (size_t i = 0; !st && i < v->nback; i++) {
        int yes = 0;
        if (!(st = hello_of(m, round, v->back[i], &yes)) && yes)
            v->joiners[v->njoin++] = v->back[i];
    }
    for (int id = first_new; !st && id < first_new + NEWCOMER_WINDOW; id++) {
        int yes = 0;
        if (index_of(v->prev, v->nprev, id) < 0 && index_of(v->back, v->nback, id) < 0 &&
            !(st = hello_of(m, round, id, &yes)) && yes)
            v->joiners[v->njoin++] = id;
    }
    if (!st)
        st = gone_of(m->store, m->id, &v->me_gone);
    v->accounted = v->waiting == 0;
    v->leader = first_prev;
    if (v->leader < 0 && v->accounted && v->njoin)
        v->leader = v->joiners[0];
    return st;
}

/* The leader's decision: ok with the members in rank order, or a failure naming who is missing. */
static cfx_status decide(cx_membership *m, int round, const round_view *v,
                         const cfx_reform_options *o, int final, int *decided)
{
    size_t count = 0, cap = o->max_size > 0 ? (size_t)o->max_size : (size_t)-1;
    size_t textcap = 16 + 12 * (v->nprev + v->nback + NEWCOMER_WINDOW) + 512;
    char *text = malloc(textcap);
    if (!text)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d's decision", round);
    size_t len = (size_t)snprintf(text, textcap, "ok");
    for (size_t i = 0; i < v->nprev && count < cap; i++)
        if (v->here[i]) {
            len += (size_t)snprintf(text + len, textcap - len, " %d", v->prev[i]);
            count++;
        }
    for (size_t i = 0; i < v->njoin && count < cap; i++) {
        len += (size_t)snprintf(text + len, textcap - len, " %d", v->joiners[i]);
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
    /* Set once: two participants may both lead for a poll (one's hello came between the other's
     * looks, or two reached the deadline together); the first decision stays, and every
     * participant, this one included, goes by the decision it then reads from the store. */
    char key[KEY_MAX];
    snprintf(key, sizeof key, "r%d/decision", round);
    cfx_status st = cx_store_set_once(m->store, key, text, strlen(text));
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

/* The deadline passed and nobody may lead: no member of world round - 1 came, yet some may still
 * come (neither here nor gone), and this process is not one of them (a newcomer, or a member an
 * earlier round left out). It gives up
 * without a decision: a decision now would be a world without the old members (a split job, or
 * its state lost) or a failure that ends a job whose members are only slow to reach their next
 * check. The round stays open for them; the launcher marks this process gone once it exits. */
static cfx_status no_leader(const cx_membership *m, int round, const cfx_reform_options *o,
                            const round_view *v)
{
    char ids[256];
    size_t len = 0, shown = 0;
    ids[0] = '\0';
    for (size_t i = 0; i < v->nprev && len + 24 < sizeof ids; i++)
        if (!v->here[i] && !v->gone[i])
            len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%d", shown++ ? ", " : "",
                                    v->prev[i]);
    if (!shown) /* a member of a world before the last two, say: no round counts it */
        return cx_fail(CFX_ERR_TIMEOUT, "membership round %d: member id %d waited until the "
                       "deadline (%g s), and nobody leads the round: every member of the world "
                       "before is gone, and this process is neither a newcomer (ids above the "
                       "largest known) nor one the last round left out", round, m->id,
                       o->timeout_s);
    return cx_fail(CFX_ERR_TIMEOUT, "membership round %d: member id %d waited until the deadline "
                   "(%g s) for the members of the world before, and none came (id%s %s neither "
                   "came nor %s marked gone); a process that was not in that world does not form "
                   "one without them, so the round stays open for them", round, m->id, o->timeout_s,
                   shown == 1 ? "" : "s", ids, shown == 1 ? "is" : "are");
}

/* Takes part in round `round`: *included = 1 with m's world updated, or 0 when the decision left
 * this process out (it tries the next round). */
static cfx_status take_part(cx_membership *m, int round, const cfx_reform_options *o,
                            double deadline, int *included)
{
    *included = 0;
    round_view v = {0};
    char *text = NULL;
    int *ids = NULL, *older = NULL;
    size_t n = 0, nolder = 0;
    cfx_status st = world_before(m, round, &v.prev, &v.nprev);
    /* World round - 2 (none before round 2): who round - 1 left out. */
    if (!st && round >= 2)
        st = world_before(m, round - 1, &older, &nolder);
    if (!st)
        st = left_out(older, nolder, v.prev, v.nprev, &v.back, &v.nback);
    if (st)
        goto out;
    v.here = calloc(v.nprev ? 2 * v.nprev : 1, sizeof *v.here);
    v.joiners = malloc((v.nback + NEWCOMER_WINDOW) * sizeof *v.joiners);
    if (!v.here || !v.joiners) {
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d", round);
        goto out;
    }
    v.gone = v.here + v.nprev; /* one allocation, freed with here */
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
    v.leader = -1;
    while (!st) {
        if ((st = decision_of(m, round, &text)) || text)
            break;
        /* Look before judging the deadline, so that the message names who leads now. */
        if ((st = look(m, round, first_new, &v)))
            break;
        double now = cx_now_s();
        if (v.me_gone) { /* hello_of leaves it out everywhere: no round would ever include it */
            st = cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "membership round %d: this process (member "
                         "id %d) is marked gone in the store (gone/%d: its launcher reported it "
                         "dead), so no round counts on it; a new process must take its place",
                         round, m->id, m->id);
            break;
        }
        if (v.leader < 0 && now >= deadline) {
            st = no_leader(m, round, o, &v);
            break;
        }
        if (now > deadline + DECISION_GRACE_S) {
            st = cx_fail(CFX_ERR_TIMEOUT, "membership round %d: no decision by the deadline "
                         "(%g s); the round's leader (member id %d) did not decide", round,
                         o->timeout_s, v.leader);
            break;
        }
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
    if (!st)
        st = parse_ids(text, round, &ids, &n);
    for (size_t i = 0; !st && i < n; i++)
        m->max_id = ids[i] > m->max_id ? ids[i] : m->max_id;
    int *back = NULL;
    size_t nback = 0;
    if (!st && index_of(ids, n, m->id) >= 0 &&
        !(st = left_out(v.prev, v.nprev, ids, n, &back, &nback))) {
        *included = 1;
        describe_left(m->left, sizeof m->left, v.prev, v.nprev, ids, n);
        free(m->ids);
        m->ids = ids;
        m->n = n;
        free(m->back);
        m->back = back;
        m->nback = nback;
        m->round = round;
        ids = NULL;
    }
out:
    free(ids);
    free(text);
    free(older);
    free(v.prev);
    free(v.back);
    free(v.here);
    free(v.joiners);
    return st;
}

/* ---- the world's transport ------------------------------------------------------------------ */

/* What a forming world's waits watch: its other members' "gone/<id>" keys. A member the round
 * included can die (or be stopped by the driver, as with a host it blacklisted) before it comes to
 * the world's rendezvous; the others' waits for it end then, not at the rendezvous deadline. */
typedef struct gone_watch {
    cx_store *store; /* the membership's "elastic/" view: it outlives every world's transport */
    int round, self;
    size_t n;
    int ids[]; /* the world's members, in rank order */
} gone_watch;

/* The first of `ids` other than `self` marked gone: *who its id, else -1. */
static cfx_status first_gone(cx_store *store, const int *ids, size_t n, int self, int *who)
{
    *who = -1;
    cfx_status st = CFX_OK;
    for (size_t i = 0; !st && *who < 0 && i < n; i++) {
        int yes = 0;
        if (ids[i] != self && !(st = gone_of(store, ids[i], &yes)) && yes)
            *who = ids[i];
    }
    return st;
}

static cfx_status watch_gone(void *arg)
{
    gone_watch *w = arg;
    int who;
    cfx_status st = first_gone(w->store, w->ids, w->n, w->self, &who);
    if (st || who < 0)
        return st;
    return cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "membership round %d: member id %d was marked gone "
                   "(gone/%d) while its world formed", w->round, who, who);
}

static cfx_status build_transport(cx_membership *m, cx_transport **out)
{
    char space[KEY_MAX];
    snprintf(space, sizeof space, "r%d/world", m->round);
    cx_store *view;
    cfx_status st = cx_store_prefixed(m->store, space, 0, &view);
    if (st)
        return st;
    gone_watch *w = malloc(sizeof *w + m->n * sizeof w->ids[0]);
    if (!w) {
        cx_store_destroy(view);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for round %d's world", m->round);
    }
    *w = (gone_watch){.store = m->store, .round = m->round, .self = m->id, .n = m->n};
    memcpy(w->ids, m->ids, m->n * sizeof w->ids[0]);
    cx_store_prefixed_watch(view, watch_gone, w, free);
    cx_transport_params p = {.rank = index_of(m->ids, m->n, m->id), .size = (int)m->n,
                             .store = view, .timeout_s = m->transport_s,
                             .rendezvous_s = m->rendezvous_s,
                             .pretend_local_size = m->test_local_size};
    return cx_transport_create(m->transport, &p, CFX_ERR_UNSUPPORTED, "membership", out);
}

/* Takes part in rounds from `round` on until one includes this process (m updated). */
static cfx_status join_round(cx_membership *m, int round, const cfx_reform_options *o,
                             double deadline)
{
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
        if ((st = take_part(m, round, o, deadline, &included)) || included)
            return st;
        if (cx_now_s() > deadline)
            return cx_fail(CFX_ERR_MEMBERSHIP_CHANGED, "membership: member id %d was left out of "
                           "every round up to %d before the deadline (%g s; the world is full at "
                           "max_size %d?)", m->id, round, o->timeout_s, o->max_size);
        round++;
    }
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
    double start = cx_now_s();
    for (;;) {
        cfx_status st = join_round(m, m->round + 1, o, cx_now_s() + o->timeout_s);
        if (st)
            return st;
        int rank = index_of(m->ids, m->n, m->id);
        cx_log(log, CX_LOG_INFO, "membership", "round %d: member id %d is rank %d of %zu (%.3f s); "
               "left since the world before: %s", m->round, m->id, rank, m->n,
               cx_now_s() - start, m->left);
        if (!(st = build_transport(m, out)))
            return CFX_OK;
        /* A member that died after the round included it (a driver stopping the workers of a
         * blacklisted host) fails the world's rendezvous for everyone: the next round, which
         * leaves it out, forms the world, with a deadline of its own. Any other failure is the
         * caller's. */
        char why[CX_ERROR_MAX];
        snprintf(why, sizeof why, "%s", cx_error_message());
        int who = -1;
        if (first_gone(m->store, m->ids, m->n, m->id, &who) || who < 0)
            return cx_fail(st, "%s", why);
        cx_log(log, CX_LOG_WARNING, "membership", "round %d: member id %d was marked gone while "
               "the world formed, so the next round forms it without that member (the world's "
               "rendezvous said: %s)", m->round, who, why);
    }
}

cfx_status cx_membership_pending(cx_membership *m, int *count)
{
    *count = 0;
    int first_new = m->max_id + 1;
    cfx_status st = CFX_OK;
    for (size_t i = 0; !st && i < m->nback; i++) { /* members the last round left out */
        int yes = 0;
        if (!(st = hello_of(m, m->round + 1, m->back[i], &yes)))
            *count += yes;
    }
    for (int id = first_new; !st && id < first_new + NEWCOMER_WINDOW; id++) {
        int yes = 0;
        if (!(st = hello_of(m, m->round + 1, id, &yes)))
            *count += yes;
    }
    return st;
}
