/*
 * store_tcp_wire - the TCP store's protocol, shared by its server (store_tcp_server.c) and its
 * client (store_tcp.c): the greeting, the limits, and length-prefixed byte I/O.
 *
 * Protocol (integers are 32-bit big-endian): on connect the server sends the 10-byte greeting
 * "CFXSTORE1\n" (a client that reads anything else has reached some other program) and its
 * generation (0: any; else the world it serves, see store.h). Requests:
 * 'S' klen key vlen value -> 1 byte (1); 'C' klen key -> 1 byte (1 set, 0 not); 'G' klen key -> 1
 * byte (set or not), then vlen value when set; 'O' klen key vlen value -> 1 byte (1 set now, 0 it
 * was set already and stays as it was: the first value wins). 'S' overwrites (a heartbeat counts
 * up under one key); a client waits by polling 'C'.
 */
#ifndef CFX_STORE_TCP_WIRE_H
#define CFX_STORE_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define CX_STORE_GREETING "CFXSTORE1\n"
#define CX_STORE_GREETING_LEN 10
#define CX_STORE_KEY_LIMIT 4096u
#define CX_STORE_VALUE_LIMIT (256u << 20)
/* The key under which a server on a derived port holds its job's token (store.h: port_span). */
#define CX_STORE_JOB_KEY "cfx/job-token"

/* Whole reads and writes on a socket (EINTR retried; a write never raises SIGPIPE): 0, or -1 when
 * the peer closed, the socket's timeout passed or it failed. */
int cx_wire_read(int fd, void *buf, size_t len);
int cx_wire_write(int fd, const void *buf, size_t len);

void cx_wire_put_u32(unsigned char *p, uint32_t v);
uint32_t cx_wire_get_u32(const unsigned char *p);

/* A length-prefixed string of at most `limit` bytes, read into a malloc'ed NUL-terminated buffer. */
int cx_wire_read_blob(int fd, uint32_t limit, char **out, uint32_t *len);

#endif /* CFX_STORE_TCP_WIRE_H */
