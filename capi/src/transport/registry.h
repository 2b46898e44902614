/*
 * registry - the transports this build knows, one entry each (registry.c: one line per transport):
 * its kind (cfx_transport_kind, options.transport), its name (CFX_TRANSPORT=<name>, messages, the
 * handshake's feature names), its cfx_feature bit (cfx_features), its create function (the
 * contract is in transport.h), how its ranks meet, and what else it can do (elastic membership,
 * host grouping). Configuration (the name or kind asked for), world selection (engine/world.c),
 * elastic membership (engine/membership.c), the handshake's feature names, cfx_features and,
 * through them, the bindings read this table; none of them names a transport.
 *
 * Order matters once: where AUTO must pick a transport that meets in a given way, it takes the
 * first entry that does.
 */
#ifndef CFX_TRANSPORT_REGISTRY_H
#define CFX_TRANSPORT_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "base/launch_env.h"
#include "transport/transport.h"

/* How a transport's ranks find each other (cx_transport_entry.meets). */
typedef enum cx_transport_meets {
    /* In the world a launcher made (mpirun): the transport finds rank and size itself; chosen by
     * AUTO where that launcher (cx_transport_entry.launcher) started the process. */
    CX_MEETS_LAUNCH = 1,
    /* Through a rendezvous store (rendezvous/store.h), rank and size given: chosen by AUTO where
     * another launcher started a world of more than one rank, and for a handed-in store
     * (cfx_init_with_store), a group (cfx_init_group) and, when elastic, a membership round. */
    CX_MEETS_STORE = 2,
    /* Within one process: a process on its own is a world of one (no launcher at all). */
    CX_MEETS_IN_PROCESS = 3
} cx_transport_meets;

/* Capabilities of an entry beyond how it meets (cx_transport_entry.caps). */
enum {
    /* Membership rounds (engine/membership.h) can form its world again from the survivors and
     * newcomers: cfx_elastic_init and cfx_context_reform accept it (needs CX_MEETS_STORE). */
    CX_ENTRY_ELASTIC = 1u << 0,
    /* Its ranks may span hosts: local_* / cross_* come from cx_host_groups (transport/hosts.h),
     * and pretend hosts (CFX_TEST_LOCAL_SIZE) reach its create function. */
    CX_ENTRY_HOST_GROUPS = 1u << 1,
};

typedef struct cx_transport_entry {
    int kind;                        /* cfx_transport_kind (options.transport) */
    const char *name;                /* CFX_TRANSPORT=<name>, lower case */
    uint32_t feature;                /* its cfx_feature bit */
    cx_transport_create_fn *create;  /* transport.h's contract */
    cx_transport_meets meets;
    uint32_t caps;                   /* CX_ENTRY_* */
    cx_launcher launcher;            /* CX_MEETS_LAUNCH: the launcher whose world it joins */
    int built;                       /* 0: known, but this build has none (create fails) */
} cx_transport_entry;

/* The entries, in registry order; *n of them. */
const cx_transport_entry *cx_transport_entries(size_t *n);

/* The entry of a kind or of a name (case-insensitive); NULL when none. */
const cx_transport_entry *cx_transport_by_kind(int kind);
const cx_transport_entry *cx_transport_by_name(const char *name);

/* The first entry, built or not, that meets `how`; NULL when none. */
const cx_transport_entry *cx_transport_first_meeting(cx_transport_meets how);

/* The entry the configuration asks for (CFX_TRANSPORT's name, or options.transport, which wins):
 * NULL for auto. CFX_ERR_CONFIG naming the value and the transports there are when no entry has
 * that name or kind. */
cfx_status cx_transport_asked(const cx_config *cfg, const cx_transport_entry **out);

/* "auto, mpi, gloo or local": the values CFX_TRANSPORT takes, for messages. */
void cx_transport_names(char *buf, size_t cap);

/* The cfx_feature bits of the transports this build has. */
uint32_t cx_transport_features(void);

/* The name of a transport's feature bit; NULL for a bit no entry has. */
const char *cx_transport_feature_name(uint32_t bit);

/* e's create function with p; a transport this build lacks fails with `missing` (CFX_ERR_CONFIG
 * or CFX_ERR_UNSUPPORTED, as the caller's case needs) naming it and how to build it; p->store is
 * destroyed whenever this fails. */
cfx_status cx_transport_create(const cx_transport_entry *e, const cx_transport_params *p,
                               cfx_status missing, const char *who, cx_transport **out);

#endif /* CFX_TRANSPORT_REGISTRY_H */
