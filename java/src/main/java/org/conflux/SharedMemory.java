package org.conflux;

import java.lang.ref.Cleaner;
import java.lang.ref.WeakReference;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.HashMap;
import java.util.Map;

/**
 * The blocks of shared tensor memory (cfx_alloc) handed out as direct buffers by
 * {@link Conflux#allocateShared(long)}: a separate class so that the Cleaner's thread starts only
 * in processes that use them.
 *
 * <p>Every live block is registered by address with a weak reference to the buffer allocateShared
 * returned. freeShared frees a block only for that very buffer: cfx_alloc is first fit, so the
 * next allocation often gets the address of the block just freed, and a second freeShared of a
 * stale buffer would otherwise free the new block (cfx_free cannot tell the two apart).
 *
 * <p>The Cleaner frees a block whose buffer became unreachable. That is safe with collectives in
 * flight because a tensor in flight is always reachable: the Handle keeps its Operand (whose
 * target is the user's buffer, and a view such as asFloatBuffer() or a slice keeps the buffer it
 * came from reachable); pending and detached handles are held by their Conflux, and those close()
 * could not complete are kept for good (Handle.LEAKED). The one gap is a Conflux dropped without
 * close() while collectives are pending, which loses ByteBuffer.allocateDirect memory the same way.
 * The Cleaner is a backstop, not the way to free: the GC sees only the small buffer object, not
 * the memory behind it, so it does not run because the pool fills up.
 *
 * <p>One lock orders the registry with the pool: between a lookup and the cfx_free it leads to, no
 * allocation may take the address.
 */
final class SharedMemory {
    private static final Cleaner CLEANER = Cleaner.create();
    private static final Object LOCK = new Object();
    private static final Map<Long, Block> BLOCKS = new HashMap<>();  // guarded by LOCK

    private SharedMemory() {
    }

    /** One live block; run() frees it, once, from freeShared or the Cleaner's thread. */
    private static final class Block implements Runnable {
        final long address;
        final WeakReference<ByteBuffer> owner;  // weak: the registry must not keep the buffer alive
        final Cleaner.Cleanable cleanable;

        Block(long address, ByteBuffer buffer) {
            this.address = address;
            this.owner = new WeakReference<>(buffer);
            this.cleanable = CLEANER.register(buffer, this);
        }

        @Override
        public void run() {
            synchronized (LOCK) {
                BLOCKS.remove(address, this);
                check(ConfluxNative.cfxj_shared_free(address));  // on the Cleaner's thread: ignored
            }
        }
    }

    static ByteBuffer allocate(long bytes) {
        if (bytes < 0 || bytes > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("Conflux.allocateShared: " + bytes + " bytes is not in 0.."
                    + Integer.MAX_VALUE + " (a ByteBuffer's capacity is an int)");
        }
        synchronized (LOCK) {
            ByteBuffer b = (ByteBuffer) ConfluxNative.cfxj_shared_alloc(bytes);
            if (b == null) {
                throw Conflux.lastError();
            }
            b.order(ByteOrder.nativeOrder());
            long address = ConfluxNative.cfxj_buffer_address(b);
            BLOCKS.put(address, new Block(address, b));
            return b;
        }
    }

    static void free(ByteBuffer buffer) {
        if (buffer == null) {
            return;  // like cfx_free(NULL)
        }
        long address = ConfluxNative.cfxj_buffer_address(buffer);
        if (address == 0) {
            throw new IllegalArgumentException("Conflux.freeShared: a heap buffer is not shared memory "
                    + "from allocateShared");
        }
        synchronized (LOCK) {
            Block b = BLOCKS.get(address);
            if (b == null) {
                // no block of ours starts here: cfx_free refuses it and says why, changing nothing
                check(ConfluxNative.cfxj_shared_free(address));
                return;
            }
            if (b.owner.get() != buffer) {
                throw new IllegalArgumentException("Conflux.freeShared: this buffer is not the one allocateShared "
                        + "returned for this memory (a duplicate or slice of it, or a buffer already freed whose "
                        + "memory was allocated again): free the buffer allocateShared returned");
            }
            b.cleanable.clean();  // runs b.run() here, once, and unregisters it from the Cleaner
        }
    }

    /** Blocks not freed yet (for the tests of the Cleaner). */
    static int liveBlocks() {
        synchronized (LOCK) {
            return BLOCKS.size();
        }
    }

    private static void check(int status) {
        if (status != cfx_status.CFX_OK) {
            throw ConfluxException.of(status, ConfluxNative.cfx_last_error());
        }
    }
}
