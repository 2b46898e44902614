/* fuzz_stubs - what the transport registry and the launch reader name but the fuzz targets never
 * reach: they parse (config, wire, handshake) and never open a transport or a store. Each stub
 * aborts, so a fuzz input that did reach one would be found, not silently pass. */
#include <stdlib.h>

#include "rendezvous/store.h"
#include "transport/transport_local.h"

void cx_store_destroy(cx_store *s)
{
    (void)s;
    abort();
}

cfx_status cx_transport_local_open(const cx_transport_params *p, cx_transport **out)
{
    (void)p;
    (void)out;
    abort();
}
