/* The C functions hologram._native lends to other native code, such as the torch
 * device's front kernels (hologram_torch/csrc/ops.cpp): the capsule
 * hologram._native.C_API ("hologram._native.C_API") points at one HologramNativeAPI.
 * Both functions are called with the GIL held. */
#ifndef HOLOGRAM_NATIVE_API_H
#define HOLOGRAM_NATIVE_API_H

#include <Python.h>
#include <stdint.h>

#define HOLOGRAM_NATIVE_API_VERSION 1

typedef struct {
    int version; /* HOLOGRAM_NATIVE_API_VERSION */
    /* A Lease of nbytes > 0 from `pool` (a PoolCore), its block's address in *data; NULL
     * with no exception set when the pool refuses (its limit), with one on errors. */
    PyObject *(*alloc)(PyObject *pool, int64_t nbytes, void **data);
    /* Call `launcher` (a Launcher) on n buffer addresses, as launcher((addresses...))
     * does: 0, or -1 with an exception set. */
    int (*launch)(PyObject *launcher, void *const *addresses, Py_ssize_t n);
} HologramNativeAPI;

#endif
