package org.conflux;

import java.util.EnumSet;
import java.util.Set;

/** What this build of Conflux supports and this machine offers; see {@link Conflux#features()}. */
public enum Feature {
    /** Built with the MPI transport. */
    MPI(cfx_feature.CFX_FEATURE_MPI),
    /** Built with CUDA kernels. */
    CUDA(cfx_feature.CFX_FEATURE_CUDA),
    /** Built with the NCCL data path. */
    NCCL(cfx_feature.CFX_FEATURE_NCCL),
    /** A CUDA device is usable at run time. */
    CUDA_DEVICE(cfx_feature.CFX_FEATURE_CUDA_DEVICE),
    /** The in-process transport (always built). */
    LOCAL(cfx_feature.CFX_FEATURE_LOCAL);

    final int bit;

    Feature(int bit) {
        this.bit = bit;
    }

    static Set<Feature> fromBits(int bits) {
        Set<Feature> s = EnumSet.noneOf(Feature.class);
        for (Feature f : values()) {
            if ((bits & f.bit) != 0) {
                s.add(f);
            }
        }
        return s;
    }
}
