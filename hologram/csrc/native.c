/* hologram._native: the host memory pool's core and the SDK ops' allocating fast path.
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <errno.h>
#include <string.h>

#include "native_api.h"

#ifdef _WIN32
#include <windows.h>
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

#define NUM_CLASSES 96
#define MIN_SHIFT 8
#define HUGE_PAGE (2 << 20)
#define CACHE_SLACK ((int64_t)64 << 20) /* see take() */
/* A plan's largest pointer array and step count (a transformer's training step compiled
 * whole has ~160 buffers and ~100 steps); larger programs are launched through Python. */
#define MAX_PLAN_BUFFERS 1024
#define MAX_PLAN_STEPS 1024
#define MAX_SPLIT_PARTS 256 /* a split reduction's partials (codegen.loops.MAX_PARTS) */
#define MAX_ARITY 8
#define MAX_ENTRIES 512

static int64_t page_bytes, slab_bytes;
static int num_slab_classes;

/* The index of the highest set bit of x != 0. */
static int top_bit(uint64_t x)
{
#ifdef _MSC_VER
    unsigned long index;
    _BitScanReverse64(&index, x);
    return (int)index;
#else
    return 63 - __builtin_clzll(x);
#endif
}

static int64_t class_bytes(int index)
{
    int octave = MIN_SHIFT + index / 4;
    return (int64_t)(4 + index % 4) << (octave - 2);
}

/* The class of a request of nbytes >= 0: its index (or -1 beyond the largest class) and,
 * in *cbytes, the class size (or nbytes rounded up to a page). Mirrors the table that
 * hostmem.py documents. */
static int size_class(int64_t nbytes, int64_t *cbytes)
{
    if (nbytes <= (1 << MIN_SHIFT)) {
        *cbytes = 1 << MIN_SHIFT;
        return 0;
    }
    uint64_t m = (uint64_t)nbytes - 1;
    int octave = top_bit(m);
    int shift = octave - 2;
    int64_t step = (int64_t)(m >> shift);
    int index = 4 * (octave - MIN_SHIFT) + (int)step - 3;
    if (index >= NUM_CLASSES) {
        *cbytes = (nbytes + page_bytes - 1) / page_bytes * page_bytes;
        return -1;
    }
    *cbytes = (step + 1) << shift;
    return index;
}

/* --- mappings ------------------------------------------------------------------------- */

static char *map_memory(int64_t nbytes)
{
#ifdef _WIN32
    return (char *)VirtualAlloc(NULL, (SIZE_T)nbytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
#else
    void *p = mmap(NULL, (size_t)nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (nbytes >= HUGE_PAGE)
        (void)madvise(p, (size_t)nbytes, MADV_HUGEPAGE); /* plain pages are correct too */
#endif
    return (char *)p;
#endif
}

static void unmap_memory(char *addr, int64_t nbytes)
{
#ifdef _WIN32
    (void)nbytes;
    VirtualFree(addr, 0, MEM_RELEASE);
#else
    munmap(addr, (size_t)nbytes);
#endif
}

/* --- the pool core --------------------------------------------------------------------- */

typedef struct Slab {
    char *base;
    int64_t nbytes;
    int64_t live; /* blocks handed out; at 0 every block is on a free list */
    int released;
} Slab;

typedef struct {
    char *addr;
    int index;      /* class, or -1 for a mapping of its own beyond the largest class */
    int64_t nbytes; /* the class size, or the mapping's size */
    Slab *slab;     /* the slab it was carved from, or NULL (a mapping of its own) */
} Block;

typedef struct {
    Block **items;
    Py_ssize_t len, cap;
} Stack;

typedef struct {
    PyObject_HEAD
    Stack free[NUM_CLASSES];
    Slab **slabs;
    Py_ssize_t nslabs, slabs_cap;
    uint64_t mask[2]; /* bit i: class i (not a slab class) has cached blocks */
    int64_t allocated, requested, reserved, cached, peak;
    int64_t hits, misses, allocs, frees, large;
    int64_t limit; /* -1: none */
} PoolCore;

static int push(Stack *s, Block *b)
{
    if (s->len == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : 16;
        Block **items = PyMem_Realloc(s->items, (size_t)cap * sizeof(Block *));
        if (items == NULL)
            return -1;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->len++] = b;
    return 0;
}

static void set_mask(PoolCore *p, int i) { p->mask[i >> 6] |= (uint64_t)1 << (i & 63); }
static void clear_mask(PoolCore *p, int i) { p->mask[i >> 6] &= ~((uint64_t)1 << (i & 63)); }

static int highest_mask(PoolCore *p)
{
    if (p->mask[1])
        return 64 + top_bit(p->mask[1]);
    if (p->mask[0])
        return top_bit(p->mask[0]);
    return -1;
}

/* Unmap cached blocks of their own mapping, largest class first, until reserved <= target. */
static void trim(PoolCore *p, int64_t target)
{
    int index;
    while (p->reserved > target && (index = highest_mask(p)) >= 0) {
        Stack *s = &p->free[index];
        Block *b = s->items[--s->len];
        if (s->len == 0)
            clear_mask(p, index);
        p->reserved -= b->nbytes;
        p->cached -= b->nbytes;
        unmap_memory(b->addr, b->nbytes);
        PyMem_Free(b);
    }
}

/* Unmap every slab whose blocks are all free. */
static void release_slabs(PoolCore *p)
{
    for (int index = 0; index < num_slab_classes; index++) {
        Stack *s = &p->free[index];
        Py_ssize_t keep = 0;
        for (Py_ssize_t i = 0; i < s->len; i++) {
            Block *b = s->items[i];
            if (b->slab->live) {
                s->items[keep++] = b;
                continue;
            }
            p->cached -= b->nbytes;
            if (!b->slab->released) {
                b->slab->released = 1;
                p->reserved -= b->slab->nbytes;
                unmap_memory(b->slab->base, b->slab->nbytes);
            }
            PyMem_Free(b);
        }
        s->len = keep;
    }
    Py_ssize_t keep = 0;
    for (Py_ssize_t i = 0; i < p->nslabs; i++) {
        if (p->slabs[i]->released)
            PyMem_Free(p->slabs[i]);
        else
            p->slabs[keep++] = p->slabs[i];
    }
    p->nslabs = keep;
}

static void account(PoolCore *p, int64_t nbytes, int64_t cbytes)
{
    p->allocated += cbytes;
    p->requested += nbytes;
    p->allocs++;
    if (p->allocated > p->peak)
        p->peak = p->allocated;
}

/* A block for a request of nbytes > 0. NULL without an exception: the memory limit is in
 * the way. NULL with MemoryError: the OS refused, or bookkeeping could not grow. */
static Block *take(PoolCore *p, int64_t nbytes)
{
    int64_t cbytes;
    int index = size_class(nbytes, &cbytes);
    if (p->limit >= 0 && p->allocated + cbytes > p->limit)
        return NULL;
    if (index >= 0 && p->free[index].len) {
        Stack *s = &p->free[index];
        Block *b = s->items[--s->len];
        if (b->slab != NULL)
            b->slab->live++;
        else if (s->len == 0)
            clear_mask(p, index);
        p->cached -= cbytes;
        p->hits++;
        account(p, nbytes, cbytes);
        return b;
    }
    int slab_class = index >= 0 && index < num_slab_classes;
    int64_t map_bytes = slab_class ? slab_bytes : cbytes;
    /* Keep the cache proportionate: never more than twice the peak or the peak and
       CACHE_SLACK, whichever is more, and within the limit. The slack is for blocks taken
       in turn, each below the peak: two compiled programs' scratch arenas of 4 and 3 MiB
       next to 1.5 MiB of smaller ones passed twice the peak, and each call trimmed the
       block the next one needed and mapped its own afresh (page faults every step). */
    int64_t used = p->allocated + cbytes;
    int64_t base = p->peak > used ? p->peak : used;
    int64_t target = 2 * base > base + CACHE_SLACK ? 2 * base : base + CACHE_SLACK;
    if (p->limit >= 0 && p->limit < target)
        target = p->limit;
    if (p->reserved + map_bytes > target) {
        trim(p, target - map_bytes);
        if (p->limit >= 0 && p->reserved + map_bytes > p->limit)
            release_slabs(p);
    }
    Block *b = PyMem_Malloc(sizeof(Block));
    Slab *slab = NULL;
    char *addr = NULL;
    if (b != NULL && slab_class) {
        slab = PyMem_Malloc(sizeof(Slab));
        if (slab != NULL && p->nslabs == p->slabs_cap) {
            Py_ssize_t cap = p->slabs_cap ? 2 * p->slabs_cap : 16;
            Slab **slabs = PyMem_Realloc(p->slabs, (size_t)cap * sizeof(Slab *));
            if (slabs == NULL) {
                PyMem_Free(slab);
                slab = NULL;
            } else {
                p->slabs = slabs;
                p->slabs_cap = cap;
            }
        }
    }
    if (b != NULL && (slab != NULL || !slab_class))
        addr = map_memory(map_bytes);
    if (addr == NULL) {
        PyMem_Free(b);
        PyMem_Free(slab);
        PyErr_Format(PyExc_MemoryError, "the OS refused to map %lld bytes (%s)",
                     (long long)map_bytes, strerror(errno));
        return NULL;
    }
    if (index < 0)
        p->large++;
    else
        p->misses++;
    p->reserved += map_bytes;
    b->addr = addr;
    b->index = index;
    b->nbytes = cbytes;
    b->slab = slab;
    if (slab != NULL) {
        /* A new slab: hand out its first block, put the others on the free list (in
         * reverse, so that the stack hands out ascending addresses). */
        slab->base = addr;
        slab->nbytes = map_bytes;
        slab->live = 1;
        slab->released = 0;
        p->slabs[p->nslabs++] = slab;
        int64_t count = map_bytes / cbytes;
        for (int64_t i = count - 1; i > 0; i--) {
            Block *rest = PyMem_Malloc(sizeof(Block));
            if (rest == NULL || push(&p->free[index], rest) < 0) {
                /* Unlisted blocks stay in the slab, unused, until it is released. */
                PyMem_Free(rest);
                slab->live += i;
                break;
            }
            rest->addr = addr + i * cbytes;
            rest->index = index;
            rest->nbytes = cbytes;
            rest->slab = slab;
            p->cached += cbytes;
        }
    }
    account(p, nbytes, cbytes);
    return b;
}

static void give_back(PoolCore *p, Block *b, int64_t requested)
{
    p->allocated -= b->nbytes;
    p->requested -= requested;
    p->frees++;
    if (b->index < 0) { /* a mapping of its own: straight back to the OS */
        p->reserved -= b->nbytes;
        unmap_memory(b->addr, b->nbytes);
        PyMem_Free(b);
        return;
    }
    if (push(&p->free[b->index], b) < 0) { /* no memory for the list: unmap instead */
        PyErr_Clear();
        if (b->slab == NULL) {
            p->reserved -= b->nbytes;
            unmap_memory(b->addr, b->nbytes);
            PyMem_Free(b);
        }
        return;
    }
    p->cached += b->nbytes;
    if (b->slab != NULL)
        b->slab->live--;
    else
        set_mask(p, b->index);
}

static PyTypeObject PoolCoreType, LeaseType, RegistryType, FastOpType;

typedef struct {
    PyObject_HEAD
    PoolCore *pool;
    Block *block;
    int64_t requested;
} Lease;

/* A lease of nbytes > 0 (see take() for NULL). */
static Lease *new_lease(PoolCore *p, int64_t nbytes)
{
    Lease *lease = PyObject_New(Lease, &LeaseType);
    if (lease == NULL)
        return NULL;
    Block *b = take(p, nbytes);
    if (b == NULL) {
        lease->pool = NULL;
        lease->block = NULL;
        Py_DECREF(lease);
        return NULL;
    }
    Py_INCREF(p);
    lease->pool = p;
    lease->block = b;
    lease->requested = nbytes;
    return lease;
}

static void lease_dealloc(Lease *self)
{
    if (self->block != NULL)
        give_back(self->pool, self->block, self->requested);
    Py_XDECREF(self->pool);
    PyObject_Free(self);
}

static int lease_getbuffer(Lease *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->block->addr,
                             (Py_ssize_t)self->block->nbytes, 0, flags);
}

static PyBufferProcs lease_as_buffer = {(getbufferproc)lease_getbuffer, NULL};

static PyObject *lease_address(Lease *self, void *closure)
{
    return PyLong_FromVoidPtr(self->block->addr);
}

static PyObject *lease_nbytes(Lease *self, void *closure)
{
    return PyLong_FromLongLong(self->block->nbytes);
}

static PyGetSetDef lease_getset[] = {
    {"address", (getter)lease_address, NULL, "the block's host address", NULL},
    {"nbytes", (getter)lease_nbytes, NULL, "the block's size (its class size)", NULL},
    {NULL},
};

static PyTypeObject LeaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.Lease",
    .tp_doc = "The owner of one pool block: the block returns to its pool when the lease "
              "and every array viewing it (through the buffer protocol) are gone.",
    .tp_basicsize = sizeof(Lease),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)lease_dealloc,
    .tp_as_buffer = &lease_as_buffer,
    .tp_getset = lease_getset,
};

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PoolCore *p = (PoolCore *)type->tp_alloc(type, 0); /* zeroed */
    if (p != NULL)
        p->limit = -1;
    return (PyObject *)p;
}

static void pool_dealloc(PoolCore *p)
{
    /* Leases hold their pool, so every block is on a free list now. */
    for (int i = 0; i < NUM_CLASSES; i++) {
        Stack *s = &p->free[i];
        for (Py_ssize_t j = 0; j < s->len; j++) {
            if (s->items[j]->slab == NULL)
                unmap_memory(s->items[j]->addr, s->items[j]->nbytes);
            PyMem_Free(s->items[j]);
        }
        PyMem_Free(s->items);
    }
    for (Py_ssize_t i = 0; i < p->nslabs; i++) {
        unmap_memory(p->slabs[i]->base, p->slabs[i]->nbytes);
        PyMem_Free(p->slabs[i]);
    }
    PyMem_Free(p->slabs);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *pool_alloc(PoolCore *p, PyObject *arg)
{
    long long nbytes = PyLong_AsLongLong(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (nbytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "alloc: nbytes must be > 0");
        return NULL;
    }
    Lease *lease = new_lease(p, nbytes);
    if (lease == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return (PyObject *)lease;
}

static PyObject *pool_stats(PoolCore *p, PyObject *unused)
{
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsLsL}", "allocated_bytes", p->allocated,
                         "requested_bytes", p->requested, "reserved_bytes", p->reserved,
                         "cached_bytes", p->cached, "peak_allocated_bytes", p->peak,
                         "pool_hits", p->hits, "pool_misses", p->misses, "num_allocs",
                         p->allocs, "num_frees", p->frees, "large_allocs", p->large);
}

static PyObject *pool_empty_cache(PoolCore *p, PyObject *unused)
{
    int64_t before = p->reserved;
    trim(p, -1);
    release_slabs(p);
    return PyLong_FromLongLong(before - p->reserved);
}

static PyObject *pool_set_limit(PoolCore *p, PyObject *arg)
{
    long long limit = -1;
    if (arg != Py_None) {
        limit = PyLong_AsLongLong(arg);
        if (limit == -1 && PyErr_Occurred())
            return NULL;
    }
    p->limit = limit;
    if (limit >= 0 && p->reserved > limit) {
        trim(p, limit);
        if (p->reserved > limit)
            release_slabs(p);
    }
    Py_RETURN_NONE;
}

static PyObject *pool_reset_peak(PoolCore *p, PyObject *unused)
{
    p->peak = p->allocated;
    Py_RETURN_NONE;
}

static PyMethodDef pool_methods[] = {
    {"alloc", (PyCFunction)pool_alloc, METH_O,
     "alloc(nbytes > 0) -> a Lease, or None when the memory limit is in the way "
     "(MemoryError: the OS refused)"},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, "the counters, as a dict"},
    {"empty_cache", (PyCFunction)pool_empty_cache, METH_NOARGS,
     "unmap cached blocks and free slabs; returns the bytes released"},
    {"set_limit", (PyCFunction)pool_set_limit, METH_O, "set_limit(bytes or None)"},
    {"reset_peak", (PyCFunction)pool_reset_peak, METH_NOARGS, "peak := allocated"},
    {NULL},
};

static PyMemberDef pool_members[] = {
    {"allocated", T_LONGLONG, offsetof(PoolCore, allocated), READONLY, NULL},
    {"reserved", T_LONGLONG, offsetof(PoolCore, reserved), READONLY, NULL},
    {NULL},
};

static PyTypeObject PoolCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.PoolCore",
    .tp_doc = "The state of a host memory pool (hologram.backends.hostmem.Pool).",
    .tp_basicsize = sizeof(PoolCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = pool_new,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_members = pool_members,
};

/* --- an executor's buffers --------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *refs;  /* list of weak references (no callbacks: a dying buffer costs nothing) */
    Py_ssize_t prune_at;
    PoolCore *pool;  /* the executor's pool core, or NULL (memory that is not a host pool) */
    int closed;
} Registry;

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

static int registry_add(Registry *r, PyObject *obj)
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

static PyTypeObject RegistryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.Registry",
    .tp_doc = "Registry(pool_core=None): an executor's buffers, held weakly.",
    .tp_basicsize = sizeof(Registry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = registry_new,
    .tp_dealloc = (destructor)registry_dealloc,
    .tp_methods = registry_methods,
};

/* --- the SDK ops' allocating fast path ---------------------------------------------------- */

/* Where a Buffer's slots are (read from its member descriptors by set_buffer_type). */
static PyTypeObject *buffer_type;
static Py_ssize_t off_array, off_allocation, off_executor, off_handle, off_launch_key,
    off_signature;
static PyObject *ndarray_type, *str_buffers, *str_native_plan;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

typedef void (*kernel_fn)(void **pointers, int64_t start, int64_t stop);

/* --- launchers ----------------------------------------------------------------------------- */

/* A step that calls back into Python: fn(a, b, c) on three addresses, each a pointer
 * slot's plus a byte offset (0 where the slot holds none): the cpu backend's products. */
typedef struct {
    PyObject *fn; /* NULL: a kernel step */
    int slots[3];
    int64_t offsets[3];
} Callback;

/* A loaded program's launch(handles) (what the SDK's ops, hg.jit and the torch device
 * call), run without Python when the program allows it: the executable's native_plan()
 * says which kernels to call on which pointer array. */
typedef struct {
    PyObject_HEAD
    PyObject *executable;
    PyObject *launch; /* executable.launch: every call without a plan */
    int plan;         /* 0: ask native_plan() at the next call, 1: planned, -1: never */
    int nbuffers, nparams, nsteps;
    /* The plan's arrays, in one allocation (`memory`) sized by refresh_plan. */
    void *memory;
    int *slots;       /* nparams */
    kernel_fn *steps; /* nsteps each, as the four below */
    int64_t *rows;
    int64_t *grains; /* 0: one call on this thread; else split over workers */
    /* A split reduction's final function (NULL: none): the step computes its `rows`
     * partials into scratch (pointer slot nbuffers), then finals[s](pointers, 0, 1). */
    kernel_fn *finals;
    Callback *callbacks;
    /* Scratch memory per call (the program's temporaries): a block of arena_bytes from
     * arena_pool, temporary i at its offset temp_offsets[i] in pointer slot temp_slots[i]. */
    PoolCore *arena_pool;
    int64_t arena_bytes;
    int ntemps;
    int *temp_slots;
    int64_t *temp_offsets;
} Launcher;

/* Drop the plan's arrays and the callbacks they hold. */
static void forget_plan(Launcher *l)
{
    if (l->callbacks != NULL)
        for (int s = 0; s < l->nsteps; s++)
            Py_CLEAR(l->callbacks[s].fn);
    PyMem_Free(l->memory);
    l->memory = NULL;
    l->slots = l->temp_slots = NULL;
    l->steps = l->finals = NULL;
    l->rows = l->grains = l->temp_offsets = NULL;
    l->callbacks = NULL;
    l->nsteps = l->ntemps = 0;
}

/* The plan's arrays carved from one block at m (NULL: none, only the bytes counted):
   8-byte members first, then the ints, so every array stays aligned. Returns the bytes. */
static size_t carve(Launcher *l, char *m, Py_ssize_t nparams, Py_ssize_t nsteps,
                    Py_ssize_t ntemps)
{
    size_t at = 0;
#define TAKE(field, type, n) \
    (l->field = m ? (type *)(m + at) : NULL, at += (size_t)(n) * sizeof(type))
    TAKE(callbacks, Callback, nsteps);
    TAKE(steps, kernel_fn, nsteps);
    TAKE(finals, kernel_fn, nsteps);
    TAKE(rows, int64_t, nsteps);
    TAKE(grains, int64_t, nsteps);
    TAKE(temp_offsets, int64_t, ntemps);
    TAKE(temp_slots, int, ntemps);
    TAKE(slots, int, nparams);
#undef TAKE
    return at;
}

/* Room for a plan of these sizes (the previous one dropped): 0, or -1 with MemoryError. */
static int size_plan(Launcher *l, Py_ssize_t nparams, Py_ssize_t nsteps, Py_ssize_t ntemps)
{
    forget_plan(l);
    size_t bytes = carve(l, NULL, nparams, nsteps, ntemps);
    char *m = PyMem_Calloc(1, bytes ? bytes : 1);
    if (m == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    l->memory = m;
    carve(l, m, nparams, nsteps, ntemps);
    l->nsteps = (int)nsteps; /* how many callbacks forget_plan looks at */
    return 0;
}

/* hg_parallel(kernel, pointers, total, count, helpers): the cpu backend's worker pool. */
typedef int32_t (*parallel_fn)(kernel_fn kernel, void **pointers, int64_t total,
                               int64_t count, int64_t helpers);
static int as_address(PyObject *obj, void **out)
{
    *out = PyLong_AsVoidPtr(obj);
    return !(*out == NULL && PyErr_Occurred());
}

/* threads.native_pieces(total, grain) -> (hg_parallel's address, count, helpers) | None:
 * set by the cpu backend (set_parallel); NULL until then. */
static PyObject *native_pieces;

/* What native_pieces last answered, so that a launch splits its steps without calling
 * Python (~0.4 µs a call): the thread count it ran with (0: nothing known), hg_parallel's
 * address, and the value HOLOGRAM_NUM_THREADS had then (os.environ's raw mapping and key,
 * given to set_parallel; Py_None while unset). The answer holds while that value is the
 * same object and threads.py has not said otherwise (forget_pieces: set_num_threads, a
 * fork, the pool stopped or switched off). */
static int64_t pieces_threads, pieces_chunks;
static parallel_fn pieces_parallel;
static PyObject *pieces_environ, *pieces_key, *pieces_seen;

/* threads._pieces, for a known thread count n. */
static void split(int64_t total, int64_t grain, int64_t n, int64_t *count)
{
    int64_t fits = total / grain;
    *count = fits >= n ? n * (pieces_chunks < fits / n ? pieces_chunks : fits / n)
                       : (fits > 1 ? fits : 1);
}

/* How a step of `total` rows and `grain` runs on the pool: 0 with *fn, *count, *helpers
 * set; 1 when it must go through Python (no native workers); -1 with an exception. */
static int pieces(int64_t total, int64_t grain, parallel_fn *fn, int64_t *count,
                  int64_t *helpers)
{
    PyObject *now = NULL;
    if (pieces_environ != NULL) {
        now = PyDict_GetItemWithError(pieces_environ, pieces_key);
        if (now == NULL && PyErr_Occurred())
            return -1;
        if (now == NULL)
            now = Py_None;
        if (pieces_threads > 0 && now == pieces_seen) {
            *fn = pieces_parallel;
            *helpers = pieces_threads - 1;
            split(total, grain, pieces_threads, count);
            return 0;
        }
    }
    PyObject *answer = PyObject_CallFunction(native_pieces, "LL", (long long)total,
                                             (long long)grain);
    if (answer == NULL)
        return -1;
    void *address;
    long long c, h;
    int ok = answer != Py_None && PyArg_ParseTuple(answer, "O&LL", as_address, &address,
                                                   &c, &h);
    Py_DECREF(answer);
    if (!ok)
        return PyErr_Occurred() ? -1 : 1;
    *fn = (parallel_fn)address;
    *count = c;
    *helpers = h;
    if (now != NULL) {
        int64_t mine;
        split(total, grain, h + 1, &mine);
        if (mine == c) { /* the same rule here as there: remember it */
            pieces_parallel = *fn;
            pieces_threads = h + 1;
            Py_INCREF(now);
            Py_XSETREF(pieces_seen, now);
        }
    }
    return 0;
}

/* Ask the executable for its plan (backends/cpu/backend.py, _Executable.native_plan):
 * (pointer array length, parameter slots, steps, arena) when every step is a call of
 * native kernels: (kernel address, rows) on this thread, (address, rows, grain) over the
 * worker pool, (partial address, parts, 1, final address) a split reduction; arena None
 * or (bytes, ((slot, offset), ...), pool core). False: not yet (a build that may still
 * be replaced); None: never. */
static int refresh_plan(Launcher *l)
{
    PyObject *plan = PyObject_CallMethodNoArgs(l->executable, str_native_plan);
    if (plan == NULL)
        return -1;
    /* Another thread may have planned while native_plan() ran Python (the GIL let go);
     * from here on nothing does, so one thread fills the arrays, and only while no call
     * can be running them (plan != 1). */
    if (l->plan != 0 || plan == Py_False) {
        Py_DECREF(plan);
        return 0;
    }
    l->plan = -1;
    if (plan == Py_None) {
        Py_DECREF(plan);
        return 0;
    }
    PyObject *slots, *steps, *arena = Py_None, *temps = NULL, *pool = NULL;
    int nbuffers;
    long long nbytes = 0;
    if (!PyArg_ParseTuple(plan, "iO!O!|O", &nbuffers, &PyTuple_Type, &slots, &PyTuple_Type,
                          &steps, &arena))
        goto fail;
    if (arena != Py_None &&
        !PyArg_ParseTuple(arena, "LO!O!", &nbytes, &PyTuple_Type, &temps, &PoolCoreType,
                          &pool))
        goto fail;
    Py_ssize_t nparams = PyTuple_GET_SIZE(slots), nsteps = PyTuple_GET_SIZE(steps);
    Py_ssize_t ntemps = temps == NULL ? 0 : PyTuple_GET_SIZE(temps);
    if (nbuffers > MAX_PLAN_BUFFERS || nparams > nbuffers || nsteps > MAX_PLAN_STEPS) {
        Py_DECREF(plan);
        return 0; /* too large for one call's stack arrays: launched through Python */
    }
    if (nbuffers < 1 || nsteps < 1 || ntemps > nbuffers || (temps != NULL && nbytes <= 0)) {
        Py_DECREF(plan);
        PyErr_SetString(PyExc_ValueError, "native_plan: a bad plan or arena");
        return -1;
    }
    if (size_plan(l, nparams, nsteps, ntemps) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < ntemps; i++) {
        int slot;
        long long offset;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(temps, i), "iL", &slot, &offset))
            goto fail;
        if (slot < 0 || slot >= nbuffers || offset < 0 || offset >= nbytes) {
            PyErr_SetString(PyExc_ValueError, "native_plan: a temporary out of range");
            goto fail;
        }
        l->temp_slots[i] = slot;
        l->temp_offsets[i] = offset;
    }
    if (pool != NULL) {
        Py_INCREF(pool);
        Py_XSETREF(l->arena_pool, (PoolCore *)pool);
    }
    l->arena_bytes = nbytes;
    l->ntemps = (int)ntemps;
    for (Py_ssize_t i = 0; i < nparams; i++) {
        int slot = (int)PyLong_AsLong(PyTuple_GET_ITEM(slots, i));
        if (slot < 0 || slot >= nbuffers) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "native_plan: a slot out of range");
            goto fail;
        }
        l->slots[i] = slot;
    }
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        PyObject *step = PyTuple_GET_ITEM(steps, i);
        if (PyTuple_Check(step) && PyTuple_GET_SIZE(step) > 0 &&
            PyCallable_Check(PyTuple_GET_ITEM(step, 0))) {
            Callback *c = &l->callbacks[i];
            PyObject *fn;
            long long o[3];
            if (!PyArg_ParseTuple(step, "O((iL)(iL)(iL))", &fn, &c->slots[0], &o[0],
                                  &c->slots[1], &o[1], &c->slots[2], &o[2]))
                goto fail;
            for (int k = 0; k < 3; k++) {
                if (c->slots[k] < 0 || c->slots[k] >= nbuffers || o[k] < 0) {
                    PyErr_SetString(PyExc_ValueError, "native_plan: a callback's operand "
                                                      "out of range");
                    goto fail;
                }
                c->offsets[k] = o[k];
            }
            Py_INCREF(fn);
            c->fn = fn;
            continue;
        }
        void *address, *final = NULL;
        long long rows, grain = 0;
        if (!PyArg_ParseTuple(step, "O&L|LO&", as_address, &address, &rows, &grain,
                              as_address, &final))
            goto fail;
        if ((grain > 0 && native_pieces == NULL) ||
            (final != NULL && (grain != 1 || rows > MAX_SPLIT_PARTS))) {
            Py_DECREF(plan);
            forget_plan(l);
            return 0; /* no worker pool, or more partials than fit: launched through Python */
        }
        l->steps[i] = (kernel_fn)address;
        l->rows[i] = rows;
        l->grains[i] = grain;
        l->finals[i] = (kernel_fn)final;
    }
    l->nbuffers = nbuffers;
    l->nparams = (int)nparams;
    l->plan = 1;
    Py_DECREF(plan);
    return 0;
fail:
    Py_DECREF(plan);
    forget_plan(l);
    return -1;
}

/* A callback step on this call's pointers: 0, or -1 with its exception. */
static int call_back(Callback *c, void *const *pointers)
{
    PyObject *args[3] = {NULL, NULL, NULL};
    PyObject *r = NULL;
    for (int k = 0; k < 3; k++) {
        char *base = pointers[c->slots[k]];
        args[k] = PyLong_FromVoidPtr(base == NULL ? NULL : base + c->offsets[k]);
        if (args[k] == NULL)
            goto done;
    }
    r = PyObject_Vectorcall(c->fn, args, 3, NULL);
done:
    for (int k = 0; k < 3; k++)
        Py_XDECREF(args[k]);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Run the plan on the parameters' addresses (l->plan == 1): 0, or 1 when the launch must
 * go through Python after all (no native workers now), or -1 with an exception. Split
 * steps run with the GIL released, as ctypes runs them. */
static int run_plan(Launcher *l, void *const *addresses)
{
    void *pointers[l->nbuffers + 1]; /* + a split reduction's partials */
    parallel_fn parallel[l->nsteps];
    int64_t counts[l->nsteps], helpers[l->nsteps];
    for (int s = 0; s < l->nsteps; s++) { /* asked before any step runs */
        if (l->callbacks[s].fn != NULL || l->grains[s] == 0 || l->rows[s] <= 0)
            continue;
        int done = pieces(l->rows[s], l->grains[s], &parallel[s], &counts[s], &helpers[s]);
        if (done != 0)
            return done;
    }
    memset(pointers, 0, (size_t)l->nbuffers * sizeof(void *));
    for (int i = 0; i < l->nparams; i++)
        pointers[l->slots[i]] = addresses[i];
    /* This call's scratch (concurrent calls must not share one); at the pool's limit the
     * launch goes through Python, which raises the pool's error. */
    Lease *arena = NULL;
    if (l->arena_bytes > 0) {
        arena = new_lease(l->arena_pool, l->arena_bytes);
        if (arena == NULL)
            return PyErr_Occurred() ? -1 : 1;
        for (int i = 0; i < l->ntemps; i++)
            pointers[l->temp_slots[i]] = (char *)arena->block->addr + l->temp_offsets[i];
    }
    /* The partials of split reductions (16 bytes each: an accumulator and an index),
     * this call's own. */
    int64_t partials[2 * MAX_SPLIT_PARTS];
    pointers[l->nbuffers] = partials;
    for (int s = 0; s < l->nsteps; s++) {
        if (l->callbacks[s].fn != NULL) {
            if (call_back(&l->callbacks[s], pointers) < 0) {
                Py_XDECREF(arena);
                return -1;
            }
        } else if (l->grains[s] == 0) {
            l->steps[s](pointers, 0, l->rows[s]);
        } else if (l->rows[s] > 0) {
            Py_BEGIN_ALLOW_THREADS
            parallel[s](l->steps[s], pointers, l->rows[s], counts[s], helpers[s]);
            Py_END_ALLOW_THREADS
        }
        if (l->finals[s] != NULL)
            l->finals[s](pointers, 0, 1);
    }
    Py_XDECREF(arena);
    return 0;
}

/* Launch on nparams addresses; `handles` (the same as ints, or NULL to make them) is what
 * the Python launch gets when there is no plan. */
static int launcher_run(Launcher *l, void *const *addresses, Py_ssize_t n, PyObject *handles)
{
    if (l->plan == 0 && refresh_plan(l) < 0)
        return -1;
    if (l->plan == 1 && n == l->nparams) {
        int done = run_plan(l, addresses);
        if (done <= 0)
            return done;
    }
    PyObject *made = NULL;
    if (handles == NULL) {
        handles = made = PyTuple_New(n);
        if (made == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *h = PyLong_FromVoidPtr(addresses[i]);
            if (h == NULL) {
                Py_DECREF(made);
                return -1;
            }
            PyTuple_SET_ITEM(made, i, h);
        }
    }
    PyObject *r = PyObject_CallOneArg(l->launch, handles);
    Py_XDECREF(made);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *executable;
    if (!PyArg_ParseTuple(args, "O", &executable))
        return NULL;
    PyObject *launch = PyObject_GetAttrString(executable, "launch");
    if (launch == NULL)
        return NULL;
    Launcher *l = (Launcher *)type->tp_alloc(type, 0);
    if (l == NULL) {
        Py_DECREF(launch);
        return NULL;
    }
    Py_INCREF(executable);
    l->executable = executable;
    l->launch = launch;
    /* Executables that cannot describe their kernels (interp, device memory) are always
     * launched through Python. */
    l->plan = PyObject_HasAttr(executable, str_native_plan) ? 0 : -1;
    return (PyObject *)l;
}

static void launcher_dealloc(Launcher *l)
{
    forget_plan(l);
    Py_XDECREF(l->executable);
    Py_XDECREF(l->launch);
    Py_XDECREF(l->arena_pool);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static PyObject *launcher_call(Launcher *l, PyObject *args, PyObject *kw)
{
    PyObject *handles;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &handles))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(handles);
    if (l->plan == 0 && refresh_plan(l) < 0)
        return NULL;
    if (l->plan == 1 && n == l->nparams) {
        void *addresses[n + 1];
        for (Py_ssize_t i = 0; i < n; i++)
            if (!as_address(PyTuple_GET_ITEM(handles, i), &addresses[i]))
                return NULL;
        int done = run_plan(l, addresses);
        if (done < 0)
            return NULL;
        if (done == 0)
            Py_RETURN_NONE;
    }
    return PyObject_CallOneArg(l->launch, handles);
}

static PyObject *launcher_planned(Launcher *l, void *closure)
{
    return PyBool_FromLong(l->plan == 1);
}

static PyGetSetDef launcher_getset[] = {
    {"planned", (getter)launcher_planned, NULL,
     "whether calls run the kernels without Python (so far)", NULL},
    {NULL},
};

static PyMemberDef launcher_members[] = {
    {"executable", T_OBJECT, offsetof(Launcher, executable), READONLY, NULL},
    {NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hologram._native.Launcher",
    .tp_doc = "Launcher(executable): executable.launch(handles), without Python when its "
              "native_plan() allows.",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = launcher_new,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_call = (ternaryfunc)launcher_call,
    .tp_getset = launcher_getset,
    .tp_members = launcher_members,
};

/* --- the SDK ops' allocating fast path ---------------------------------------------------- */

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

static PyTypeObject EntryType = {
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

static PyObject *forget_pieces(PyObject *module, PyObject *unused)
{
    pieces_threads = 0;
    Py_CLEAR(pieces_seen);
    Py_RETURN_NONE;
}

static PyObject *set_parallel(PyObject *module, PyObject *args)
{
    PyObject *fn, *environ, *key;
    long long chunks;
    if (!PyArg_ParseTuple(args, "OOOL", &fn, &environ, &key, &chunks))
        return NULL;
    if (environ != Py_None && !PyDict_Check(environ)) {
        PyErr_SetString(PyExc_TypeError, "set_parallel: the environment must be a dict");
        return NULL;
    }
    if (chunks < 1) {
        PyErr_SetString(PyExc_ValueError, "set_parallel: chunks per thread must be >= 1");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(native_pieces, fn);
    Py_XSETREF(pieces_environ, environ == Py_None ? NULL : Py_NewRef(environ));
    Py_XSETREF(pieces_key, Py_NewRef(key));
    pieces_chunks = chunks;
    return forget_pieces(module, NULL);
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
static PyObject *file_pending(PyObject *module, PyObject *args)
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

static PyTypeObject FastOpType = {
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

/* --- module ------------------------------------------------------------------------------ */

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

static PyObject *set_buffer_type(PyObject *module, PyObject *args)
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
                             &EntryType, &FastOpType};
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
