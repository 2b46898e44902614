/* device_plan - the device data path every rank takes (see device_plan.h). */
#include "exec/device_plan.h"

#include <stdio.h>
#include <string.h>

cx_device_path cx_device_plan(const cx_device_info *all, int size, bool deterministic, char *why,
                              size_t why_len)
{
    why[0] = '\0';
    for (int r = 0; r < size; r++)
        if (!all[r].usable) {
            snprintf(why, why_len, "rank %d has no usable CUDA device", r);
            return CX_DEVICE_PATH_STAGED;
        }
    if (deterministic) {
        snprintf(why, why_len, "deterministic mode (CFX_DETERMINISTIC) reduces in rank order on "
                 "the host");
        return CX_DEVICE_PATH_STAGED;
    }
    for (int r = 0; r < size; r++)
        if (!all[r].nccl) {
            snprintf(why, why_len, "rank %d's build has no NCCL", r);
            return CX_DEVICE_PATH_STAGED;
        }
    /* NCCL refuses two ranks of one communicator on one GPU: same machine, same PCI bus id. */
    for (int a = 0; a < size; a++)
        for (int b = a + 1; b < size; b++)
            if (strncmp(all[a].host, all[b].host, sizeof all[a].host) == 0 &&
                strncmp(all[a].bus, all[b].bus, sizeof all[a].bus) == 0) {
                snprintf(why, why_len, "ranks %d and %d share the GPU %.64s (NCCL needs one GPU "
                         "per rank)", a, b, all[a].bus);
                return CX_DEVICE_PATH_STAGED;
            }
    return CX_DEVICE_PATH_NCCL;
}
