/*
 * agree - the collective engine's failure agreement (agree.c), and its injection for tests.
 */
#ifndef CFX_EXEC_AGREE_H
#define CFX_EXEC_AGREE_H

#include "exec/exec_state.h"

/* ---- failure agreement ---------------------------------------------------------------------
 * A rank whose local work fails (an allocation, a CUDA call, a staging copy) must neither skip a
 * collective its peers enter (they would wait for it forever, and its next collective would pair
 * with their pending one) nor take part with made-up data (they would finish with a wrong result
 * and CFX_OK). So every data path agrees before the first data-plane call of a batch (READY: no
 * rank enters unless every rank can), and the device paths, whose local work goes on after the
 * collective (copies back, the completion wait), agree once more after it (DONE). Either way
 * every rank completes the batch with the same status. */
typedef enum cx_agree_phase { CX_AGREE_READY = 1, CX_AGREE_DONE = 2 } cx_agree_phase;

/* Collective: every rank calls it at the same point with its own status `local` (its message in
 * cx_error_message()). One AND-allreduce of one bit per rank (plus a flags word); CFX_OK on every
 * rank when every rank was OK. Otherwise the lowest failing rank broadcasts its status and message
 * and every rank returns that status, with a message naming the failing ranks and that reason. No
 * allocation, so out of memory can be agreed too. `flags` (may be NULL): in, this rank's bits
 * (CX_AGREE_FLAG_*); out, their OR over the ranks. `name`: the batch's first tensor (failure
 * injection, CFX_TEST_FAIL). A failure of the agreement's own calls is returned as it is. */
#define CX_AGREE_FLAG_NCCL_LOST 1u /* this rank's NCCL communicator failed (device_exec.c) */
cfx_status cx_exec_agree(cx_exec *x, cfx_status local, cx_agree_phase phase, const char *name,
                         uint32_t *flags);

#endif /* CFX_EXEC_AGREE_H */
