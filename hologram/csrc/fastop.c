/* FastOp: the callable that an SDK op is. A call whose arguments are exactly the op's
 * buffers, with a signature the op's general (Python) path has validated and filed here
 * (file_pending), allocates the result, launches and returns it in C; every other call
 * runs the general path unchanged. An entry may carry index ranges (Op.index_ranges):
 * integer operands whose every element must lie in [0, bound), read before the launch; a
 * call with one outside runs the general path, which raises the op's error. Results are
 * runtime.Buffer objects, whose slots are found from the type's member descriptors
 * (set_buffer_type), not copied here. Part of hologram._native (native.c).
 */
#include "native_internal.h"

/* Where a Buffer's slots are (read from its member descriptors by set_buffer_type). */
static PyTypeObject *buffer_type;
static Py_ssize_t off_array, off_allocation, off_executor, off_handle, off_launch_key,
    off_signature;
static PyObject *ndarray_type;
PyObject *str_buffers;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* An index operand of an entry: its `count` elements, of NumPy type character `code` (an
 * integer type), must each lie in [0, bound). */
typedef struct {
    int operand;
    char code;
    int64_t count;
    uint64_t bound;
} IndexRange;

/* A validated call: what to allocate and how to launch. */
typedef struct {
    PyObject_HEAD
    PyObject *shape, *dtype, *signature, *launch_key; /* of the result */
    int64_t nbytes;
    Launcher *launch; /* the program's launch(handles) */
    char scalars[MAX_ARITY]; /* per operand: 0 (a buffer) or the NumPy type character of
                              * the 0-d value a Python number is passed as */
    int into_out; /* the result is the call's out= buffer (an elementwise op), not fresh */
    int nranges;
    IndexRange ranges[MAX_ARITY]; /* checked before each launch (see in_range) */
} Entry;

/* Whether every one of `count` integers of type character `code` at `data` lies in
 * [0, bound). Each value v, as an unsigned U (a negative one has its top bit set), is
 * inside iff the top bit of v | ~(v - b) is clear: v below the top bit and below b. U is
 * the width of a signed type, whose values all lie below a bound past its largest (so b
 * stops there), and 64 bits for an unsigned one. Bitwise and without an early exit: the
 * loop vectorizes with SSE2 (which has no 64-bit comparison), in the type's own width. */
#define ALL_BELOW(T, U)                                                    \
    do {                                                                   \
        const T *x = data;                                                 \
        const U top = (U)1 << (sizeof(U) * 8 - 1);                         \
        const U b = bound < (uint64_t)top ? (U)bound : top;                \
        U outside = 0;                                                     \
        for (int64_t k = 0; k < count; k++) {                              \
            U v = (U)x[k];                                                 \
            outside |= v | ~(v - b);                                       \
        }                                                                  \
        return (outside & top) == 0;                                       \
    } while (0)

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize"))) /* -O2's cost model leaves it scalar */
#endif
static int all_below(const void *data, char code, int64_t count, uint64_t bound)
{
    switch (code) {
    case 'b': ALL_BELOW(signed char, uint8_t);
    case 'h': ALL_BELOW(short, uint16_t);
    case 'i': ALL_BELOW(int, uint32_t);
    case 'l': ALL_BELOW(long, unsigned long);
    case 'q': ALL_BELOW(long long, unsigned long long);
    case 'B': ALL_BELOW(unsigned char, uint64_t);
    case 'H': ALL_BELOW(unsigned short, uint64_t);
    case 'I': ALL_BELOW(unsigned int, uint64_t);
    case 'L': ALL_BELOW(unsigned long, uint64_t);
    case 'Q': ALL_BELOW(unsigned long long, uint64_t);
    default: return 0; /* not filed (see file_pending) */
    }
}

/* Whether the call's index operands (at `addresses`) lie in the entry's ranges. */
static int in_range(Entry *e, void *const *addresses)
{
    for (int r = 0; r < e->nranges; r++) {
        IndexRange *g = &e->ranges[r];
        if (!all_below(addresses[g->operand], g->code, g->count, g->bound))
            return 0;
    }
    return 1;
}

static void entry_dealloc(Entry *e)
{
    Py_XDECREF(e->shape);
    Py_XDECREF(e->dtype);
    Py_XDECREF(e->signature);
    Py_XDECREF(e->launch_key);
    Py_XDECREF(e->launch);
    PyObject_Free(e);
}

PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)entry_dealloc,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *general; /* the op's Python function: every call the fast path does not serve */
    PyObject *entries; /* call key (see call_key) -> Entry */
    PyObject *dict;
    Py_ssize_t arity;
} FastOp;

static PyObject *fastop_vectorcall(FastOp *f, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames);

static PyObject *fastop_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *general;
    Py_ssize_t arity;
    if (!PyArg_ParseTuple(args, "On", &general, &arity))
        return NULL;
    if (arity < 0 || arity > MAX_ARITY) {
        PyErr_Format(PyExc_ValueError, "FastOp: arity must be 0 (any) to %d", MAX_ARITY);
        return NULL;
    }
    FastOp *f = (FastOp *)type->tp_alloc(type, 0);
    if (f == NULL)
        return NULL;
    f->vectorcall = (vectorcallfunc)fastop_vectorcall;
    f->entries = PyDict_New();
    f->dict = PyDict_New();
    if (f->entries == NULL || f->dict == NULL) {
        Py_DECREF(f);
        return NULL;
    }
    Py_INCREF(general);
    f->general = general;
    f->arity = arity;
    return (PyObject *)f;
}

static int fastop_traverse(FastOp *f, visitproc visit, void *arg)
{
    Py_VISIT(f->general);
    Py_VISIT(f->entries);
    Py_VISIT(f->dict);
    return 0;
}

static int fastop_clear(FastOp *f)
{
    Py_CLEAR(f->general);
    Py_CLEAR(f->entries);
    Py_CLEAR(f->dict);
    return 0;
}

static void fastop_dealloc(FastOp *f)
{
    PyObject_GC_UnTrack(f);
    fastop_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *general_call(FastOp *f, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    return PyObject_Vectorcall(f->general, args, nargsf, kwnames);
}

/* The call that the general path is running for a FastOp on this thread (see
 * file_pending): the op and its call key, or NULL. Per thread: the general path may
 * release the GIL (compiling, say), and another thread's call must never be filed with
 * this one's result. */
#ifdef _MSC_VER
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif
static THREAD_LOCAL FastOp *pending_op;
static THREAD_LOCAL PyObject *pending_key;
static THREAD_LOCAL Py_ssize_t pending_nargs; /* its operands (the key's first items) */

/* The general path, told which call it runs so that it can file it. */
static PyObject *general_pending(FastOp *f, PyObject *key, PyObject *const *args,
                                 size_t nargsf, PyObject *kwnames)
{
    FastOp *outer_op = pending_op;
    PyObject *outer_key = pending_key; /* nested calls restore it */
    Py_ssize_t outer_nargs = pending_nargs;
    pending_op = f;
    pending_key = key; /* owned by the caller for the call's duration */
    pending_nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result = general_call(f, args, nargsf, kwnames);
    pending_op = outer_op;
    pending_key = outer_key;
    pending_nargs = outer_nargs;
    return result;
}

/* A call's key: the operands' launch keys, then, for keywords, their names and each
 * value with its type (so that 1 and True, or 1 and 1.0, never share an entry); a
 * buffer (out=) by its launch key. NULL without an exception: not a call this path
 * serves. */
static PyObject *call_key(FastOp *f, PyObject *const *args, Py_ssize_t n, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if ((f->arity ? n != f->arity : n < 1 || n > MAX_ARITY) || buffer_type == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTypeObject *type = Py_TYPE(args[i]);
        /* A freed buffer's launch key is None: it matches no entry. A Python number is a
         * runtime value: its type is in the key, its value is not. */
        if (type == buffer_type ? SLOT(args[i], off_launch_key) == NULL
                                : type != &PyFloat_Type && type != &PyLong_Type &&
                                      type != &PyBool_Type)
            return NULL;
    }
    PyObject *key = PyTuple_New(n + (nkw ? 1 + 2 * nkw : 0));
    if (key == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = Py_TYPE(args[i]) == buffer_type ? SLOT(args[i], off_launch_key)
                                                         : (PyObject *)Py_TYPE(args[i]);
        Py_INCREF(item);
        PyTuple_SET_ITEM(key, i, item);
    }
    if (nkw) {
        Py_INCREF(kwnames);
        PyTuple_SET_ITEM(key, n, kwnames);
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *value = args[n + j];
            if (Py_TYPE(value) == buffer_type) {
                value = SLOT(value, off_launch_key);
                if (value == NULL) { /* freed: the general path says so */
                    Py_DECREF(key);
                    return NULL;
                }
            }
            Py_INCREF(Py_TYPE(args[n + j]));
            PyTuple_SET_ITEM(key, n + 1 + 2 * j, (PyObject *)Py_TYPE(args[n + j]));
            Py_INCREF(value);
            PyTuple_SET_ITEM(key, n + 2 + 2 * j, value);
        }
    }
    return key;
}

/* A Python number as a 0-d value of NumPy type character `code`, as np.array(value,
 * dtype) makes it; 0 where this does not say (values NumPy would refuse or round twice,
 * types not handled here): the general path decides those. */
typedef union {
    double f64;
    float f32;
    int64_t i64;
    int32_t i32;
    int16_t i16;
    int8_t i8;
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
} Scalar;

static int to_scalar(PyObject *value, char code, Scalar *out)
{
    if (code == 'd' || code == 'f') {
        if (Py_TYPE(value) != &PyFloat_Type) {
            /* An int past 2**53 would round twice on its way to float32. */
            long long i = PyLong_AsLongLong(value);
            if ((i == -1 && PyErr_Occurred()) || i > (1LL << 53) || i < -(1LL << 53)) {
                PyErr_Clear();
                return 0;
            }
        }
        double v = PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (code == 'd')
            out->f64 = v;
        else
            out->f32 = (float)v;
        return 1;
    }
    if (code == '?') {
        out->u8 = (uint8_t)PyObject_IsTrue(value);
        return 1;
    }
    if (Py_TYPE(value) == &PyFloat_Type)
        return 0; /* float into an integer dtype: NumPy's rules, in the general path */
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    switch (code) {
    case 'b': if (v < INT8_MIN || v > INT8_MAX) return 0; out->i8 = (int8_t)v; return 1;
    case 'h': if (v < INT16_MIN || v > INT16_MAX) return 0; out->i16 = (int16_t)v; return 1;
    case 'i': if (v < INT32_MIN || v > INT32_MAX) return 0; out->i32 = (int32_t)v; return 1;
    case 'l': case 'q': out->i64 = v; return 1;
    case 'B': if (v < 0 || v > UINT8_MAX) return 0; out->u8 = (uint8_t)v; return 1;
    case 'H': if (v < 0 || v > UINT16_MAX) return 0; out->u16 = (uint16_t)v; return 1;
    case 'I': if (v < 0 || v > UINT32_MAX) return 0; out->u32 = (uint32_t)v; return 1;
    case 'L': case 'Q': if (v < 0) return 0; out->u64 = (uint64_t)v; return 1;
    default: return 0;
    }
}

/* The executor's buffer registry while the executor is open (a new reference), else NULL
 * without an exception: the general path then says what is wrong. */
static Registry *open_registry(PyObject *executor)
{
    Registry *reg = (Registry *)PyObject_GetAttr(executor, str_buffers);
    if (reg == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (Py_TYPE(reg) != &RegistryType || reg->closed) {
        Py_DECREF(reg);
        return NULL;
    }
    return reg;
}

/* An elementwise op into its out= buffer (the one keyword of an into_out entry), which
 * the call returns. Writing in place is right where out is an operand element for element
 * (the same address and launch key) or shares no allocation with it (allocations never
 * partially overlap); any other sharing, or another executor's out, goes to the general
 * path, which stages or refuses it. */
static PyObject *launch_into_out(FastOp *f, Entry *e, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames, PyObject *executor, void **addresses)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *out = args[n];
    if (Py_TYPE(out) != buffer_type || SLOT(out, off_executor) != executor)
        return general_call(f, args, nargsf, kwnames);
    PyObject *allocation = SLOT(out, off_allocation), *handle = SLOT(out, off_handle);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (e->scalars[i] || SLOT(args[i], off_allocation) != allocation)
            continue;
        int same = PyObject_RichCompareBool(SLOT(args[i], off_handle), handle, Py_EQ);
        if (same < 0)
            return NULL;
        if (!same || SLOT(args[i], off_launch_key) != SLOT(out, off_launch_key))
            return general_call(f, args, nargsf, kwnames);
    }
    Registry *reg = open_registry(executor);
    if (reg == NULL)
        return general_call(f, args, nargsf, kwnames);
    Py_DECREF(reg);
    if (!as_address(handle, &addresses[n]))
        return NULL;
    Py_INCREF(e); /* launching may run Python, which may drop the entry */
    int err = launcher_run(e->launch, addresses, n + 1, NULL);
    Py_DECREF(e);
    if (err < 0)
        return NULL;
    Py_INCREF(out);
    return out;
}

static PyObject *fastop_vectorcall(FastOp *f, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *key = call_key(f, args, n, kwnames);
    if (key == NULL)
        return PyErr_Occurred() ? NULL : general_call(f, args, nargsf, kwnames);
    Entry *e = (Entry *)PyDict_GetItemWithError(f->entries, key);
    if (e == NULL) {
        PyObject *result = NULL;
        if (!PyErr_Occurred())
            result = general_pending(f, key, args, nargsf, kwnames);
        else if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* an unhashable keyword value */
            PyErr_Clear();
            result = general_call(f, args, nargsf, kwnames);
        }
        Py_DECREF(key);
        return result;
    }
    Py_DECREF(key);
    /* The operands' addresses; Python numbers are converted into `values` (which must
     * outlive the launch). The executor is the buffers' (the general path checked they
     * share one). */
    void *addresses[MAX_ARITY + 1];
    Scalar values[MAX_ARITY];
    PyObject *executor = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (e->scalars[i]) {
            if (!to_scalar(args[i], e->scalars[i], &values[i]))
                return general_call(f, args, nargsf, kwnames);
            addresses[i] = &values[i];
        } else {
            if (executor == NULL)
                executor = SLOT(args[i], off_executor);
            if (!as_address(SLOT(args[i], off_handle), &addresses[i]))
                return NULL;
        }
    }
    if (executor == NULL || !in_range(e, addresses)) /* out of range: the general path */
        return general_call(f, args, nargsf, kwnames);     /* raises the op's error */
    if (e->into_out)
        return launch_into_out(f, e, args, nargsf, kwnames, executor, addresses);
    Registry *reg = open_registry(executor);
    if (reg == NULL)
        return general_call(f, args, nargsf, kwnames);
    if (reg->pool == NULL) {
        Py_DECREF(reg);
        return general_call(f, args, nargsf, kwnames);
    }
    Py_INCREF(e); /* launching may run Python, which may drop the entry */
    PyObject *buf = NULL, *array = NULL, *handle = NULL;
    Lease *lease = new_lease(reg->pool, e->nbytes);
    if (lease == NULL) { /* the limit, or the OS: the general path raises the full story */
        PyErr_Clear();
        Py_DECREF(reg);
        Py_DECREF(e);
        return general_call(f, args, nargsf, kwnames);
    }
    char *address = lease->block->addr;
    PyObject *argv[3] = {e->shape, e->dtype, (PyObject *)lease};
    array = PyObject_Vectorcall(ndarray_type, argv, 3, NULL);
    Py_DECREF(lease); /* the array holds it */
    if (array == NULL)
        goto done;
    handle = PyLong_FromVoidPtr(address);
    if (handle == NULL)
        goto done;
    buf = buffer_type->tp_alloc(buffer_type, 0);
    if (buf == NULL)
        goto done;
    Py_INCREF(array);
    SLOT(buf, off_array) = array;
    SLOT(buf, off_allocation) = array;
    array = NULL;
    Py_INCREF(executor);
    SLOT(buf, off_executor) = executor;
    Py_INCREF(handle);
    SLOT(buf, off_handle) = handle;
    Py_INCREF(e->signature);
    SLOT(buf, off_signature) = e->signature;
    Py_INCREF(e->launch_key);
    SLOT(buf, off_launch_key) = e->launch_key;
    if (registry_add(reg, buf) < 0)
        goto fail;
    if (reg->closed) { /* closed meanwhile (a finalizer let another thread run): refuse */
        Py_CLEAR(buf);
        Py_DECREF(handle);
        Py_DECREF(reg);
        Py_DECREF(e);
        return general_call(f, args, nargsf, kwnames);
    }
    addresses[n] = address;
    if (launcher_run(e->launch, addresses, n + 1, NULL) < 0)
        goto fail;
    goto done;
fail:
    Py_CLEAR(buf);
done:
    Py_XDECREF(array);
    Py_XDECREF(handle);
    Py_DECREF(reg);
    Py_DECREF(e);
    return buf;
}


/* The index range of operand i, whose launch key (a Python number's: its type) is
 * `key`, below `bound`: 1 and *g set; 0 where the operand holds no integers (nothing to
 * check); -1 where this path cannot check it (or an error is set). */
static int index_range(PyObject *key, char scalar, Py_ssize_t i, long long bound,
                       IndexRange *g)
{
    g->operand = (int)i;
    g->bound = (uint64_t)bound;
    if (scalar) { /* a Python number: one value of that type */
        g->code = scalar;
        g->count = 1;
    } else {
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 2 ||
            !PyTuple_Check(PyTuple_GET_ITEM(key, 0)))
            return -1;
        PyObject *dims = PyTuple_GET_ITEM(key, 0);
        g->count = 1;
        for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(dims); d++) {
            long long extent = PyLong_AsLongLong(PyTuple_GET_ITEM(dims, d));
            if (extent < 0)
                return -1; /* an error, or not a shape */
            g->count *= extent;
        }
        PyObject *code = PyObject_GetAttrString(PyTuple_GET_ITEM(key, 1), "char");
        if (code == NULL)
            return -1;
        const char *c = PyUnicode_Check(code) ? PyUnicode_AsUTF8(code) : NULL;
        g->code = c != NULL && strlen(c) == 1 ? c[0] : 0;
        Py_DECREF(code);
        if (c == NULL)
            return -1;
    }
    if (g->code == 0 || strchr("bhilqBHILQ", g->code) == NULL)
        return 0;
    return 1;
}

/* file_pending(natives, operand launch keys, shape, dtype, result launch key, nbytes,
 * launch, scalars, into_out, ranges): called by the general path once it has validated an
 * allocating call and compiled its kernel. If that call is the one a FastOp of `natives`
 * is running (its operands are these), file it under the call's key; otherwise do
 * nothing. `ranges`: (operand, bound) pairs, each an operand whose integers must lie in
 * [0, bound) for the native path to launch (their count and type are its launch key's). */
PyObject *file_pending(PyObject *module, PyObject *args)
{
    PyObject *natives, *keys, *shape, *dtype, *launch_key, *launch, *ranges = NULL;
    const char *scalars = "";
    Py_ssize_t nscalars = 0;
    long long nbytes;
    int into_out = 0;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!LO!|s#pO!", &PyTuple_Type, &natives, &PyTuple_Type,
                          &keys, &PyTuple_Type, &shape, &dtype, &PyTuple_Type, &launch_key,
                          &nbytes, &LauncherType, &launch, &scalars, &nscalars, &into_out,
                          &PyTuple_Type, &ranges))
        return NULL;
    FastOp *f = pending_op;
    if (f == NULL || nbytes <= 0 || PyTuple_GET_SIZE(keys) != pending_nargs ||
        (nscalars && nscalars != pending_nargs))
        Py_RETURN_FALSE;
    int mine = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(natives); i++)
        mine |= PyTuple_GET_ITEM(natives, i) == (PyObject *)f;
    for (Py_ssize_t i = 0; mine && i < pending_nargs; i++)
        mine = PyTuple_GET_ITEM(keys, i) == PyTuple_GET_ITEM(pending_key, i);
    if (!mine)
        Py_RETURN_FALSE;
    IndexRange checked[MAX_ARITY];
    int nranges = 0;
    Py_ssize_t nasked = ranges ? PyTuple_GET_SIZE(ranges) : 0;
    if (nasked > MAX_ARITY)
        Py_RETURN_FALSE;
    for (Py_ssize_t r = 0; r < nasked; r++) {
        Py_ssize_t i;
        long long bound;
        PyObject *pair = PyTuple_GET_ITEM(ranges, r);
        if (!PyTuple_Check(pair)) {
            PyErr_SetString(PyExc_TypeError, "file_pending: ranges are (operand, bound) pairs");
            return NULL;
        }
        if (!PyArg_ParseTuple(pair, "nL", &i, &bound))
            return NULL;
        if (i < 0 || i >= pending_nargs || bound < 0)
            Py_RETURN_FALSE;
        char scalar = i < nscalars && scalars[i] != '.' ? scalars[i] : 0;
        int kind = index_range(PyTuple_GET_ITEM(keys, i), scalar, i, bound, &checked[nranges]);
        if (kind < 0) {
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_FALSE;
        }
        nranges += kind;
    }
    if (PyDict_GET_SIZE(f->entries) >= MAX_ENTRIES)
        PyDict_Clear(f->entries); /* bounded: refilled by the general path as needed */
    Entry *e = PyObject_New(Entry, &EntryType);
    if (e == NULL)
        return NULL;
    e->signature = PyTuple_Pack(2, shape, dtype);
    Py_INCREF(shape);
    e->shape = shape;
    Py_INCREF(dtype);
    e->dtype = dtype;
    Py_INCREF(launch_key);
    e->launch_key = launch_key;
    Py_INCREF(launch);
    e->launch = (Launcher *)launch;
    e->nbytes = nbytes;
    e->into_out = into_out;
    e->nranges = nranges;
    memcpy(e->ranges, checked, sizeof(IndexRange) * nranges);
    for (Py_ssize_t i = 0; i < MAX_ARITY; i++) /* '.': a buffer */
        e->scalars[i] = i < nscalars && scalars[i] != '.' ? scalars[i] : 0;
    if (e->signature == NULL) {
        Py_DECREF(e);
        return NULL;
    }
    int err = PyDict_SetItem(f->entries, pending_key, (PyObject *)e);
    Py_DECREF(e);
    if (err < 0)
        return NULL;
    pending_op = NULL; /* filed once: the general path's inner calls are not this call */
    Py_RETURN_TRUE;
}

static PyObject *fastop_forget(FastOp *f, PyObject *unused)
{
    PyDict_Clear(f->entries);
    Py_RETURN_NONE;
}

static PyObject *fastop_stats(FastOp *f, PyObject *unused)
{
    Py_ssize_t planned = 0, pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(f->entries, &pos, &k, &v))
        planned += ((Entry *)v)->launch->plan == 1;
    return Py_BuildValue("{snsn}", "entries", PyDict_GET_SIZE(f->entries), "planned", planned);
}

static PyObject *fastop_repr(FastOp *f)
{
    PyObject *name = PyDict_GetItemString(f->dict, "__name__");
    return name ? PyUnicode_FromFormat("<hologram op %U>", name)
                : PyUnicode_FromString("<hologram op>");
}

static PyMethodDef fastop_methods[] = {
    {"forget", (PyCFunction)fastop_forget, METH_NOARGS, "drop every filed signature"},
    {"fast_stats", (PyCFunction)fastop_stats, METH_NOARGS,
     "{'entries': filed signatures, 'planned': those launched without Python}"},
    {NULL},
};

static PyMemberDef fastop_members[] = {
    {"general", T_OBJECT, offsetof(FastOp, general), READONLY,
     "the op's general path (a Python function)"},
    {"arity", T_PYSSIZET, offsetof(FastOp, arity), READONLY,
     "the number of buffer operands (0: any number)"},
    {NULL},
};

static PyGetSetDef fastop_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

PyTypeObject FastOpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.FastOp",
    .tp_doc = "FastOp(general, arity): an SDK op. A call of exactly `arity` (0: any) buffers "
              "(and any hashable keywords) that the general path has filed allocates and "
              "launches here; every other call is general(*args, **kwargs).",
    .tp_basicsize = sizeof(FastOp),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = fastop_new,
    .tp_dealloc = (destructor)fastop_dealloc,
    .tp_traverse = (traverseproc)fastop_traverse,
    .tp_clear = (inquiry)fastop_clear,
    .tp_vectorcall_offset = offsetof(FastOp, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)fastop_repr,
    .tp_methods = fastop_methods,
    .tp_members = fastop_members,
    .tp_getset = fastop_getset,
    .tp_dictoffset = offsetof(FastOp, dict),
};

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL)
        return -1;
    int ok = Py_TYPE(d) == &PyMemberDescr_Type &&
             ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok)
        *offset = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok)
        PyErr_Format(PyExc_TypeError, "set_buffer_type: %s is not a __slots__ slot", name);
    return ok ? 0 : -1;
}

PyObject *set_buffer_type(PyObject *module, PyObject *args)
{
    PyTypeObject *type;
    PyObject *ndarray;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyType_Type, &ndarray))
        return NULL;
    if (slot_offset(type, "_array", &off_array) < 0 ||
        slot_offset(type, "allocation", &off_allocation) < 0 ||
        slot_offset(type, "executor", &off_executor) < 0 ||
        slot_offset(type, "handle", &off_handle) < 0 ||
        slot_offset(type, "launch_key", &off_launch_key) < 0 ||
        slot_offset(type, "signature", &off_signature) < 0)
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(buffer_type, type);
    Py_INCREF(ndarray);
    Py_XSETREF(ndarray_type, ndarray);
    Py_RETURN_NONE;
}
