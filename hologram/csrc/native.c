/* hologram._native: the host memory pool's core and the SDK ops' allocating fast path.
 * This file is the module (its functions, the C API of native_api.h, initialization); the
 * rest is one file per concern, built into the one extension (setup.py), sharing
 * native_internal.h:
 *
 * - pool.c: PoolCore and Lease;
 * - registry.c: Registry;
 * - launcher.c: Launcher, and how its steps split over the cpu backend's workers;
 * - arrays.c: ArrayCall, a compiled program called on NumPy arrays;
 * - fastop.c: FastOp and its entries.
 *
 * Python pays ~0.1 us per frame, and an op that allocates its result used to walk ~15 of
 * them (pool, lease, array, Buffer, registration, launch): 4-6 us where PyTorch spends
 * 1-2. This module holds the parts of that path that run on every call:
 *
 * - PoolCore: the state of hologram.backends.hostmem.Pool (96 size classes, free lists,
 *   slabs, counters, the memory limit and the trimming rule; the policy is documented
 *   there). Lease: the owner of one block; arrays view it through the buffer protocol and
 *   its deallocation returns the block.
 * - Registry: an executor's buffers (weak references, pruned as they die) and whether the
 *   executor is closed.
 * - FastOp: the callable that an SDK op is. A call whose arguments are exactly the op's
 *   buffers, with a signature the op's general (Python) path has validated and filed here,
 *   allocates the result, launches and returns it in C; every other call runs the general
 *   path unchanged. An entry may carry index ranges (Op.index_ranges): integer operands
 *   whose every element must lie in [0, bound), read before the launch; a call with one
 *   outside runs the general path, which raises the op's error.
 *
 * Thread safety: every function here runs with the GIL held and never calls back into
 * Python while pool state is half-updated, so the GIL is the pool's lock (the GIL-free
 * build of CPython is not supported). Nothing here releases the GIL.
 */
#include "native_internal.h"

static PyObject *size_class_py(PyObject *module, PyObject *arg)
{
    long long nbytes = PyLong_AsLongLong(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "size_class: nbytes must be >= 0");
        return NULL;
    }
    int64_t cbytes;
    int index = size_class(nbytes, &cbytes);
    return Py_BuildValue("(iL)", index, (long long)cbytes);
}

/* The C API (native_api.h). */
static PyObject *api_alloc(PyObject *pool, int64_t nbytes, void **data)
{
    if (!PyObject_TypeCheck(pool, &PoolCoreType) || nbytes <= 0) {
        PyErr_SetString(PyExc_TypeError, "C_API alloc: a PoolCore and nbytes > 0");
        return NULL;
    }
    Lease *lease = new_lease((PoolCore *)pool, nbytes);
    if (lease != NULL)
        *data = lease->block->addr;
    return (PyObject *)lease;
}

static int api_launch(PyObject *launcher, void *const *addresses, Py_ssize_t n)
{
    if (!PyObject_TypeCheck(launcher, &LauncherType)) {
        PyErr_SetString(PyExc_TypeError, "C_API launch: a Launcher");
        return -1;
    }
    return launcher_run((Launcher *)launcher, addresses, n, NULL);
}

static HologramNativeAPI c_api = {HOLOGRAM_NATIVE_API_VERSION, api_alloc, api_launch};

static PyMethodDef module_methods[] = {
    {"set_buffer_type", set_buffer_type, METH_VARARGS,
     "set_buffer_type(Buffer, numpy.ndarray): the types FastOp makes results of"},
    {"set_parallel", set_parallel, METH_VARARGS,
     "set_parallel(native_pieces, environ, key, chunks_per_thread): how launchers split a "
     "kernel over the worker pool (threads.native_pieces, whose answer holds while "
     "environ[key] is the same object; environ None: ask every time)"},
    {"forget_pieces", forget_pieces, METH_NOARGS,
     "forget_pieces(): ask native_pieces again on the next split launch (the thread count "
     "or the pool changed)"},
    {"file_pending", file_pending, METH_VARARGS,
     "file_pending(natives, operand launch keys, shape, dtype, result launch key, nbytes, "
     "launch, scalars='', into_out=False, ranges=()) -> whether the call a FastOp of "
     "natives runs was filed; scalars: per operand '.' (a buffer) or the type character of "
     "a Python number's 0-d value; into_out: the result is the call's out= buffer "
     "(elementwise ops); ranges: (operand, bound) pairs, integer operands whose every "
     "element must lie in [0, bound) for a call to launch here (else the general path "
     "runs it)"},
    {"size_class", size_class_py, METH_O, "size_class(nbytes) -> (index or -1, class bytes)"},
    {"chunk_count", chunk_count_py, METH_VARARGS,
     "chunk_count(total, grain, threads, per_thread=1) -> how many pieces a split launch "
     "makes (hologram.backends.cpu.threads.chunk_count; total >= 0)"},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "hologram._native",
    "The host pool's core and the SDK ops' allocating fast path (see native.c).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
#ifdef _WIN32
    SYSTEM_INFO info;
    GetSystemInfo(&info);
    page_bytes = info.dwPageSize;
#else
    page_bytes = sysconf(_SC_PAGESIZE);
#endif
    slab_bytes = 16 * page_bytes > (64 << 10) ? 16 * page_bytes : (64 << 10);
    num_slab_classes = 0;
    while (num_slab_classes < NUM_CLASSES && class_bytes(num_slab_classes) <= slab_bytes / 4)
        num_slab_classes++;
    str_buffers = PyUnicode_InternFromString("_buffers");
    str_native_plan = PyUnicode_InternFromString("native_plan");
    if (str_buffers == NULL || str_native_plan == NULL)
        return NULL;
    PyTypeObject *types[] = {&PoolCoreType, &LeaseType, &RegistryType, &LauncherType,
                             &ArrayCallType, &EntryType, &FastOpType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "PoolCore", (PyObject *)&PoolCoreType) < 0 ||
        PyModule_AddObjectRef(m, "Lease", (PyObject *)&LeaseType) < 0 ||
        PyModule_AddObjectRef(m, "Registry", (PyObject *)&RegistryType) < 0 ||
        PyModule_AddObjectRef(m, "FastOp", (PyObject *)&FastOpType) < 0 ||
        PyModule_AddObjectRef(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObjectRef(m, "ArrayCall", (PyObject *)&ArrayCallType) < 0 ||
        PyModule_AddIntConstant(m, "NUM_CLASSES", NUM_CLASSES) < 0 ||
        PyModule_AddIntConstant(m, "PAGE_BYTES", (long)page_bytes) < 0 ||
        PyModule_AddIntConstant(m, "SLAB_BYTES", (long)slab_bytes) < 0 ||
        PyModule_AddIntConstant(m, "CACHE_SLACK", (long)CACHE_SLACK) < 0 ||
        PyModule_AddIntConstant(m, "NUM_SLAB_CLASSES", num_slab_classes) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&c_api, "hologram._native.C_API", NULL);
    int added = capsule == NULL ? -1 : PyModule_AddObjectRef(m, "C_API", capsule);
    Py_XDECREF(capsule);
    if (added < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
