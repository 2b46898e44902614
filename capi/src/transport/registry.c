/* registry - the transports this build knows, one line each (see registry.h). */
#include "transport/registry.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"

/* A transport this build lacks keeps its line (so that asking for it says how to build it), with
 * a create function that is never called (cx_transport_create checks `built` first). */
#define CX_NOT_BUILT(fn)                                                                          \
    static cfx_status fn(const cx_transport_params *p, cx_transport **out)                       \
    {                                                                                             \
        (void)p;                                                                                  \
        *out = NULL;                                                                              \
        return cx_fail(CFX_ERR_INTERNAL, "a transport this build lacks was created");            \
    }
#if !CFX_HAVE_MPI
CX_NOT_BUILT(cx_transport_mpi_create)
#endif
#if !CFX_HAVE_GLOO
CX_NOT_BUILT(cx_transport_gloo_create)
#endif

/* The registry: one line per transport (docs/architecture.md "Adding a transport").
 *   X(kind, name, cfx_feature bit, create function, how its ranks meet, capabilities,
 *     the launcher whose world it joins (CX_MEETS_LAUNCH), built in this build) */
#define CX_REGISTRY(X)                                                                                                             \
    X(CFX_TRANSPORT_MPI, "mpi", CFX_FEATURE_MPI, cx_transport_mpi_create, CX_MEETS_LAUNCH, CX_ENTRY_HOST_GROUPS, CX_LAUNCHER_OPENMPI, CFX_HAVE_MPI) \
    X(CFX_TRANSPORT_GLOO, "gloo", CFX_FEATURE_GLOO, cx_transport_gloo_create, CX_MEETS_STORE, CX_ENTRY_ELASTIC | CX_ENTRY_HOST_GROUPS, CX_LAUNCHER_NONE, CFX_HAVE_GLOO) \
    X(CFX_TRANSPORT_LOCAL, "local", CFX_FEATURE_LOCAL, cx_transport_local_open, CX_MEETS_IN_PROCESS, 0, CX_LAUNCHER_NONE, 1) \
    /* the next transport: one line above this one */

#define CX_DECLARE(kind, name, feature, create, meets, caps, launcher, built) cx_transport_create_fn create;
#define CX_ENTRY(kind, name, feature, create, meets, caps, launcher, built) \
    {kind, name, feature, create, meets, caps, launcher, built},

CX_REGISTRY(CX_DECLARE)

static const cx_transport_entry registry[] = {CX_REGISTRY(CX_ENTRY)};
#define REGISTRY_SIZE (sizeof registry / sizeof registry[0])

const cx_transport_entry *cx_transport_entries(size_t *n)
{
    *n = REGISTRY_SIZE;
    return registry;
}

const cx_transport_entry *cx_transport_by_kind(int kind)
{
    for (size_t i = 0; i < REGISTRY_SIZE; i++)
        if (registry[i].kind == kind)
            return &registry[i];
    return NULL;
}

const cx_transport_entry *cx_transport_by_name(const char *name)
{
    for (size_t i = 0; i < REGISTRY_SIZE; i++)
        if (!strcasecmp(registry[i].name, name))
            return &registry[i];
    return NULL;
}

const cx_transport_entry *cx_transport_first_meeting(cx_transport_meets how)
{
    for (size_t i = 0; i < REGISTRY_SIZE; i++)
        if (registry[i].meets == how)
            return &registry[i];
    return NULL;
}

void cx_transport_names(char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "auto");
    for (size_t i = 0; i < REGISTRY_SIZE && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s",
                                i + 1 == REGISTRY_SIZE ? " or " : ", ", registry[i].name);
}

cfx_status cx_transport_asked(const cx_config *cfg, const cx_transport_entry **out)
{
    *out = NULL;
    char names[256];
    cx_transport_names(names, sizeof names);
    const cx_transport_entry *named = NULL;
    if (cfg->transport_name[0] && strcasecmp(cfg->transport_name, "auto") &&
        !(named = cx_transport_by_name(cfg->transport_name)))
        return cx_fail(CFX_ERR_CONFIG, "CFX_TRANSPORT=\"%s\": expected %s", cfg->transport_name,
                       names);
    if (!cfg->transport_by_option) {
        *out = named;
        return CFX_OK;
    }
    if (cfg->transport == CFX_TRANSPORT_AUTO)
        return CFX_OK;
    if (!(*out = cx_transport_by_kind(cfg->transport)))
        return cx_fail(CFX_ERR_CONFIG, "cfx_init: options.transport %d is not a "
                       "cfx_transport_kind (the transports: %s)", cfg->transport, names);
    return CFX_OK;
}

uint32_t cx_transport_features(void)
{
    uint32_t f = 0;
    for (size_t i = 0; i < REGISTRY_SIZE; i++)
        if (registry[i].built)
            f |= registry[i].feature;
    return f;
}

const char *cx_transport_feature_name(uint32_t bit)
{
    for (size_t i = 0; i < REGISTRY_SIZE; i++)
        if (registry[i].feature == bit)
            return registry[i].name;
    return NULL;
}

cfx_status cx_transport_create(const cx_transport_entry *e, const cx_transport_params *p,
                               cfx_status missing, const char *who, cx_transport **out)
{
    *out = NULL;
    if (!e->built) {
        if (p->store)
            cx_store_destroy(p->store);
        char upper[32];
        size_t n = strlen(e->name) < sizeof upper - 1 ? strlen(e->name) : sizeof upper - 1;
        for (size_t i = 0; i < n; i++)
            upper[i] = (char)(e->name[i] >= 'a' && e->name[i] <= 'z' ? e->name[i] - 32 : e->name[i]);
        upper[n] = '\0';
        return cx_fail(missing, "%s: this build of Conflux has no %s transport (configure with "
                       "CONFLUX_WITH_%s=ON)", who, e->name, upper);
    }
    cx_transport_params given = *p;
    if (!(e->caps & CX_ENTRY_HOST_GROUPS))
        given.pretend_local_size = 0;
    return e->create(&given, out);
}
