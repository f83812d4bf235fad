/* Registry: an executor's buffers (weak references, pruned as they die) and whether the
 * executor is closed. Part of hologram._native (native.c).
 */
#include "native_internal.h"

static PyObject *registry_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *pool = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &pool))
        return NULL;
    if (pool != Py_None && !PyObject_TypeCheck(pool, &PoolCoreType)) {
        PyErr_SetString(PyExc_TypeError, "Registry(pool): a PoolCore or None");
        return NULL;
    }
    Registry *r = (Registry *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->refs = PyList_New(0);
    if (r->refs == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    r->prune_at = 64;
    if (pool != Py_None) {
        Py_INCREF(pool);
        r->pool = (PoolCore *)pool;
    }
    return (PyObject *)r;
}

static void registry_dealloc(Registry *r)
{
    Py_XDECREF(r->refs);
    Py_XDECREF(r->pool);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

int registry_add(Registry *r, PyObject *obj)
{
    PyObject *ref = PyWeakref_NewRef(obj, NULL);
    if (ref == NULL)
        return -1;
    int err = PyList_Append(r->refs, ref);
    Py_DECREF(ref);
    if (err < 0)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(r->refs);
    if (n >= r->prune_at) { /* drop dead references: amortized O(1) per add */
        Py_ssize_t keep = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyList_GET_ITEM(r->refs, i);
            if (PyWeakref_GET_OBJECT(item) != Py_None) {
                Py_INCREF(item);
                PyList_SetItem(r->refs, keep++, item);
            }
        }
        if (PyList_SetSlice(r->refs, keep, n, NULL) < 0)
            return -1;
        r->prune_at = 2 * keep > 64 ? 2 * keep : 64;
    }
    return 0;
}

static PyObject *registry_add_py(Registry *r, PyObject *obj)
{
    if (registry_add(r, obj) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *registry_live(Registry *r, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(r->refs); i++) {
        PyObject *obj = PyWeakref_GET_OBJECT(PyList_GET_ITEM(r->refs, i));
        if (obj != Py_None && PyList_Append(out, obj) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *registry_close(Registry *r, PyObject *unused)
{
    r->closed = 1;
    Py_RETURN_NONE;
}

static PyMethodDef registry_methods[] = {
    {"add", (PyCFunction)registry_add_py, METH_O, "track a buffer (weakly)"},
    {"live", (PyCFunction)registry_live, METH_NOARGS, "the buffers still alive, as a list"},
    {"close", (PyCFunction)registry_close, METH_NOARGS,
     "mark the executor closed: fast paths stop serving it"},
    {NULL},
};

PyTypeObject RegistryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.Registry",
    .tp_doc = "Registry(pool_core=None): an executor's buffers, held weakly.",
    .tp_basicsize = sizeof(Registry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = registry_new,
    .tp_dealloc = (destructor)registry_dealloc,
    .tp_methods = registry_methods,
};
