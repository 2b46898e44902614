/*
 * handshake - the first exchange of every context: each rank publishes its library version, its
 * wire protocol version and its build features, and every rank decides from the same table
 * whether the job can talk.
 *
 * Ranks whose wire protocol majors differ (or a rank whose record no one can read) cannot talk:
 * cx_handshake fails on every rank with CFX_ERR_VERSION, naming the ranks and their versions.
 * Ranks that differ only in minor versions, library version or build features go on; rank 0 logs
 * a warning listing them. Called by cx_context_create before any other collective, over the
 * transport's control plane (gather at rank 0, broadcast of the table); the record's layout is
 * frozen (wire.h), so this exchange works between any two versions that have it.
 */
#ifndef CFX_HANDSHAKE_H
#define CFX_HANDSHAKE_H

#include "base/config.h"
#include "base/log.h"
#include "protocol/wire.h"
#include "transport/transport.h"

/* This rank's record: this build, with the wire version CFX_TEST_WIRE_VERSION claims if set. */
void cx_hello_self(const cx_config *cfg, cx_hello *out);

/* The exchange and the verdict. Collective over the transport; size 1 returns at once. */
cfx_status cx_handshake(cx_transport *t, const cx_config *cfg, const cx_logger *log);

/* The verdict on a decoded table of `size` records (the same on every rank). `rank` is this
 * rank; rank 0 writes the log line of a compatible mix. */
cfx_status cx_hello_verdict(const cx_hello *all, int size, int rank, const cx_logger *log);

#endif /* CFX_HANDSHAKE_H */
