/* ArrayCall: a compiled program called on NumPy arrays on host memory
 * (hologram.runtime.launch.CompiledProgram.__call__).
 *
 * A call passes either every parameter or the inputs alone (the outputs are then made
 * fresh and returned). Each argument must be exactly a numpy.ndarray of its parameter's
 * dtype and size, C-contiguous, writable where the program writes it: checked through
 * the buffer protocol, whose format string (NumPy's, for this platform) and byte length
 * say dtype and size, and whose flags say contiguity and writability. A call that passes
 * the checks launches here (Launcher) on the arrays' addresses; any other call returns
 * NotImplemented, and CompiledProgram runs its general path, which says what is wrong
 * (or accepts what it may: ndarray subclasses). The Python path this replaces cost ~2 us
 * a call before the kernel: the checks, a ctypes address per array, the fresh outputs and
 * the launch tuple.
 */
#include "native_internal.h"

enum { KIND_IN = 0, KIND_OUT = 1, KIND_INOUT = 2 };

typedef struct {
    PyObject *format; /* bytes: the buffer format of the parameter's storage dtype */
    Py_ssize_t nbytes;
    int kind;
    PyObject *make; /* KIND_OUT: a callable making a fresh output (else NULL) */
} Param;

typedef struct {
    PyObject_HEAD
    Launcher *launcher;
    PyObject *ndarray; /* numpy.ndarray: arguments must be exactly of this type */
    Param *params;
    Py_ssize_t nparams, ngiven, noutputs;
} ArrayCall;

static void arraycall_clear_params(ArrayCall *c)
{
    for (Py_ssize_t i = 0; i < c->nparams; i++) {
        Py_XDECREF(c->params[i].format);
        Py_XDECREF(c->params[i].make);
    }
    PyMem_Free(c->params);
    c->params = NULL;
    c->nparams = 0;
}

static PyObject *arraycall_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *launcher, *ndarray, *specs;
    if (!PyArg_ParseTuple(args, "O!O!O!", &LauncherType, &launcher, &PyType_Type, &ndarray,
                          &PyTuple_Type, &specs))
        return NULL;
    ArrayCall *c = (ArrayCall *)type->tp_alloc(type, 0);
    if (c == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(specs);
    c->params = PyMem_Calloc(n > 0 ? n : 1, sizeof(Param));
    if (c->params == NULL) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    c->nparams = n;
    Py_INCREF(launcher);
    c->launcher = (Launcher *)launcher;
    Py_INCREF(ndarray);
    c->ndarray = ndarray;
    for (Py_ssize_t i = 0; i < n; i++) {
        Param *p = &c->params[i];
        PyObject *format, *make;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(specs, i), "O!niO", &PyBytes_Type, &format,
                              &p->nbytes, &p->kind, &make)) {
            Py_DECREF(c);
            return NULL;
        }
        if (p->kind < KIND_IN || p->kind > KIND_INOUT || (p->kind == KIND_OUT) != (make != Py_None)) {
            PyErr_SetString(PyExc_ValueError,
                            "ArrayCall: a spec is (format, nbytes, kind 0/1/2, make or None), "
                            "make given for outputs (kind 1) alone");
            Py_DECREF(c);
            return NULL;
        }
        Py_INCREF(format);
        p->format = format;
        if (make != Py_None) {
            Py_INCREF(make);
            p->make = make;
        }
        c->ngiven += p->kind != KIND_OUT;
        c->noutputs += p->kind != KIND_IN;
    }
    return (PyObject *)c;
}

static void arraycall_dealloc(ArrayCall *c)
{
    arraycall_clear_params(c);
    Py_XDECREF(c->launcher);
    Py_XDECREF(c->ndarray);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* Is `a` an argument `p` takes (see the top of the file)? Sets *address when it is. Never
 * leaves an error set: a refusal sends the call to the general path. */
static int accepts(ArrayCall *c, const Param *p, PyObject *a, void **address)
{
    if (Py_TYPE(a) != (PyTypeObject *)c->ndarray)
        return 0;
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (p->kind != KIND_IN ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(a, &view, flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *want = PyBytes_AS_STRING(p->format);
    int ok = view.len == p->nbytes && view.format != NULL && strcmp(view.format, want) == 0;
    /* The array, which the call holds, keeps the memory: the view is not needed. */
    *address = view.buf;
    PyBuffer_Release(&view);
    return ok;
}

static PyObject *arraycall_call(ArrayCall *c, PyObject *args, PyObject *kw)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    int fresh = n == c->ngiven && n != c->nparams;
    if ((kw != NULL && PyDict_GET_SIZE(kw)) || !(fresh || n == c->nparams))
        Py_RETURN_NOTIMPLEMENTED;
    void *addresses[c->nparams + 1];
    PyObject *arrays[c->nparams + 1]; /* borrowed from args, or new (fresh outputs) */
    Py_ssize_t given = 0;
    for (Py_ssize_t i = 0; i < c->nparams; i++) {
        arrays[i] = NULL;
        if (fresh && c->params[i].kind == KIND_OUT)
            continue;
        arrays[i] = PyTuple_GET_ITEM(args, given++);
        if (!accepts(c, &c->params[i], arrays[i], &addresses[i]))
            Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = NULL;
    Py_ssize_t made = 0; /* fresh outputs made: arrays[i] owned for those i */
    if (fresh) {
        for (Py_ssize_t i = 0; i < c->nparams; i++) {
            if (c->params[i].kind != KIND_OUT)
                continue;
            arrays[i] = PyObject_CallNoArgs(c->params[i].make);
            if (arrays[i] == NULL)
                goto done;
            made++;
            if (!accepts(c, &c->params[i], arrays[i], &addresses[i])) {
                PyErr_SetString(PyExc_SystemError,
                                "ArrayCall: a fresh output does not fit its parameter");
                goto done;
            }
        }
    }
    if (launcher_run(c->launcher, addresses, c->nparams, NULL) < 0)
        goto done;
    if (c->noutputs == 1) {
        for (Py_ssize_t i = 0; i < c->nparams; i++)
            if (c->params[i].kind != KIND_IN)
                result = Py_NewRef(arrays[i]);
    } else {
        result = PyTuple_New(c->noutputs);
        if (result == NULL)
            goto done;
        Py_ssize_t k = 0;
        for (Py_ssize_t i = 0; i < c->nparams; i++)
            if (c->params[i].kind != KIND_IN)
                PyTuple_SET_ITEM(result, k++, Py_NewRef(arrays[i]));
    }
done:
    if (fresh) {
        for (Py_ssize_t i = 0; i < c->nparams && made > 0; i++) {
            if (c->params[i].kind == KIND_OUT && arrays[i] != NULL) {
                Py_DECREF(arrays[i]);
                made--;
            }
        }
    }
    return result;
}

PyTypeObject ArrayCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.ArrayCall",
    .tp_doc = "ArrayCall(launcher, numpy.ndarray, specs): a compiled program called on NumPy "
              "arrays (all parameters, or the inputs alone: fresh outputs returned); "
              "NotImplemented for a call it does not take. specs: per parameter (buffer "
              "format bytes, nbytes, kind 0 in / 1 out / 2 inout, make: a callable making a "
              "fresh output for kind 1, else None).",
    .tp_basicsize = sizeof(ArrayCall),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = arraycall_new,
    .tp_dealloc = (destructor)arraycall_dealloc,
    .tp_call = (ternaryfunc)arraycall_call,
};
