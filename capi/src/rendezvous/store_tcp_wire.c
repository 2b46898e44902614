/*
 * store_tcp_wire - byte I/O of the TCP store's protocol (store_tcp_wire.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "rendezvous/store_tcp_wire.h"

int cx_wire_read(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t r = recv(fd, p, len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int cx_wire_write(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

void cx_wire_put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

uint32_t cx_wire_get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

int cx_wire_read_blob(int fd, uint32_t limit, char **out, uint32_t *len)
{
    unsigned char b[4];
    if (cx_wire_read(fd, b, 4))
        return -1;
    *len = cx_wire_get_u32(b);
    if (*len > limit)
        return -1;
    char *buf = malloc((size_t)*len + 1);
    if (!buf || cx_wire_read(fd, buf, *len)) {
        free(buf);
        return -1;
    }
    buf[*len] = '\0';
    *out = buf;
    return 0;
}
