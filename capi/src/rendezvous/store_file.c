/*
 * store_file - the file store: one file per key in a directory every rank sees (a shared file
 * system across hosts, or /tmp on one). A value is written to a private temporary name and renamed
 * into place, so a reader sees a key whole or not at all; set_once links it into place instead,
 * which fails when the key exists (atomic on local and NFS file systems alike).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "rendezvous/store.h"

typedef struct file_store {
    cx_store base;
    char dir[1024];
} file_store;

#define PATH_LEN 4096

/* Keys hold '/' (prefixes): every byte outside [A-Za-z0-9._-] is written as %XX. */
static cfx_status key_path(file_store *f, const char *key, char *out)
{
    size_t n = (size_t)snprintf(out, PATH_LEN, "%s/", f->dir);
    for (const unsigned char *k = (const unsigned char *)key; *k && n + 4 < PATH_LEN; k++) {
        if ((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') ||
            *k == '.' || *k == '_' || *k == '-')
            out[n++] = (char)*k;
        else
            n += (size_t)snprintf(out + n, PATH_LEN - n, "%%%02X", *k);
    }
    if (n + 4 >= PATH_LEN)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "rendezvous: key \"%s\" is too long for the %s",
                       key, f->base.where);
    out[n] = '\0';
    return CFX_OK;
}

static cfx_status write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return CFX_ERR_TRANSPORT;
        p += w;
        len -= (size_t)w;
    }
    return CFX_OK;
}

/* Writes the value under a private temporary name, then puts it in place: renamed over the key
 * (set), or linked to it unless the key exists (set_once: the first value stays). */
static cfx_status file_put(cx_store *s, const char *key, const void *data, size_t len, int once)
{
    file_store *f = (file_store *)s;
    char path[PATH_LEN], tmp[PATH_LEN + 64];
    cfx_status st = key_path(f, key, path);
    if (st)
        return st;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return cx_fail(CFX_ERR_TRANSPORT, "rendezvous: cannot write key \"%s\" in the %s: %s", key,
                       s->where, strerror(errno));
    st = write_all(fd, data, len);
    int placed = close(fd) == 0 && !st &&
                 (once ? link(tmp, path) == 0 || errno == EEXIST : rename(tmp, path) == 0);
    int e = errno;
    if (!placed || once)
        unlink(tmp);
    if (!placed)
        return cx_fail(CFX_ERR_TRANSPORT, "rendezvous: cannot write key \"%s\" in the %s: %s", key,
                       s->where, strerror(e));
    return CFX_OK;
}

static cfx_status file_set(cx_store *s, const char *key, const void *data, size_t len)
{
    return file_put(s, key, data, len, 0);
}

static cfx_status file_set_once(cx_store *s, const char *key, const void *data, size_t len)
{
    return file_put(s, key, data, len, 1);
}

static cfx_status file_check(cx_store *s, const char *key, int *present)
{
    char path[PATH_LEN];
    cfx_status st = key_path((file_store *)s, key, path);
    if (!st)
        *present = access(path, F_OK) == 0;
    return st;
}

static cfx_status file_get(cx_store *s, const char *key, void **data, size_t *len)
{
    char path[PATH_LEN];
    cfx_status st = key_path((file_store *)s, key, path);
    if (st)
        return st;
    FILE *fp = fopen(path, "rb");
    struct stat sb;
    if (!fp || fstat(fileno(fp), &sb) != 0) {
        int e = errno;
        if (fp)
            fclose(fp);
        return cx_fail(CFX_ERR_TRANSPORT, "rendezvous: cannot read key \"%s\" in the %s: %s", key,
                       s->where, strerror(e));
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, fp) != n) {
        free(buf);
        fclose(fp);
        return cx_fail(buf ? CFX_ERR_TRANSPORT : CFX_ERR_OUT_OF_MEMORY, "rendezvous: cannot read "
                       "key \"%s\" (%zu bytes) in the %s", key, n, s->where);
    }
    fclose(fp);
    *data = buf;
    *len = n;
    return CFX_OK;
}

static void file_destroy(cx_store *s) { free(s); }

static const cx_store_ops file_ops = {"file store", file_set, file_check, file_get, NULL, NULL,
                                      file_destroy, file_set_once};

cfx_status cx_store_file_create(const char *dir, cx_store **out)
{
    file_store *f = calloc(1, sizeof *f);
    if (!f)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for the file store");
    if (strlen(dir) >= sizeof f->dir) {
        free(f);
        return cx_fail(CFX_ERR_CONFIG, "rendezvous: the file store's directory \"%s\" is too long",
                       dir);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        free(f);
        return cx_fail(CFX_ERR_CONFIG, "rendezvous: cannot create the file store's directory \"%s\" "
                       "(CFX_RENDEZVOUS_DIR): %s", dir, strerror(e));
    }
    f->base.ops = &file_ops;
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    snprintf(f->base.where, sizeof f->base.where, "file store in %s", dir);
    *out = &f->base;
    return CFX_OK;
}
