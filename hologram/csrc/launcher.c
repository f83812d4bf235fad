/* Launcher: a loaded program's launch(handles), what the SDK's ops, hg.jit and the torch
 * device call, run without Python when the executable's native_plan() allows it: the
 * kernels to call on which pointer array, their temporaries in one arena block, and how
 * each step splits over the cpu backend's worker pool (set_parallel). Part of
 * hologram._native (native.c).
 */
#include "native_internal.h"

PyObject *str_native_plan;

/* Drop the plan's arrays and the callbacks they hold. */
static void forget_plan(Launcher *l)
{
    if (l->callbacks != NULL)
        for (int s = 0; s < l->nsteps; s++)
            Py_CLEAR(l->callbacks[s].fn);
    Py_CLEAR(l->keep);
    PyMem_Free(l->memory);
    l->memory = NULL;
    l->slots = l->temp_slots = NULL;
    l->steps = l->finals = NULL;
    l->rows = l->grains = l->temp_offsets = NULL;
    l->callbacks = NULL;
    l->jobs = NULL;
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
    TAKE(jobs, Job, nsteps);
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
int as_address(PyObject *obj, void **out)
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

/* Into how many pieces `total` items go on `threads` threads, pieces of at least `grain`
 * items, up to `per_thread` each: total / grain when that is fewer than the threads (at
 * least 1; 0 for no items), else a multiple of the threads. The one statement of the
 * rule: the cpu backend's threads.chunk_count is this function (module chunk_count). */
int64_t chunk_count(int64_t total, int64_t grain, int64_t threads, int64_t per_thread)
{
    if (total <= 0)
        return 0;
    grain = grain > 1 ? grain : 1;
    threads = threads > 1 ? threads : 1;
    int64_t fits = total / grain;
    if (fits < threads)
        return fits > 1 ? fits : 1;
    int64_t each = per_thread < fits / threads ? per_thread : fits / threads;
    return threads * (each > 1 ? each : 1);
}

PyObject *chunk_count_py(PyObject *module, PyObject *args)
{
    long long total, grain, threads, per_thread = 1;
    if (!PyArg_ParseTuple(args, "LLL|L", &total, &grain, &threads, &per_thread))
        return NULL;
    return PyLong_FromLongLong(chunk_count(total, grain, threads, per_thread));
}

/* threads._pieces, for a known thread count n (a step has rows: total > 0). */
static void split(int64_t total, int64_t grain, int64_t n, int64_t *count)
{
    *count = total > 0 ? chunk_count(total, grain, n, pieces_chunks) : 1;
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

/* A job step's job, (words: bytes, ((slot, byte offset, word),) * 3, threads word or -1,
 * owner), into *j; the owner (what the words' addresses point into) joins l->keep.
 * 0, or -1 with an exception. */
static int parse_job(Launcher *l, PyObject *job, int nbuffers, Job *j)
{
    const char *words;
    Py_ssize_t nbytes;
    PyObject *operands, *owner;
    if (!PyArg_ParseTuple(job, "y#O!iO", &words, &nbytes, &PyTuple_Type, &operands,
                          &j->threads_at, &owner))
        return -1;
    Py_ssize_t nwords = nbytes / (Py_ssize_t)sizeof(int64_t);
    if (nbytes % (Py_ssize_t)sizeof(int64_t) || nwords < 1 || nwords > MAX_JOB_WORDS ||
        j->threads_at >= nwords || j->threads_at < -1 || PyTuple_GET_SIZE(operands) != 3) {
        PyErr_SetString(PyExc_ValueError, "native_plan: a bad job");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        long long offset;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(operands, k), "iLi", &j->slots[k], &offset,
                              &j->at[k]))
            return -1;
        if (j->slots[k] < 0 || j->slots[k] >= nbuffers || offset < 0 || j->at[k] < 0 ||
            j->at[k] >= nwords) {
            PyErr_SetString(PyExc_ValueError, "native_plan: a job's operand out of range");
            return -1;
        }
        j->offsets[k] = offset;
    }
    if (l->keep == NULL && (l->keep = PyList_New(0)) == NULL)
        return -1;
    if (PyList_Append(l->keep, owner) < 0)
        return -1;
    memcpy(j->words, words, (size_t)nbytes);
    j->nwords = (int)nwords;
    return 0;
}

/* Ask the executable for its plan (backends/cpu/backend.py, _Executable.native_plan):
 * (pointer array length, parameter slots, steps, arena) when every step is a call of
 * native kernels: (kernel address, rows) on this thread, (address, rows, grain) over the
 * worker pool, (partial address, parts, 1, final address) a split reduction, (kernel
 * address, rows, grain, job) a job step (see Job); arena None
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
        if (PyTuple_Check(step) && PyTuple_GET_SIZE(step) == 4 &&
            PyTuple_Check(PyTuple_GET_ITEM(step, 3))) {
            PyObject *job;
            if (!PyArg_ParseTuple(step, "O&LLO", as_address, &address, &rows, &grain, &job) ||
                parse_job(l, job, nbuffers, &l->jobs[i]) < 0)
                goto fail;
            if (rows < 1 || grain < 1) {
                PyErr_SetString(PyExc_ValueError, "native_plan: a job step without rows");
                goto fail;
            }
        } else if (!PyArg_ParseTuple(step, "O&L|LO&", as_address, &address, &rows, &grain,
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

/* A job step on this call's pointers: its words with the operands' addresses; one piece
 * (count 1) on this thread with every thread given to the library, else `count` pieces on
 * the pool with one each. The GIL is let go, as ctypes does: a product takes a while. */
static void run_job(const Job *j, kernel_fn kernel, void *const *pointers, int64_t rows,
                    parallel_fn parallel, int64_t count, int64_t helpers)
{
    int64_t words[MAX_JOB_WORDS];
    memcpy(words, j->words, (size_t)j->nwords * sizeof(int64_t));
    for (int k = 0; k < 3; k++)
        words[j->at[k]] = (int64_t)(intptr_t)((char *)pointers[j->slots[k]] + j->offsets[k]);
    if (j->threads_at >= 0)
        words[j->threads_at] = count <= 1 ? helpers + 1 : 1;
    Py_BEGIN_ALLOW_THREADS
    if (count <= 1)
        kernel((void **)words, 0, rows);
    else
        parallel(kernel, (void **)words, rows, count, helpers);
    Py_END_ALLOW_THREADS
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
    /* A job's operand in no buffer is an error that the Python launch raises. */
    for (int s = 0; s < l->nsteps; s++)
        for (int k = 0; l->jobs[s].nwords > 0 && k < 3; k++)
            if (pointers[l->jobs[s].slots[k]] == NULL) {
                Py_XDECREF(arena);
                return 1;
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
        } else if (l->jobs[s].nwords > 0) {
            run_job(&l->jobs[s], l->steps[s], pointers, l->rows[s], parallel[s], counts[s],
                    helpers[s]);
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
int launcher_run(Launcher *l, void *const *addresses, Py_ssize_t n, PyObject *handles)
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

PyTypeObject LauncherType = {
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


PyObject *forget_pieces(PyObject *module, PyObject *unused)
{
    pieces_threads = 0;
    Py_CLEAR(pieces_seen);
    Py_RETURN_NONE;
}

PyObject *set_parallel(PyObject *module, PyObject *args)
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
