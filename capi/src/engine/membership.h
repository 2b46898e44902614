/*
 * membership - elastic worlds: the rounds in which a context's world is formed again from the
 * processes still alive (and newcomers), between a minimum and a maximum size, within a deadline,
 * without restarting the survivors. Owns the round protocol over the rendezvous store
 * (rendezvous/store.h) and the member ids; engine/context.c tears down and rebuilds the context's
 * internals around it (cx_context_reform), and docs/elastic.md describes it for users.
 *
 * Protocol (keys under "elastic/"; the store must outlive every worker: one served by cfxrun
 * --elastic, or a file store):
 * - Every process has a member id (CFX_ELASTIC_ID, default its launcher rank), unique in the job;
 *   the processes of the first world have ids 0..size-1, newcomers larger ids in the order they
 *   were started (the driver numbers them).
 * - Round N >= 1 forms world N. A participant writes "r<N>/hello/<id>" and waits for
 *   "r<N>/decision". The round's leader is the first member of world N-1 (by its rank there) that
 *   said hello and is not known gone ("gone/<id>", written by the driver when it sees a process
 *   exit or stops one; a member marked gone is left out even when it said hello). It decides
 *   once every member of world N-1 said hello or is known gone, or the settle time passed: the
 *   new world is the survivors in their old order, then newcomers (found by looking at ids past
 *   the largest known, NEWCOMER_WINDOW of them), at most max_size. Fewer than min_size after the
 *   deadline: the decision is a failure naming who is missing.
 * - A newcomer leads (the first by id) only once every member of world N-1 is known gone; until
 *   then newcomers wait for them (they come at their next check), and at its deadline a newcomer
 *   gives up without deciding (CFX_ERR_TIMEOUT). A participant known gone fails at once.
 * - The decision is set once (cx_store_set_once): of two participants that both lead for a poll,
 *   the first decision stays, and everyone goes by the one the store holds.
 * - A participant a decision leaves out (a newcomer past the maximum, a survivor that came too
 *   late) takes part in round N+1. A newcomer joins the first round without a decision. Round N
 *   counts the members of world N-2 that world N-1 left out (they are no newcomers: their ids are
 *   below the window) after the survivors, as newcomers are, and so does cx_membership_pending.
 * - World N's transport meets under "r<N>/world/" in the same store (any transport whose registry
 *   entry is elastic: it meets through a store).
 */
#ifndef CFX_MEMBERSHIP_H
#define CFX_MEMBERSHIP_H

#include "base/config.h"
#include "base/log.h"
#include "conflux/conflux.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

typedef struct cx_membership cx_membership;

/* Opens the membership of this process from the launch read at init (cfg->launch): the store
 * (CFX_RENDEZVOUS_DIR, or CFX_RENDEZVOUS_ADDR served by the launcher: CFX_RENDEZVOUS_EXTERNAL=1,
 * reached within cfg->rendezvous_timeout_s) and the member id; and the transport its worlds are
 * made of: the one asked for, or the registry's first elastic entry (CX_ENTRY_ELASTIC; an entry
 * without it is CFX_ERR_INVALID_ARGUMENT). CFX_ERR_CONFIG naming what is missing. */
cfx_status cx_membership_open(const cx_config *cfg, cx_membership **out);

/* Takes part in membership rounds from `first_round` on until one includes this process; builds
 * the new world's transport. `why` (may be NULL) is logged with who left. Collective over the
 * participants. CFX_ERR_MEMBERSHIP_CHANGED naming the missing members when fewer than the minimum
 * came before the deadline; CFX_ERR_TIMEOUT when no decision came. */
cfx_status cx_membership_form(cx_membership *m, const cfx_reform_options *o, const cx_logger *log,
                              cx_transport **out);

/* The round of the world last formed (0 before any). */
int cx_membership_round(const cx_membership *m);

/* This process's member id. */
int cx_membership_id(const cx_membership *m);

/* How many newcomers said hello to the next round (store look-ups; local). */
cfx_status cx_membership_pending(cx_membership *m, int *count);

/* The member ids that were in the previous world and are not in the current one, as text
 * ("ids 3, 4 (ranks 2, 3 before)"; "none"). */
const char *cx_membership_left(const cx_membership *m);

void cx_membership_close(cx_membership *m);

#endif /* CFX_MEMBERSHIP_H */
