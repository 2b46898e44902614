package org.conflux;

/**
 * How an allreduce's float32 and float64 values travel where bytes are expensive (the C ABI's
 * {@code cfx_compression}, docs/c-api.md "Compression"): each rank's values are rounded once to a
 * 16-bit float when packed, combined in float32, and the result written back in the tensor's dtype,
 * bitwise identical on every rank. {@link #FP16} and {@link #BF16} compress the cross-host leg
 * only; within a host the shared-memory reduction stays exact. The {@code _EVERYWHERE} values
 * compress every leg that goes over the transport (the MPI path on one host too; the shared-memory
 * reduction moves no bytes over a wire and is never compressed). Every rank must give a tensor the
 * same value, else a {@link MismatchException}; other dtypes and {@link ReduceOp#ADASUM} are
 * refused with an {@link IllegalArgumentException} naming the tensor.
 */
public enum Compression {
    /** Values travel as they are (the default). */
    NONE(cfx_compression.CFX_COMPRESSION_NONE),
    /** IEEE binary16 across hosts: 11 significant bits, range +-65504. */
    FP16(cfx_compression.CFX_COMPRESSION_FP16),
    /** bfloat16 across hosts: 8 significant bits, float32's range. */
    BF16(cfx_compression.CFX_COMPRESSION_BF16),
    /** IEEE binary16 on every leg over the transport. */
    FP16_EVERYWHERE(cfx_compression.CFX_COMPRESSION_FP16_EVERYWHERE),
    /** bfloat16 on every leg over the transport. */
    BF16_EVERYWHERE(cfx_compression.CFX_COMPRESSION_BF16_EVERYWHERE);

    final int code;

    Compression(int code) {
        this.code = code;
    }

    /**
     * The compression named {@code name}, any case ("fp16", "BF16_EVERYWHERE"): the names every
     * binding accepts (the C layer's list, bindings/bind.h).
     *
     * @throws IllegalArgumentException for a name that is none of them, listing them
     */
    public static Compression of(String name) {
        NativeLoader.load();
        int code = name == null ? -1 : ConfluxNative.cfxj_compression_code(name);
        for (Compression c : values()) {
            if (c.code == code) {
                return c;
            }
        }
        StringBuilder known = new StringBuilder();
        for (Compression c : values()) {
            known.append(known.length() > 0 ? ", " : "").append(c.name().toLowerCase(java.util.Locale.ROOT));
        }
        throw new IllegalArgumentException("unknown compression '" + name + "'; use one of: " + known);
    }
}
