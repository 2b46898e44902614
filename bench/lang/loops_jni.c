/* loops_jni.c - bench/lang's C loops for Java (bench-only): the natives that Overhead.java and
 * GradientStep.java declare, loaded with System.load from the path in -Dconflux.bench.jni. Each
 * returns the status (0 = ok) and fills the arrays with times in microseconds. */
#include <jni.h>
#include <stdlib.h>

#include "loops.h"

JNIEXPORT jint JNICALL Java_Overhead_cLoop(JNIEnv *env, jclass cls, jlong ctx, jdoubleArray out);
JNIEXPORT jint JNICALL Java_Overhead_cLoop(JNIEnv *env, jclass cls, jlong ctx, jdoubleArray out)
{
    (void)cls;
    jsize n = (*env)->GetArrayLength(env, out);
    double *t = malloc(((size_t)n + 1) * sizeof *t);
    if (!t) return (jint)CFX_ERR_OUT_OF_MEMORY;
    int st = cfx_bench_allreduce_loop((void *)(intptr_t)ctx, n, t);
    (*env)->SetDoubleArrayRegion(env, out, 0, n, t);
    free(t);
    return st;
}

JNIEXPORT jint JNICALL Java_GradientStep_cStep(JNIEnv *env, jclass cls, jlong set, jint count,
                                               jdoubleArray out, jdoubleArray ready);
JNIEXPORT jint JNICALL Java_GradientStep_cStep(JNIEnv *env, jclass cls, jlong set, jint count,
                                               jdoubleArray out, jdoubleArray ready)
{
    (void)cls;
    jsize n = (*env)->GetArrayLength(env, out);
    if ((*env)->GetArrayLength(env, ready) != n) return (jint)CFX_ERR_INVALID_ARGUMENT;
    double *t = malloc(((size_t)n * 2 + 1) * sizeof *t);
    if (!t) return (jint)CFX_ERR_OUT_OF_MEMORY;
    int st = cfx_bench_gradset_loop((void *)(intptr_t)set, count, n, t, t + n);
    (*env)->SetDoubleArrayRegion(env, out, 0, n, t);
    (*env)->SetDoubleArrayRegion(env, ready, 0, n, t + n);
    free(t);
    return st;
}
