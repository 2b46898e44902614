package org.conflux;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.CharBuffer;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.nio.LongBuffer;
import java.nio.ShortBuffer;

/**
 * One tensor handed to a collective: a Java array (staged in native memory, copied back on
 * completion) or a direct buffer (used in place from its position to its limit).
 */
final class Operand {
    final Object target;   // the user's array or buffer; kept reachable until completion
    final DType dtype;
    final long count;      // elements
    final long bytes;
    long address;          // native address of the data
    final boolean staged;  // address is malloc'd by cfxj_stage and owned by the handle

    private Operand(Object target, DType dtype, long count, long address, boolean staged) {
        this.target = target;
        this.dtype = dtype;
        this.count = count;
        this.bytes = count * dtype.size;
        this.address = address;
        this.staged = staged;
    }

    /** Describes `data`; `byteType` is the dtype of a ByteBuffer (null: UINT8). */
    static Operand of(Object data, DType byteType, boolean writable) {
        if (data == null) {
            throw new IllegalArgumentException("Conflux: data is null");
        }
        DType t = arrayType(data);
        if (t != null) {
            if (byteType != null && byteType != t) {
                throw new IllegalArgumentException("Conflux: a " + data.getClass().getSimpleName()
                        + " holds " + t + ", not " + byteType);
            }
            return new Operand(data, t, java.lang.reflect.Array.getLength(data), 0, true);
        }
        if (!(data instanceof Buffer)) {
            throw new IllegalArgumentException("Conflux: unsupported data type " + data.getClass().getName()
                    + " (use float[], double[], int[], long[] or a direct java.nio buffer)");
        }
        Buffer b = (Buffer) data;
        if (!b.isDirect()) {
            throw new IllegalArgumentException("Conflux: heap buffers are not supported (zero-copy needs a "
                    + "direct buffer: ByteBuffer.allocateDirect(n).order(ByteOrder.nativeOrder()))");
        }
        if (writable && b.isReadOnly()) {
            throw new IllegalArgumentException("Conflux: the buffer is read-only but the collective writes it");
        }
        DType bt = bufferType(b, byteType);
        int elem = b instanceof ByteBuffer ? 1 : bt.size;
        long remainingBytes = (long) b.remaining() * elem;
        if (remainingBytes % bt.size != 0) {
            throw new IllegalArgumentException("Conflux: " + remainingBytes + " bytes are not a whole number of "
                    + bt + " elements");
        }
        long base = ConfluxNative.cfxj_buffer_address(b);
        if (base == 0 && b.capacity() > 0) {
            throw new IllegalArgumentException("Conflux: cannot get the address of the direct buffer");
        }
        return new Operand(b, bt, remainingBytes / bt.size, base + (long) b.position() * elem, false);
    }

    static DType arrayType(Object data) {
        if (data instanceof float[]) {
            return DType.FLOAT32;
        } else if (data instanceof double[]) {
            return DType.FLOAT64;
        } else if (data instanceof int[]) {
            return DType.INT32;
        } else if (data instanceof long[]) {
            return DType.INT64;
        } else if (data instanceof short[]) {
            return DType.INT16;
        } else if (data instanceof byte[]) {
            return DType.INT8;
        }
        return null;
    }

    private static DType bufferType(Buffer b, DType byteType) {
        if (b instanceof ByteBuffer) {
            return byteType != null ? byteType : DType.UINT8;
        }
        ByteOrder order;
        DType t;
        if (b instanceof FloatBuffer) {
            order = ((FloatBuffer) b).order();
            t = DType.FLOAT32;
        } else if (b instanceof DoubleBuffer) {
            order = ((DoubleBuffer) b).order();
            t = DType.FLOAT64;
        } else if (b instanceof IntBuffer) {
            order = ((IntBuffer) b).order();
            t = DType.INT32;
        } else if (b instanceof LongBuffer) {
            order = ((LongBuffer) b).order();
            t = DType.INT64;
        } else if (b instanceof ShortBuffer) {
            order = ((ShortBuffer) b).order();
            t = byteType == DType.FLOAT16 || byteType == DType.BFLOAT16 || byteType == DType.UINT16
                    ? byteType : DType.INT16;
        } else if (b instanceof CharBuffer) {
            order = ((CharBuffer) b).order();
            t = DType.UINT16;
        } else {
            throw new IllegalArgumentException("Conflux: unsupported buffer type " + b.getClass().getName());
        }
        if (order != ByteOrder.nativeOrder()) {
            throw new IllegalArgumentException("Conflux: the buffer's byte order is " + order
                    + "; view a ByteBuffer with .order(ByteOrder.nativeOrder()) first");
        }
        if (byteType != null && byteType != t) {
            throw new IllegalArgumentException("Conflux: a " + b.getClass().getSimpleName() + " holds " + t
                    + ", not " + byteType);
        }
        return t;
    }

    /** Copies an array into native memory (no-op for buffers). */
    void stage() {
        if (staged) {
            address = ConfluxNative.cfxj_stage(target, bytes);
            if (address == 0) {
                throw new OutOfMemoryError("Conflux: cannot stage " + bytes + " bytes");
            }
        }
    }

    /** Frees the staging memory (idempotent). */
    void free() {
        if (staged && address != 0) {
            ConfluxNative.cfxj_free(address);
            address = 0;
        }
    }

    /** A new array or direct buffer like `target`, of `n` elements. */
    Object newLike(long n) {
        if (n > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("Conflux: result of " + n + " elements does not fit a Java array");
        }
        int len = (int) n;
        if (staged) {
            return java.lang.reflect.Array.newInstance(target.getClass().getComponentType(), len);
        }
        ByteBuffer bb = ByteBuffer.allocateDirect((int) (n * dtype.size)).order(ByteOrder.nativeOrder());
        if (target instanceof FloatBuffer) {
            return bb.asFloatBuffer();
        } else if (target instanceof DoubleBuffer) {
            return bb.asDoubleBuffer();
        } else if (target instanceof IntBuffer) {
            return bb.asIntBuffer();
        } else if (target instanceof LongBuffer) {
            return bb.asLongBuffer();
        } else if (target instanceof ShortBuffer) {
            return bb.asShortBuffer();
        } else if (target instanceof CharBuffer) {
            return bb.asCharBuffer();
        }
        return bb;
    }
}
