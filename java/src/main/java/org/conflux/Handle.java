package org.conflux;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * One submitted collective. Returned at once by the {@code *Async} methods of {@link Conflux}; the
 * collective runs on Conflux's background thread. {@link #await()} (or {@link #result()}) waits and
 * returns the result: the same array or buffer for in-place collectives (allreduce, broadcast), a
 * new one for allgather, alltoall and reducescatter, the last rank for join, null for barrier.
 *
 * <p>The handle keeps the data reachable until the collective completes, so arrays and buffers may
 * not be collected under it. Completion is observed by {@link #isDone()}, {@link #await()} or
 * {@link #await(long, TimeUnit)}; from then on the handle holds only its result and nothing needs
 * freeing. {@link #close()} on a pending handle detaches it: the collective still runs, and the data
 * stays owned by the context until it completes. Thread-safe.
 *
 * @param <T> the result type
 */
public final class Handle<T> implements AutoCloseable {
    enum Kind { ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN }

    /** Data of handles the engine never completed at close (see finishOnClose). */
    private static final List<Operand> LEAKED = Collections.synchronizedList(new ArrayList<>());

    private final Conflux cfx;
    private final Kind kind;
    private final String name;
    private final Operand operand;  // null for barrier and join
    private long id;                // the C handle; 0 once released
    private boolean finished;
    private boolean detached;
    private T result;
    private long[] splits;
    private RuntimeException error;

    Handle(Conflux cfx, Kind kind, String name, Operand operand, long id) {
        this.cfx = cfx;
        this.kind = kind;
        this.name = name;
        this.operand = operand;
        this.id = id;
    }

    /** The tensor name given at submission (null when Conflux generated one). */
    public String name() {
        return name;
    }

    /** True once the collective has completed, successfully or not. Never blocks. */
    public synchronized boolean isDone() {
        if (finished) {
            return true;
        }
        int r = ConfluxNative.cfxj_poll(cfx.ptr(), id);
        if (r < 0) {
            finish(-r);
            return true;
        }
        if (r == 1) {
            finish(ConfluxNative.cfx_handle_status(cfx.ptr(), id));
            return true;
        }
        return false;
    }

    /**
     * Waits without a limit and returns the result.
     *
     * @throws ConfluxException if the collective failed (mismatch, stall, peer lost, shut down, ...)
     */
    public synchronized T await() {
        if (!finished) {
            finish(ConfluxNative.cfx_wait(cfx.ptr(), id, -1.0));
        }
        return get();
    }

    /**
     * Waits at most {@code timeout}. Returns false when the deadline passed first (the collective
     * is still pending), true once it completed successfully.
     *
     * @throws ConfluxException if the collective failed
     */
    public synchronized boolean await(long timeout, TimeUnit unit) {
        if (timeout < 0) {
            throw new IllegalArgumentException("Conflux: negative timeout " + timeout);
        }
        if (!finished) {
            int st = ConfluxNative.cfx_wait(cfx.ptr(), id, unit.toNanos(timeout) / 1e9);
            if (st == cfx_status.CFX_ERR_TIMEOUT) {
                return false;
            }
            finish(st);
        }
        get();
        return true;
    }

    /** The result, waiting for it if needed; same as {@link #await()}. */
    public T result() {
        return await();
    }

    /**
     * Rows each rank contributed (allgather) or this rank received from each rank (alltoall), once
     * complete; null for the other collectives.
     */
    public synchronized long[] splits() {
        await();
        return splits == null ? null : splits.clone();
    }

    /** Detaches a pending handle (the collective still runs); a no-op once complete. */
    @Override
    public synchronized void close() {
        if (!finished && !detached) {
            detached = true;
            cfx.detach(this);
        }
    }

    private T get() {
        if (error != null) {
            // a new exception per call, so that each thrower gets its own stack trace
            RuntimeException e = ConfluxException.of(statusOf(error), error.getMessage());
            e.initCause(error);
            throw e;
        }
        return result;
    }

    private static int statusOf(RuntimeException e) {
        if (e instanceof ConfluxException) {
            return ((ConfluxException) e).status().code;
        }
        return e instanceof IllegalArgumentException ? cfx_status.CFX_ERR_INVALID_ARGUMENT
                : cfx_status.CFX_ERR_STALE_HANDLE;
    }

    /** For the context's sweep of detached handles: true (and released) once complete. */
    synchronized boolean reapIfDone() {
        if (!finished) {
            int r = ConfluxNative.cfxj_poll(cfx.ptr(), id);
            if (r == 0) {
                return false;
            }
            finish(r < 0 ? -r : ConfluxNative.cfx_handle_status(cfx.ptr(), id));
        }
        return true;
    }

    /**
     * Waits for completion during context close (after shutdown every handle completes). Should the
     * engine not complete it, the handle fails after a bounded wait and its staging memory is
     * leaked rather than freed under a collective that might still write it.
     */
    synchronized void finishOnClose(double timeoutSeconds) {
        if (finished) {
            return;
        }
        int st = ConfluxNative.cfx_wait(cfx.ptr(), id, timeoutSeconds);
        if (st == cfx_status.CFX_ERR_TIMEOUT) {
            error = new ShutDownException("Conflux: " + this + " did not complete at close");
            finished = true;
            LEAKED.add(operand);  // its buffer stays reachable (and its staging unfreed) for good
            cfx.forget(this);
            return;
        }
        finish(st);
    }

    /** Collects the outcome of a completed collective, then releases the C handle and staging. */
    @SuppressWarnings("unchecked")
    private void finish(int status) {
        long ctx = cfx.ptr();
        try {
            if (status != cfx_status.CFX_OK) {
                String msg = ConfluxNative.cfx_handle_message(ctx, id);
                error = ConfluxException.of(status, msg == null || msg.isEmpty()
                        ? ConfluxNative.cfx_status_string(status) + (name != null ? " (tensor '" + name + "')" : "")
                        : msg);
                return;
            }
            switch (kind) {
                case ALLREDUCE:
                case BROADCAST:
                    if (operand.staged) {
                        check(ConfluxNative.cfxj_unstage(operand.address, operand.target, operand.bytes));
                    }
                    result = (T) operand.target;
                    break;
                case ALLGATHER:
                case ALLTOALL:
                case REDUCESCATTER:
                    result = (T) output(ctx);
                    if (kind != Kind.REDUCESCATTER) {
                        splits = ConfluxNative.cfxj_splits(ctx, id, 0);
                        if (splits == null) {
                            throw Conflux.lastError();
                        }
                    }
                    break;
                case JOIN:
                    int r = ConfluxNative.cfxj_join_rank(ctx, id);
                    if (r < 0) {
                        throw Conflux.lastError();
                    }
                    result = (T) Integer.valueOf(r);
                    break;
                default:
                    break;
            }
        } catch (RuntimeException e) {
            error = e;
        } finally {
            finished = true;
            ConfluxNative.cfx_handle_release(ctx, id);
            id = 0;
            if (operand != null) {
                operand.free();
            }
            cfx.forget(this);
        }
    }

    private Object output(long ctx) {
        long bytes = ConfluxNative.cfxj_output_bytes(ctx, id, 0);
        if (bytes < 0) {
            throw Conflux.lastError();
        }
        Object out = operand.newLike(bytes / operand.dtype.size);
        if (operand.staged) {
            check(ConfluxNative.cfxj_output_to_array(ctx, id, 0, out, bytes));
        } else {
            check(ConfluxNative.cfxj_output_copy(ctx, id, 0, ConfluxNative.cfxj_buffer_address(out), bytes));
        }
        return out;
    }

    private static void check(int status) {
        if (status != cfx_status.CFX_OK) {
            throw ConfluxException.of(status, ConfluxNative.cfx_last_error());
        }
    }

    @Override
    public String toString() {
        return "Handle[" + kind.name().toLowerCase() + (name != null ? " '" + name + "'" : "")
                + (finished ? (error != null ? ", failed" : ", done") : ", pending") + "]";
    }
}
