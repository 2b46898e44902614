/*
 * shm_layer - the host shared-memory path as a layer over a transport.
 *
 * The engine's shared-memory segment (shm.h) is not any one transport's: it serves every
 * transport whose capabilities ask for it (cx_transport_caps.prefers_host_shm) or that CFX_SHM=1
 * forces. At context creation cx_shm_layer_setup decides, collectively, whether this job takes the
 * path (one host: the segment carries the data and the per-cycle agreement; several hosts with
 * equal rank counts and a cross_allreduce: the two-level path), maps the segment and wraps the
 * transport in a layer that forwards every call to it but the control plane's AND-allreduce, which
 * it answers through the segment when every rank shares this host. The engine then calls the
 * layer like any transport, the way NCCL's shared-memory transport sits in its transport table.
 *
 * The layer owns the segment and the wrapped transport (destroy frees both) and holds the path's
 * settings once: the collective engine asks it (cx_shm_layer_path) where the host path is.
 */
#ifndef CFX_SHM_LAYER_H
#define CFX_SHM_LAYER_H

#include <stdbool.h>

#include "base/config.h"
#include "base/log.h"
#include "exec/shm.h"
#include "transport/transport.h"

/* Where allreduces may go through host shared memory. */
typedef struct cx_host_path {
    cx_shm *shm;       /* the segment, or NULL: the transport carries every allreduce */
    bool hierarchical; /* shm reduces within the host, the transport's cross_allreduce across */
} cx_host_path;

/* Chooses the allreduce data path from cfg's CFX_SHM and CFX_HIERARCHICAL_ALLREDUCE (agreed) and
 * the transport's capabilities: shared memory on one host, shared memory + the transport across
 * hosts, or the transport alone. Collective over *t's ranks; every decision is taken from values
 * all ranks share, so all make the same calls. On success *t is either left as it is or replaced
 * by a layer that owns it. No usable /dev/shm is not an error: a warning, and the transport alone. */
cfx_status cx_shm_layer_setup(cx_transport **t, const cx_config *cfg, const cx_logger *log);

/* The host path under t: {NULL, false} unless t is a layer made by cx_shm_layer_setup. */
cx_host_path cx_shm_layer_path(const cx_transport *t);

#endif /* CFX_SHM_LAYER_H */
