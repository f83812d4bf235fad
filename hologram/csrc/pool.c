/* The host memory pool's core (hologram.backends.hostmem.Pool's state, whose policy is
 * documented there): 96 size classes, free lists, slabs, counters, the memory limit and the
 * trimming rule; and Lease, the owner of one block, which arrays view through the buffer
 * protocol and whose deallocation returns the block. Part of hologram._native (native.c).
 */
#include "native_internal.h"

int64_t page_bytes, slab_bytes;
int num_slab_classes;

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

int64_t class_bytes(int index)
{
    int octave = MIN_SHIFT + index / 4;
    return (int64_t)(4 + index % 4) << (octave - 2);
}

/* The class of a request of nbytes >= 0: its index (or -1 beyond the largest class) and,
 * in *cbytes, the class size (or nbytes rounded up to a page). Mirrors the table that
 * hostmem.py documents. */
int size_class(int64_t nbytes, int64_t *cbytes)
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


Lease *new_lease(PoolCore *p, int64_t nbytes)
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

PyTypeObject LeaseType = {
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

PyTypeObject PoolCoreType = {
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
