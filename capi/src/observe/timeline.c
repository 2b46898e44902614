/* timeline - Chrome trace-event JSON, recorded off the hot path (see timeline.h). */
#include "observe/timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/strmap.h"

#define FLUSH_PERIOD_S 0.1
#define WAKE_BYTES (1u << 20)           /* wake the writer early once this much is queued */
#define QUEUE_LIMIT ((size_t)64 << 20)  /* a writer that cannot keep up: drop beyond this */
#define MAX_LANES 100000                /* distinct tensor names with their own lane */
#define CAP_RESERVE 512                 /* room kept under the cap for the final note */

enum { K_LANE, K_PHASE, K_MARK, K_CYCLE };

/* One queued event; `len` bytes of text (a name or label) follow it. */
typedef struct rec {
    uint8_t kind, phase;
    int32_t tid, rank;
    uint32_t len;
    double t0, t1;
    int64_t bytes, fused;
} rec;

typedef struct lane {
    int32_t tid;
    double negotiate_start; /* < 0: not seen since the timeline started */
} lane;

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

struct cx_timeline {
    int fd, rank;
    bool mark_cycles;
    int64_t max_bytes;
    const cx_logger *log;
    char path[1024];
    /* Background thread only. */
    cx_strmap lanes;
    int32_t next_tid;
    lane overflow;
    /* Shared with the writer. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    buf front;          /* filled by the engine */
    bool stop;
    atomic_int full;    /* the size cap was reached: record nothing more */
    uint64_t dropped;   /* events dropped because the writer fell behind */
    /* Writer only. */
    pthread_t writer;
    buf back, text;
    int64_t written;
    bool first_event;
};

static const char *const phase_cat[CX_TL_NPHASES] = {"queued", "negotiate", "pack", "collective",
                                                     "unpack"};

double cx_timeline_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cx_timeline_rank_path(const char *path, int rank, char *out, size_t size)
{
    const char *mark = strstr(path, "%r");
    if (mark) {
        snprintf(out, size, "%.*s%d%s", (int)(mark - path), path, rank, mark + 2);
        return;
    }
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(path, '.');
    if (dot && (!slash || dot > slash + 1))
        snprintf(out, size, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
    else
        snprintf(out, size, "%s.rank%d", path, rank);
}

static bool buf_append(buf *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return true;
}

/* ---- writer side: records -> JSON lines ---------------------------------------------------- */

static void put_text(buf *t, const char *s, size_t n)
{
    buf_append(t, s, n);
}

static void put_fmt(buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_fmt(buf *t, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put_text(t, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal (control characters escaped; other bytes as they are). */
static void put_json_string(buf *t, const char *s, size_t n)
{
    put_text(t, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put_text(t, s + run, i - run);
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            put_text(t, esc, 2);
        } else {
            put_fmt(t, "\\u%04x", c);
        }
        run = i + 1;
    }
    put_text(t, s + run, n - run);
    put_text(t, "\"", 1);
}

/* Numbers without printf: formatting runs for every event, doubles through snprintf are slow. */
static void put_u64(buf *t, uint64_t v)
{
    char tmp[24];
    int i = (int)sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put_text(t, tmp + i, sizeof tmp - (size_t)i);
}

static void put_i64(buf *t, int64_t v)
{
    if (v < 0) {
        put_text(t, "-", 1);
        v = -v;
    }
    put_u64(t, (uint64_t)v);
}

/* Seconds as microseconds with 3 decimals (nanosecond resolution). */
static void put_us(buf *t, double seconds)
{
    uint64_t ns = seconds > 0 ? (uint64_t)(seconds * 1e9 + 0.5) : 0;
    put_u64(t, ns / 1000);
    char frac[4] = {'.', (char)('0' + ns % 1000 / 100), (char)('0' + ns % 100 / 10),
                    (char)('0' + ns % 10)};
    put_text(t, frac, 4);
}

#define PUT_LIT(t, lit) put_text((t), (lit), sizeof(lit) - 1)

/* The common prefix of an event on a lane: name, cat, ph, pid, tid, ts. */
static void put_head(buf *t, const char *name, size_t len, const char *cat, const char *ph, int pid,
                     int32_t tid, double ts)
{
    PUT_LIT(t, "{\"name\":");
    put_json_string(t, name, len);
    PUT_LIT(t, ",\"cat\":\"");
    put_text(t, cat, strlen(cat));
    PUT_LIT(t, "\",\"ph\":\"");
    put_text(t, ph, strlen(ph));
    PUT_LIT(t, "\",\"pid\":");
    put_i64(t, pid);
    PUT_LIT(t, ",\"tid\":");
    put_i64(t, tid);
    PUT_LIT(t, ",\"ts\":");
    put_us(t, ts);
}

static void format_rec(cx_timeline *tl, buf *t, const rec *r, const char *s)
{
    int pid = tl->rank;
    switch (r->kind) {
    case K_LANE:
        put_fmt(t, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
                pid, r->tid);
        put_json_string(t, s, r->len);
        put_fmt(t, "}}");
        put_fmt(t, "\n,{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"sort_index\":%d}}", pid, r->tid, r->tid);
        break;
    case K_PHASE:
        put_head(t, s, r->len, phase_cat[r->phase], "X", pid, r->tid, r->t0);
        PUT_LIT(t, ",\"dur\":");
        put_us(t, r->t1 - r->t0);
        if (r->bytes >= 0) {
            PUT_LIT(t, ",\"args\":{\"bytes\":");
            put_i64(t, r->bytes);
            PUT_LIT(t, ",\"fused\":");
            put_i64(t, r->fused);
            PUT_LIT(t, "}");
        }
        PUT_LIT(t, "}");
        break;
    case K_MARK:
        put_head(t, s, r->len, r->rank >= 0 ? "ready" : "mark", "i", pid, r->tid, r->t0);
        PUT_LIT(t, ",\"s\":\"t\"");
        if (r->rank >= 0) {
            PUT_LIT(t, ",\"args\":{\"rank\":");
            put_i64(t, r->rank);
            PUT_LIT(t, "}");
        }
        PUT_LIT(t, "}");
        break;
    case K_CYCLE:
        put_head(t, "CYCLE", 5, "cycle", "X", pid, 0, r->t0);
        PUT_LIT(t, ",\"dur\":");
        put_us(t, r->t1 - r->t0);
        PUT_LIT(t, ",\"args\":{\"cycle\":");
        put_i64(t, r->bytes);
        PUT_LIT(t, "}}");
        break;
    }
}

static void write_all(cx_timeline *tl, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(tl->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
        tl->written += w;
    }
}

/* Formats the records of tl->back and writes them, one line each, within the size cap. */
static void write_back(cx_timeline *tl)
{
    size_t off = 0;
    buf *t = &tl->text;
    t->len = 0;
    while (off + sizeof(rec) <= tl->back.len && !atomic_load(&tl->full)) {
        rec r;
        memcpy(&r, tl->back.p + off, sizeof r);
        const char *s = tl->back.p + off + sizeof r;
        off += sizeof r + r.len;
        size_t start = t->len;
        if (!tl->first_event)
            put_text(t, ",", 1);
        format_rec(tl, t, &r, s);
        put_text(t, "\n", 1);
        tl->first_event = false;
        if (tl->max_bytes > 0 && tl->written + (int64_t)t->len + CAP_RESERVE > tl->max_bytes) {
            t->len = start; /* this line does not fit: end with the note instead */
            put_fmt(t, ",{\"name\":\"timeline size cap reached; later events dropped\","
                    "\"cat\":\"mark\",\"ph\":\"i\",\"s\":\"g\",\"pid\":%d,\"tid\":0,\"ts\":%.3f}\n",
                    tl->rank, r.t0 * 1e6);
            atomic_store(&tl->full, 1);
            cx_log(tl->log, CX_LOG_WARNING, "timeline", "%s reached the size cap of %lld bytes "
                   "(CFX_TIMELINE_MAX_MB); later events are dropped", tl->path,
                   (long long)tl->max_bytes);
        }
    }
    write_all(tl, t->p, t->len);
    tl->back.len = 0;
}

static void *writer_main(void *arg)
{
    cx_timeline *tl = arg;
    pthread_mutex_lock(&tl->mu);
    for (;;) {
        if (!tl->stop && tl->front.len < WAKE_BYTES) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)(FLUSH_PERIOD_S * 1e9);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&tl->cv, &tl->mu, &ts);
        }
        buf tmp = tl->back;
        tl->back = tl->front;
        tl->front = tmp;
        bool stop = tl->stop;
        pthread_mutex_unlock(&tl->mu);
        if (tl->back.len)
            write_back(tl);
        if (stop)
            return NULL;
        pthread_mutex_lock(&tl->mu);
    }
}

/* ---- engine side ----------------------------------------------------------------------------- */

static void record(cx_timeline *tl, const rec *r, const char *s)
{
    if (atomic_load_explicit(&tl->full, memory_order_relaxed))
        return;
    pthread_mutex_lock(&tl->mu);
    if (tl->front.len > QUEUE_LIMIT) {
        tl->dropped++;
    } else {
        size_t old = tl->front.len;
        if (!buf_append(&tl->front, r, sizeof *r) || !buf_append(&tl->front, s, r->len)) {
            tl->front.len = old;
            tl->dropped++;
        }
        if (tl->front.len >= WAKE_BYTES && old < WAKE_BYTES)
            pthread_cond_signal(&tl->cv);
    }
    pthread_mutex_unlock(&tl->mu);
}

static void record_lane_name(cx_timeline *tl, int32_t tid, const char *name)
{
    rec r = {.kind = K_LANE, .tid = tid, .len = (uint32_t)strlen(name)};
    record(tl, &r, name);
}

/* The lane of a tensor, created (and named in the file) on first sight. */
static lane *lane_of(cx_timeline *tl, const char *name)
{
    lane *l = cx_strmap_get(&tl->lanes, name);
    if (l)
        return l;
    if (tl->next_tid > MAX_LANES)
        return &tl->overflow;
    if (!(l = malloc(sizeof *l)) || !cx_strmap_put(&tl->lanes, name, l)) {
        free(l);
        return &tl->overflow;
    }
    l->tid = tl->next_tid++;
    l->negotiate_start = -1;
    record_lane_name(tl, l->tid, name);
    return l;
}

/* Creates the missing directories above `path` (several ranks may race: EEXIST is fine). */
static cfx_status make_parents(const char *path)
{
    char dir[sizeof ((cx_timeline *)0)->path];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        struct stat sb;
        if (mkdir(dir, 0777) != 0 && (errno != EEXIST || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
            int err = errno == EEXIST ? ENOTDIR : errno;
            return cx_fail(CFX_ERR_CONFIG, "timeline \"%s\": cannot create directory \"%s\": %s",
                           path, dir, strerror(err));
        }
        *p = '/';
    }
    return CFX_OK;
}

int cx_timeline_create(const char *path, int rank, int64_t max_bytes, bool mark_cycles,
                       const cx_logger *log, cx_timeline **out)
{
    cfx_status st = make_parents(path);
    if (st)
        return st;
    cx_timeline *tl = calloc(1, sizeof *tl);
    if (!tl)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the timeline");
    tl->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (tl->fd < 0) {
        int err = errno;
        free(tl);
        return cx_fail(CFX_ERR_CONFIG, "timeline \"%s\": cannot open for writing: %s", path,
                       strerror(err));
    }
    snprintf(tl->path, sizeof tl->path, "%s", path);
    tl->rank = rank;
    tl->max_bytes = max_bytes;
    tl->mark_cycles = mark_cycles;
    tl->log = log;
    tl->next_tid = 1;
    tl->overflow.tid = MAX_LANES + 1;
    tl->overflow.negotiate_start = -1;
    tl->first_event = false; /* the header below is the first element */
    cx_strmap_init(&tl->lanes);
    pthread_mutex_init(&tl->mu, NULL);
    pthread_cond_init(&tl->cv, NULL);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}\n"
                     ",{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}\n"
                     ",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"cycles\"}}\n"
                     ",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"(more tensors)\"}}\n",
                     rank, rank, rank, rank, rank, rank, MAX_LANES + 1);
    write_all(tl, head, (size_t)n);
    if (pthread_create(&tl->writer, NULL, writer_main, tl) != 0) {
        close(tl->fd);
        pthread_mutex_destroy(&tl->mu);
        pthread_cond_destroy(&tl->cv);
        cx_strmap_destroy(&tl->lanes);
        free(tl);
        return cx_fail(CFX_ERR_INTERNAL, "timeline: cannot start the writer thread");
    }
    cx_log(log, CX_LOG_INFO, "timeline", "writing %s (cap %lld bytes, cycle marks %s)", path,
           (long long)max_bytes, mark_cycles ? "on" : "off");
    *out = tl;
    return CFX_OK;
}

void cx_timeline_destroy(cx_timeline *tl)
{
    if (!tl)
        return;
    pthread_mutex_lock(&tl->mu);
    tl->stop = true;
    pthread_cond_signal(&tl->cv);
    pthread_mutex_unlock(&tl->mu);
    pthread_join(tl->writer, NULL);
    write_all(tl, "]\n", 2);
    close(tl->fd);
    if (tl->dropped)
        cx_log(tl->log, CX_LOG_WARNING, "timeline", "%s: %llu events dropped (the writer fell "
               "behind or memory ran out)", tl->path, (unsigned long long)tl->dropped);
    const char *key;
    void *value;
    for (size_t pos = 0; cx_strmap_next(&tl->lanes, &pos, &key, &value);)
        free(value);
    cx_strmap_destroy(&tl->lanes);
    pthread_mutex_destroy(&tl->mu);
    pthread_cond_destroy(&tl->cv);
    free(tl->front.p);
    free(tl->back.p);
    free(tl->text.p);
    free(tl);
}

const char *cx_timeline_coll_label(int coll)
{
    static const char *const labels[] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                                         "REDUCESCATTER", "BARRIER", "JOIN"};
    return coll >= 0 && coll < (int)(sizeof labels / sizeof labels[0]) ? labels[coll] : "COLLECTIVE";
}

bool cx_timeline_marks_cycles(const cx_timeline *tl) { return tl && tl->mark_cycles; }

void cx_timeline_seen(cx_timeline *tl, const char *name, double enqueued, double now)
{
    lane *l = lane_of(tl, name);
    rec r = {.kind = K_PHASE, .phase = CX_TL_QUEUED, .tid = l->tid, .len = 6, .t0 = enqueued,
             .t1 = now, .bytes = -1};
    record(tl, &r, "QUEUED");
    l->negotiate_start = now;
}

void cx_timeline_negotiated(cx_timeline *tl, const char *name, double now)
{
    lane *l = lane_of(tl, name);
    if (l->negotiate_start < 0)
        return; /* submitted before the timeline started */
    rec r = {.kind = K_PHASE, .phase = CX_TL_NEGOTIATE, .tid = l->tid, .len = 9,
             .t0 = l->negotiate_start, .t1 = now, .bytes = -1};
    record(tl, &r, "NEGOTIATE");
    l->negotiate_start = -1;
}

void cx_timeline_phase(cx_timeline *tl, const char *name, cx_tl_phase phase, const char *label,
                       double t0, double t1, int64_t bytes, int64_t fused)
{
    lane *l = lane_of(tl, name);
    rec r = {.kind = K_PHASE, .phase = (uint8_t)phase, .tid = l->tid,
             .len = (uint32_t)strlen(label), .t0 = t0, .t1 = t1, .bytes = bytes, .fused = fused};
    record(tl, &r, label);
}

void cx_timeline_mark(cx_timeline *tl, const char *name, const char *label, int rank, double now)
{
    lane *l = lane_of(tl, name);
    rec r = {.kind = K_MARK, .tid = l->tid, .rank = rank, .len = (uint32_t)strlen(label),
             .t0 = now};
    record(tl, &r, label);
}

void cx_timeline_cycle(cx_timeline *tl, uint64_t cycle, double t0, double t1)
{
    rec r = {.kind = K_CYCLE, .t0 = t0, .t1 = t1, .bytes = (int64_t)cycle};
    record(tl, &r, "");
}
