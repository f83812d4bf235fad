/* Declarations shared by the files of hologram._native (native.c has the overview): the
 * pool's and the launcher's structures and the functions one file calls in another. Not
 * an API (that is native_api.h): everything declared here is hidden in the extension.
 */
#ifndef HOLOGRAM_NATIVE_INTERNAL_H
#define HOLOGRAM_NATIVE_INTERNAL_H

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

#if defined(__GNUC__) || defined(__clang__)
#define HG_INTERNAL __attribute__((visibility("hidden")))
#else
#define HG_INTERNAL
#endif

/* --- pool.c: the host pool's core and its leases ----------------------------------------- */

HG_INTERNAL extern int64_t page_bytes, slab_bytes; /* set by PyInit__native */
HG_INTERNAL extern int num_slab_classes;
HG_INTERNAL int64_t class_bytes(int index);
HG_INTERNAL int size_class(int64_t nbytes, int64_t *cbytes);

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

typedef struct {
    PyObject_HEAD
    PoolCore *pool;
    Block *block;
    int64_t requested;
} Lease;

HG_INTERNAL extern PyTypeObject PoolCoreType, LeaseType;
/* A lease of nbytes > 0 (see take() for NULL). */
HG_INTERNAL Lease *new_lease(PoolCore *p, int64_t nbytes);

/* --- registry.c: an executor's buffers -------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *refs;  /* list of weak references (no callbacks: a dying buffer costs nothing) */
    Py_ssize_t prune_at;
    PoolCore *pool;  /* the executor's pool core, or NULL (memory that is not a host pool) */
    int closed;
} Registry;

HG_INTERNAL extern PyTypeObject RegistryType;
HG_INTERNAL int registry_add(Registry *r, PyObject *obj);

/* --- launcher.c: a loaded program's launch(handles) ------------------------------------- */

typedef void (*kernel_fn)(void **pointers, int64_t start, int64_t stop);

/* A step that calls back into Python: fn(a, b, c) on three addresses, each a pointer
 * slot's plus a byte offset (0 where the slot holds none): the cpu backend's products. */
typedef struct {
    PyObject *fn; /* NULL: a kernel step */
    int slots[3];
    int64_t offsets[3];
} Callback;

/* A step whose kernel runs on words of its own instead of the pointer array: the cpu
 * backend's products, whose native trampolines (parallel_gemm.py) read the library entry,
 * the sizes and the operands' addresses from int64 words. Each launch copies the words,
 * writes three operands' addresses (a pointer slot's plus a byte offset) at their word
 * indices and, when the step runs as one piece, the thread count at word `threads_at`
 * (the library may use them all; pieces each get 1). */
#define MAX_JOB_WORDS 24
typedef struct {
    int nwords; /* 0: not a job step */
    int slots[3], at[3];
    int64_t offsets[3];
    int threads_at; /* -1: none */
    int64_t words[MAX_JOB_WORDS];
} Job;

/* A loaded program's launch(handles) (what the SDK's ops, hg.jit and the torch device
 * call), run without Python when the program allows it: the executable's native_plan()
 * says which kernels to call on which pointer array. */
typedef struct {
    PyObject_HEAD
    PyObject *executable;
    PyObject *keep;   /* what the plan's job steps point into (their owners), kept alive */
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
    Job *jobs;
    /* Scratch memory per call (the program's temporaries): a block of arena_bytes from
     * arena_pool, temporary i at its offset temp_offsets[i] in pointer slot temp_slots[i]. */
    PoolCore *arena_pool;
    int64_t arena_bytes;
    int ntemps;
    int *temp_slots;
    int64_t *temp_offsets;
} Launcher;

HG_INTERNAL extern PyTypeObject LauncherType;
HG_INTERNAL extern PyObject *str_native_plan; /* interned by PyInit__native */
HG_INTERNAL int as_address(PyObject *obj, void **out);
HG_INTERNAL int launcher_run(Launcher *l, void *const *addresses, Py_ssize_t n,
                             PyObject *handles);
HG_INTERNAL PyObject *forget_pieces(PyObject *module, PyObject *unused);
HG_INTERNAL PyObject *set_parallel(PyObject *module, PyObject *args);
HG_INTERNAL int64_t chunk_count(int64_t total, int64_t grain, int64_t threads,
                                int64_t per_thread);
HG_INTERNAL PyObject *chunk_count_py(PyObject *module, PyObject *args);

/* --- arrays.c: compiled programs called on NumPy arrays ----------------------------------- */

HG_INTERNAL extern PyTypeObject ArrayCallType;

/* --- fastop.c: the SDK ops' allocating fast path ---------------------------------------- */

HG_INTERNAL extern PyTypeObject EntryType, FastOpType;
HG_INTERNAL extern PyObject *str_buffers; /* interned by PyInit__native */
HG_INTERNAL PyObject *set_buffer_type(PyObject *module, PyObject *args);
HG_INTERNAL PyObject *file_pending(PyObject *module, PyObject *args);

#endif
