/* mlirgpu.Dispatcher: the launch fast path of @mlirgpu.kernel. A call reads
 * each argument once, writes its signature as 64-bit words, finds the words
 * in an open-addressing hash table and launches the Function stored there
 * with the pointers already read, once the entry's guards (the globals its
 * kernel's trace read) hold. Nothing Python-level happens on a hit but a
 * tick of the launch clock, which the specialization cache evicts by. */
#include "dispatch/dispatch.h"
#include "dispatch/guards.h"
#include "dispatch/plan.h"
#include "arrays/array.h"
#include "cuda/driver.h"
#include "launch/function.h"
#include "launch/tensor_map.h"

#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* ---------------------------------------------------------------------- */
/* Signatures                                                              */
/* ---------------------------------------------------------------------- */

/* The low byte of an argument's first word. */
enum {
    SIG_ARRAY = 1,   /* device array: dtype, ndim, contiguous, device; then shape (and strides) */
    SIG_HOST,        /* NumPy array or CPU tensor: same layout; never hits */
    SIG_BOOL,        /* Python bool */
    SIG_INT,         /* Python int (and int subclasses other than bool) */
    SIG_FLOAT,       /* Python float (and float subclasses that are not NumPy scalars) */
    SIG_NUMPY,       /* NumPy scalar: dtype */
    SIG_OTHER,       /* anything the fast path cannot read: never hits */
    SIG_TENSOR_MAP,  /* mlirgpu.TensorMap: bit 8 says a CPU backend's map, which never hits */
};

#define SIG_NO_DTYPE 0xff
/* A header word, then per argument one word and up to 2 * MG_MAX_NDIM more. */
#define SIG_MAX_WORDS (1 + MG_CU_MAX_ARGS * (1 + 2 * MG_MAX_NDIM))

/* One call's arguments, read once: the signature and what the launch needs. */
typedef struct {
    Py_ssize_t n;                        /* words used */
    mg_cu_read_args read;                /* the arrays' pointers, shapes and producers, for the launch */
    int nviews;
    Py_ssize_t unlaunchable;             /* first argument only `miss` can handle, or -1 */
    int unlaunchable_kind;               /* its SIG_HOST or SIG_OTHER */
    mg_foreign_memo memo;                /* what the readers learn once per call */
    PyObject *views[MG_CU_MAX_ARGS];     /* strong: views the slow path made */
    const uint8_t *dynamic;              /* per argument, bit d: extent d is not part of the signature */
    uint64_t words[SIG_MAX_WORDS];
} sig_builder;

/* Read-only arrays have signatures of their own: a launch registered for a
 * writeable one must not take one that its kernel may store to. */
static inline uint64_t array_word(int kind, const mg_dtype *dtype, int ndim, int contiguous, int readonly, int device)
{
    return (uint64_t)kind | (uint64_t)(dtype ? dtype->id : SIG_NO_DTYPE) << 8 | (uint64_t)ndim << 16 |
           (uint64_t)(contiguous != 0) << 24 | (uint64_t)(readonly != 0) << 25 |
           (uint64_t)(uint32_t)(device + 1) << 32;
}

/* A dynamic extent's word: every size reads the same (no extent is this large), except that a
 * multiple of 16 reads apart, since it selects a variant of its own (DIVISOR in language/generics.py). */
#define SIG_DYNAMIC_EXTENT UINT64_MAX
#define SIG_DYNAMIC_MULTIPLE (UINT64_MAX - 1)
#define SIG_DYNAMIC_WORD(size) ((size) % 16 == 0 ? SIG_DYNAMIC_MULTIPLE : SIG_DYNAMIC_EXTENT)

static void push_layout(sig_builder *b, Py_ssize_t i, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                        int contiguous)
{
    unsigned dynamic = b->dynamic[i];
    for (int d = 0; d < ndim; d++)
        b->words[b->n++] = dynamic >> d & 1 ? SIG_DYNAMIC_WORD(shape[d]) : (uint64_t)shape[d];
    memcpy(b->read.shapes[i], shape, (size_t)ndim * sizeof *shape);
    if (!contiguous)   /* a strided layout is part of what a kernel is compiled for */
        for (int d = 0; d < ndim; d++)
            b->words[b->n++] = (uint64_t)strides[d];
}

static void mark_unlaunchable(sig_builder *b, Py_ssize_t i, int kind)
{
    if (b->unlaunchable < 0) {
        b->unlaunchable = i;
        b->unlaunchable_kind = kind;
    }
}

/* Anything but a DeviceArray or a Python scalar: NumPy scalars, torch
 * tensors, NumPy arrays, CAI and DLPack objects. -1 only for an exception
 * that is not an Exception (KeyboardInterrupt): the rest go to `miss`. */
static int read_other(sig_builder *b, Py_ssize_t i, PyObject *arg)
{
    mg_dtype *dtype;
    mg_foreign info;
    /* A torch, CuPy or JAX array is read at once, skipping the scalar checks */
    int found = mg_array_library_read(arg, &info, 1, &b->memo);
    if (found == MG_NOT_LIBRARY) {
        if (mg_dtype_of_scalar(arg, &dtype)) {
            b->words[b->n++] = SIG_NUMPY | (uint64_t)dtype->id << 8;
            return 0;
        }
        if (PyLong_Check(arg)) {
            b->words[b->n++] = SIG_INT;
            return 0;
        }
        if (PyFloat_Check(arg)) {
            b->words[b->n++] = SIG_FLOAT;
            return 0;
        }
        found = mg_array_foreign_info(arg, &info, &b->memo);
    }
    if (found <= 0) {
        if (found < 0) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return -1;
            PyErr_Clear();   /* `miss` raises the LaunchError that names the parameter */
        }
        b->words[b->n++] = SIG_OTHER;
        mark_unlaunchable(b, i, SIG_OTHER);
        return 0;
    }
    int kind = info.host ? SIG_HOST : SIG_ARRAY;
    b->words[b->n++] = array_word(kind, info.dtype, info.ndim, info.contiguous, info.readonly, info.device);
    push_layout(b, i, info.ndim, info.shape, info.strides, info.contiguous);
    if (info.host) {
        mark_unlaunchable(b, i, SIG_HOST);
        mg_foreign_release(&info);
        return 0;
    }
    b->read.pointers[i] = info.ptr;
    b->read.known |= (uint64_t)1 << i;
    if (info.readonly)
        b->read.readonly |= (uint64_t)1 << i;
    if (info.wait)
        b->read.waits[b->read.nwaits++] = info.producer;
    if (info.view != NULL)
        b->views[b->nviews++] = info.view;   /* the reference moves to the builder */
    return 0;
}

/* Reads every argument; nargs <= MG_CU_MAX_ARGS; `dynamic` (per argument, bit
 * d: extent d is not part of the signature) has MG_CU_MAX_ARGS entries.
 * 0, or -1 with an error set. */
static int sig_build(sig_builder *b, PyObject *const *args, Py_ssize_t nargs, const uint8_t *dynamic)
{
    b->dynamic = dynamic;
    b->n = 0;
    b->read.known = 0;
    b->read.readonly = 0;
    b->read.nwaits = 0;
    b->nviews = 0;
    b->unlaunchable = -1;
    memset(&b->memo, 0, sizeof b->memo);
    /* A Function is loaded into one device's context: the thread's device is part of the key. */
    b->words[b->n++] = (uint64_t)nargs | (uint64_t)(uint32_t)(mg_cu_current_device() + 1) << 32;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = args[i];
        if (mg_array_check_device(arg)) {
            const mg_array *a = (const mg_array *)arg;
            int contiguous = mg_array_is_c_contiguous(arg);
            b->words[b->n++] = array_word(SIG_ARRAY, a->dtype, a->ndim, contiguous, a->readonly, a->device);
            push_layout(b, i, a->ndim, a->shape, a->strides, contiguous);
            b->read.pointers[i] = a->ptr;
            b->read.known |= (uint64_t)1 << i;
            if (a->readonly)
                b->read.readonly |= (uint64_t)1 << i;
        }
        else if (PyFloat_CheckExact(arg)) {
            b->words[b->n++] = SIG_FLOAT;
        }
        else if (PyLong_CheckExact(arg)) {
            b->words[b->n++] = SIG_INT;
        }
        else if (PyBool_Check(arg)) {
            b->words[b->n++] = SIG_BOOL;
        }
        else if (Py_IS_TYPE(arg, mg_cu_TensorMap_type)) {   /* TensorMap has no subclasses */
            /* Its 128 bytes go to the launch as they are: only the kind is part of the key. */
            int host = ((const mg_tensor_map *)arg)->host;
            b->words[b->n++] = SIG_TENSOR_MAP | (uint64_t)host << 8;
            if (host)
                mark_unlaunchable(b, i, SIG_OTHER);
        }
        else if (read_other(b, i, arg) < 0) {
            return -1;
        }
    }
    /* Arrays that all start at a multiple of 16 bytes may launch a variant of their own (ALIGNMENT in
     * language/generics.py): the call's first word says whether they do. */
    int aligned = 1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if ((b->read.known >> i & 1) && b->read.pointers[i] % 16 != 0)
            aligned = 0;
    b->words[0] |= (uint64_t)aligned << 16;
    return 0;
}

static void sig_release(sig_builder *b)
{
    for (int i = 0; i < b->nviews; i++)
        Py_DECREF(b->views[i]);
    b->nviews = 0;
}

static inline uint64_t sig_hash(const uint64_t *words, Py_ssize_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15u ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = (h ^ words[i]) * 0xff51afd7ed558ccdu;
        h ^= h >> 32;
    }
    return h;
}

static PyObject *layout_tuple(const uint64_t *words, int ndim)
{
    PyObject *tuple = PyTuple_New(ndim);
    for (int d = 0; tuple != NULL && d < ndim; d++) {
        /* None: a dynamic extent, which any size matches. */
        PyObject *item = words[d] >= SIG_DYNAMIC_MULTIPLE ? Py_NewRef(Py_None)
                                                        : PyLong_FromSsize_t((Py_ssize_t)words[d]);
        if (item == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, d, item);
    }
    return tuple;
}

/* The readable form of the words of `args` (header excluded): one tuple
 * per argument, see docs/design/dispatch.md. */
static PyObject *sig_describe(const sig_builder *b, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *result = PyTuple_New(nargs);
    const uint64_t *w = b->words + 1;
    for (Py_ssize_t i = 0; result != NULL && i < nargs; i++) {
        uint64_t word = *w++;
        int kind = (int)(word & 0xff), id = (int)(word >> 8 & 0xff);
        PyObject *item = NULL, *dtype = id == SIG_NO_DTYPE ? Py_None : (PyObject *)mg_dtype_get((mg_dtype_id)id);
        if (kind == SIG_ARRAY || kind == SIG_HOST) {
            int ndim = (int)(word >> 16 & 0xff), contiguous = (int)(word >> 24 & 1);
            int device = (int)(uint32_t)(word >> 32) - 1;
            PyObject *shape = layout_tuple(w, ndim);
            w += ndim;
            PyObject *strides = contiguous ? Py_NewRef(Py_None) : layout_tuple(w, ndim);
            w += contiguous ? 0 : ndim;
            if (shape != NULL && strides != NULL)
                item = kind == SIG_ARRAY ? Py_BuildValue("(sOOOi)", "array", dtype, shape, strides, device)
                                         : Py_BuildValue("(sOOO)", "host", dtype, shape, strides);
            Py_XDECREF(shape);
            Py_XDECREF(strides);
        }
        else if (kind == SIG_NUMPY) {
            item = Py_BuildValue("(sO)", "numpy", dtype);
        }
        else if (kind == SIG_TENSOR_MAP) {
            item = Py_BuildValue("(sO)", "tensormap", id ? Py_True : Py_False);
        }
        else if (kind == SIG_OTHER) {
            item = Py_BuildValue("(sO)", "other", (PyObject *)Py_TYPE(args[i]));
        }
        else {
            PyTypeObject *type = kind == SIG_BOOL ? &PyBool_Type : kind == SIG_INT ? &PyLong_Type : &PyFloat_Type;
            item = Py_BuildValue("(sO)", "python", (PyObject *)type);
        }
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyTuple_SET_ITEM(result, i, item);
    }
    return result;
}

/* ---------------------------------------------------------------------- */
/* The table                                                               */
/* ---------------------------------------------------------------------- */

typedef struct {
    uint64_t hash;
    uint64_t *words;     /* PyMem_Malloc'd copy */
    Py_ssize_t nwords;
    PyObject *target;    /* strong; NULL marks an empty slot */
    PyObject *guards;    /* strong: a tuple of guards (guards.h), or NULL for none */
    struct mg_dispatcher *owner; /* strong: whose last_used a hit ticks, or NULL for the table's own */
} sig_entry;

typedef struct mg_dispatcher {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *miss;      /* miss(args, kwargs) */
    PyObject *name;
    PyObject *dict;      /* attributes (functools.update_wrapper) */
    PyObject *weakrefs;
    sig_entry *entries;  /* capacity slots (a power of two), or NULL */
    Py_ssize_t capacity;
    Py_ssize_t count;
    uint8_t dynamic[MG_CU_MAX_ARGS]; /* per argument, bit d: its extent d is dynamic (set_dynamic) */
    unsigned long long last_used;    /* the launch clock when it (or an entry it owns) was last used */
} mg_dispatcher;

/* Ticks once per use of any dispatcher (under the GIL): a hit costs a store, not a Python call. */
static unsigned long long launch_clock;

#define TABLE_INITIAL 8

PyTypeObject *mg_Dispatcher_type;

/* The slot holding `words`, or the empty slot where they would go. */
static inline sig_entry *table_find(sig_entry *entries, Py_ssize_t capacity, uint64_t hash,
                                    const uint64_t *words, Py_ssize_t n)
{
    size_t mask = (size_t)capacity - 1, i = (size_t)hash & mask;
    for (;;) {
        sig_entry *e = &entries[i];
        if (e->target == NULL ||
            (e->hash == hash && e->nwords == n && memcmp(e->words, words, (size_t)n * sizeof *words) == 0))
            return e;
        i = (i + 1) & mask;
    }
}

static int table_grow(mg_dispatcher *self)
{
    Py_ssize_t capacity = self->capacity ? self->capacity * 2 : TABLE_INITIAL;
    sig_entry *entries = PyMem_Calloc((size_t)capacity, sizeof *entries);
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->capacity; i++) {
        sig_entry *old = &self->entries[i];
        if (old->target != NULL)
            *table_find(entries, capacity, old->hash, old->words, old->nwords) = *old;
    }
    PyMem_Free(self->entries);
    self->entries = entries;
    self->capacity = capacity;
    return 0;
}

/* Stores `target`, `guards` and `owner` (NULL for none; new references are taken) under the words of `b`. */
static int table_insert(mg_dispatcher *self, const sig_builder *b, PyObject *target, PyObject *guards,
                        mg_dispatcher *owner)
{
    if ((self->count + 1) * 2 > self->capacity && table_grow(self) < 0)
        return -1;
    uint64_t hash = sig_hash(b->words, b->n);
    sig_entry *e = table_find(self->entries, self->capacity, hash, b->words, b->n);
    if (e->target != NULL) {
        /* Same signature again: the new target, guards and owner replace the old ones. */
        Py_SETREF(e->target, Py_NewRef(target));
        Py_XSETREF(e->guards, Py_XNewRef(guards));
        Py_XSETREF(e->owner, (mg_dispatcher *)Py_XNewRef((PyObject *)owner));
        return 0;
    }
    uint64_t *words = PyMem_Malloc((size_t)b->n * sizeof *words);
    if (words == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(words, b->words, (size_t)b->n * sizeof *words);
    e->hash = hash;
    e->words = words;
    e->nwords = b->n;
    e->target = Py_NewRef(target);
    e->guards = Py_XNewRef(guards);
    e->owner = (mg_dispatcher *)Py_XNewRef((PyObject *)owner);
    self->count++;
    return 0;
}

static void table_clear(mg_dispatcher *self)
{
    /* Detach first: a target's finalizer may call back into this dispatcher. */
    sig_entry *entries = self->entries;
    Py_ssize_t capacity = self->capacity;
    self->entries = NULL;
    self->capacity = self->count = 0;
    for (Py_ssize_t i = 0; i < capacity; i++) {
        if (entries[i].target != NULL) {
            PyMem_Free(entries[i].words);
            Py_DECREF(entries[i].target);
            Py_XDECREF(entries[i].guards);
            Py_XDECREF(entries[i].owner);
        }
    }
    PyMem_Free(entries);
}

/* ---------------------------------------------------------------------- */
/* Dispatcher                                                              */
/* ---------------------------------------------------------------------- */

/* miss(args_tuple, kwargs_dict). */
static PyObject *call_miss(mg_dispatcher *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *tuple = PyTuple_New(nargs), *kwargs = PyDict_New(), *result = NULL;
    if (tuple == NULL || kwargs == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
            goto error;
    result = PyObject_CallFunctionObjArgs(self->miss, tuple, kwargs, NULL);
error:
    Py_XDECREF(tuple);
    Py_XDECREF(kwargs);
    return result;
}

static PyObject *dispatcher_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    mg_dispatcher *self = (mg_dispatcher *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs > MG_CU_MAX_ARGS || self->count == 0)
        return call_miss(self, args, nargs, kwnames);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (!mg_cu_is_launch_keyword(PyTuple_GET_ITEM(kwnames, i)))
            return call_miss(self, args, nargs, kwnames);

    /* The keywords first: user code they run cannot free what the arguments'
     * pointers, read next, point to. An error is the launch's to raise. */
    mg_cu_launch_config config;
    int configured = mg_cu_launch_config_parse(args + nargs, kwnames, &config) == 0;
    if (!configured) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    sig_builder b;
    if (sig_build(&b, args, nargs, self->dynamic) < 0) {
        sig_release(&b);
        return NULL;
    }
    /* Reading the arguments ran Python code (__cuda_array_interface__,
     * __dlpack__, torch's methods), which may have cleared or grown the
     * table, here or from another thread: it is read only now. */
    PyObject *target = NULL, *guards = NULL;
    if (b.unlaunchable < 0 && self->count > 0) {
        sig_entry *e = table_find(self->entries, self->capacity, sig_hash(b.words, b.n), b.words, b.n);
        target = e->target;
        guards = e->guards;
        if (target != NULL)
            (e->owner != NULL ? e->owner : self)->last_used = ++launch_clock;
    }
    if (target == NULL) {
        sig_release(&b);
        return call_miss(self, args, nargs, kwnames);
    }
    /* Held across the guards and the launch: a lookup or packing may run Python code that clears the table. */
    Py_INCREF(target);
    if (guards != NULL) {
        Py_INCREF(guards);
        int hold = mg_guards_hold(guards);
        Py_DECREF(guards);
        if (hold <= 0) {
            Py_DECREF(target);
            sig_release(&b);
            return hold < 0 ? NULL : call_miss(self, args, nargs, kwnames);
        }
    }
    PyObject *result = NULL;
    if (Py_IS_TYPE(target, mg_cu_Function_type)) {
        result = mg_cu_function_launch_known(target, args, nargs, kwnames, configured ? &config : NULL, &b.read);
    }
    else if (Py_IS_TYPE(target, mg_LaunchPlan_type)) {
        /* The plan's stream getter is a builtin: the pointers in b.read stay good across it. */
        if (mg_launch_plan_call(target, args, nargs, &b.read, &result) == 0) {
            Py_DECREF(target);
            sig_release(&b);
            return call_miss(self, args, nargs, kwnames);
        }
    }
    else
        result = PyObject_Vectorcall(target, args, nargsf, kwnames);
    Py_DECREF(target);
    sig_release(&b);
    return result;
}

/* register()'s and signature()'s `args`: a tuple or list, as a new tuple in *tuple. */
static int args_from(PyObject *args, PyObject **tuple)
{
    if (!PyTuple_Check(args) && !PyList_Check(args)) {
        PyErr_Format(PyExc_TypeError, "args must be a tuple or list of arguments, not %.100s",
                     Py_TYPE(args)->tp_name);
        return -1;
    }
    *tuple = PySequence_Tuple(args);
    if (*tuple == NULL)
        return -1;
    if (PyTuple_GET_SIZE(*tuple) > MG_CU_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "at most %d arguments can be passed, got %zd", MG_CU_MAX_ARGS,
                     PyTuple_GET_SIZE(*tuple));
        Py_CLEAR(*tuple);
        return -1;
    }
    return 0;
}

static PyObject *dispatcher_register(mg_dispatcher *self, PyObject *const *fargs, Py_ssize_t nfargs)
{
    if (nfargs < 2 || nfargs > 4)
        return PyErr_Format(PyExc_TypeError, "register(args, function, guards=None, owner=None) takes 2 to 4 "
                            "arguments, got %zd", nfargs);
    PyObject *target = fargs[1], *guards = nfargs >= 3 && fargs[2] != Py_None ? fargs[2] : NULL, *tuple;
    PyObject *owner = nfargs == 4 && fargs[3] != Py_None ? fargs[3] : NULL;
    if (owner != NULL && !PyObject_TypeCheck(owner, mg_Dispatcher_type))
        return PyErr_Format(PyExc_TypeError, "register's owner must be a Dispatcher, not %.100s",
                            Py_TYPE(owner)->tp_name);
    if (!PyCallable_Check(target) && !Py_IS_TYPE(target, mg_LaunchPlan_type))
        return PyErr_Format(PyExc_TypeError, "register needs an mlirgpu Function, a LaunchPlan or a callable, "
                            "not %.100s", Py_TYPE(target)->tp_name);
    if (guards != NULL && mg_guards_validate(guards) < 0)
        return NULL;
    if (args_from(fargs[0], &tuple) < 0)
        return NULL;
    Py_ssize_t nargs = PyTuple_GET_SIZE(tuple);
    PyObject *result = NULL;
    sig_builder *b = PyMem_Malloc(sizeof *b);
    if (b == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    b->nviews = 0;
    if (Py_IS_TYPE(target, mg_cu_Function_type) && mg_cu_function_nparams(target) >= 0 &&
        mg_cu_function_nparams(target) != nargs) {
        PyErr_Format(PyExc_ValueError, "the function's signature has %d parameters, args has %zd",
                     mg_cu_function_nparams(target), nargs);
        goto error;
    }
    if (sig_build(b, &PyTuple_GET_ITEM(tuple, 0), nargs, self->dynamic) < 0)
        goto error;
    if (b->unlaunchable >= 0) {
        PyObject *arg = PyTuple_GET_ITEM(tuple, b->unlaunchable);
        if (b->unlaunchable_kind == SIG_HOST)
            PyErr_Format(PyExc_ValueError, "argument %zd is a host array, which never takes the fast path: "
                         "register the device arguments the launch used", b->unlaunchable);
        else
            PyErr_Format(PyExc_ValueError, "argument %zd (%.100s) has no signature: it is not an array, "
                         "a Python or NumPy scalar", b->unlaunchable, Py_TYPE(arg)->tp_name);
        goto error;
    }
    if (table_insert(self, b, target, guards, (mg_dispatcher *)owner) < 0)
        goto error;
    result = Py_NewRef(Py_None);
error:
    if (b != NULL)
        sig_release(b);
    PyMem_Free(b);
    Py_DECREF(tuple);
    return result;
}

static PyObject *dispatcher_signature(mg_dispatcher *self, PyObject *args)
{
    PyObject *tuple, *result = NULL;
    if (args_from(args, &tuple) < 0)
        return NULL;
    sig_builder *b = PyMem_Malloc(sizeof *b);
    if (b == NULL) {
        Py_DECREF(tuple);
        return PyErr_NoMemory();
    }
    b->nviews = 0;
    if (sig_build(b, &PyTuple_GET_ITEM(tuple, 0), PyTuple_GET_SIZE(tuple), self->dynamic) == 0)
        result = sig_describe(b, &PyTuple_GET_ITEM(tuple, 0), PyTuple_GET_SIZE(tuple));
    sig_release(b);
    PyMem_Free(b);
    Py_DECREF(tuple);
    return result;
}

/* set_dynamic(dims): dims[i] lists the dimensions of argument i whose extent
 * is dynamic (not part of the signature); the table is cleared. */
static PyObject *dispatcher_set_dynamic(mg_dispatcher *self, PyObject *dims)
{
    uint8_t dynamic[MG_CU_MAX_ARGS] = {0};
    PyObject *seq = PySequence_Fast(dims, "set_dynamic takes a sequence of dimension lists, one per argument");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MG_CU_MAX_ARGS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d arguments, got %zd", MG_CU_MAX_ARGS, n);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *inner = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "each entry is a list of dimensions");
        if (inner == NULL)
            goto error;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(inner); k++) {
            long d = PyLong_AsLong(PySequence_Fast_GET_ITEM(inner, k));
            if (d < 0 || d >= MG_MAX_NDIM) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "a dimension must be in [0, %d), got %ld", MG_MAX_NDIM, d);
                Py_DECREF(inner);
                goto error;
            }
            dynamic[i] |= (uint8_t)(1u << d);
        }
        Py_DECREF(inner);
    }
    Py_DECREF(seq);
    table_clear(self);
    memcpy(self->dynamic, dynamic, sizeof dynamic);
    Py_RETURN_NONE;
error:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *dispatcher_clear_method(mg_dispatcher *self, PyObject *unused)
{
    table_clear(self);
    Py_RETURN_NONE;
}

static PyObject *dispatcher_touch(mg_dispatcher *self, PyObject *unused)
{
    self->last_used = ++launch_clock;
    Py_RETURN_NONE;
}

static Py_ssize_t dispatcher_length(mg_dispatcher *self)
{
    return self->count;
}

static PyObject *dispatcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"miss", "name", NULL};
    PyObject *miss, *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU:Dispatcher", keywords, &miss, &name))
        return NULL;
    if (!PyCallable_Check(miss))
        return PyErr_Format(PyExc_TypeError, "miss must be callable, not %.100s", Py_TYPE(miss)->tp_name);
    mg_dispatcher *self = (mg_dispatcher *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = dispatcher_vectorcall;
    self->miss = Py_NewRef(miss);
    self->name = Py_NewRef(name);
    return (PyObject *)self;
}

static int dispatcher_traverse(mg_dispatcher *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->miss);
    Py_VISIT(self->dict);
    for (Py_ssize_t i = 0; i < self->capacity; i++) {
        Py_VISIT(self->entries[i].target);
        Py_VISIT(self->entries[i].guards);
        Py_VISIT((PyObject *)self->entries[i].owner);
    }
    return 0;
}

static int dispatcher_clear(mg_dispatcher *self)
{
    Py_CLEAR(self->miss);
    Py_CLEAR(self->dict);
    table_clear(self);
    return 0;
}

static void dispatcher_dealloc(mg_dispatcher *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    dispatcher_clear(self);
    Py_CLEAR(self->name);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *dispatcher_repr(mg_dispatcher *self)
{
    return PyUnicode_FromFormat("<mlirgpu.Dispatcher '%U', %zd signature%s>", self->name, self->count,
                                self->count == 1 ? "" : "s");
}

static PyMethodDef dispatcher_methods[] = {
    {"register", (PyCFunction)(void (*)(void))dispatcher_register, METH_FASTCALL,
     "register(args, function, guards=None, owner=None): later calls whose arguments have the signature of `args` "
     "launch `function` (an mlirgpu Function or a LaunchPlan, launched in C; any other callable is called with "
     "the call's arguments) while every guard holds, and miss otherwise; each such call ticks the last_used of "
     "`owner` (a Dispatcher; None: this one). `guards` is a tuple of (namespace, key, value, witness): "
     "(dict, name, value, witness) holds while dict[name] is value (Dispatcher.UNBOUND: absent), (cell, None, "
     "value, witness) while the cell holds value (UNBOUND: empty), (function, None, code, None) while "
     "function.__code__ is code; a witness other than None is a list value's items as a tuple, or a "
     "C-contiguous copy of a NumPy array value, whose dtype object, shape and bytes must match too."},
    {"signature", (PyCFunction)dispatcher_signature, METH_O,
     "signature(args): the signature of a call with these positional arguments, one tuple per argument."},
    {"clear", (PyCFunction)dispatcher_clear_method, METH_NOARGS, "Forgets every registered signature."},
    {"touch", (PyCFunction)dispatcher_touch, METH_NOARGS,
     "Sets last_used to the next tick of the launch clock, as a call that hits does."},
    {"set_dynamic", (PyCFunction)dispatcher_set_dynamic, METH_O,
     "set_dynamic(dims): dims[i] lists the dimensions of argument i whose extent is dynamic: any size matches "
     "them (the signature shows None). Forgets every registered signature."},
    {NULL},
};

static PyMemberDef dispatcher_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(mg_dispatcher, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(mg_dispatcher, dict), READONLY},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(mg_dispatcher, weakrefs), READONLY},
    {"name", T_OBJECT, offsetof(mg_dispatcher, name), READONLY, NULL},
    {"miss", T_OBJECT, offsetof(mg_dispatcher, miss), READONLY, "miss(args, kwargs), called on a miss."},
    {"last_used", T_ULONGLONG, offsetof(mg_dispatcher, last_used), READONLY,
     "The launch clock's tick at its last touch() or hit (of a registered owner: at a hit of its entries), "
     "0 before any: a larger one was used later."},
    {NULL},
};

static PyGetSetDef dispatcher_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyType_Slot dispatcher_slots[] = {
    {Py_tp_doc, "Dispatcher(miss, name): call it as d(*args, grid=, block=, shared_mem=0, stream=None, "
                "cluster=None). A call "
                "whose argument signature was registered launches the stored Function from C; any other "
                "returns miss(args, kwargs)."},
    {Py_tp_new, dispatcher_new},
    {Py_tp_dealloc, dispatcher_dealloc},
    {Py_tp_traverse, dispatcher_traverse},
    {Py_tp_clear, dispatcher_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_repr, dispatcher_repr},
    {Py_tp_methods, dispatcher_methods},
    {Py_tp_members, dispatcher_members},
    {Py_tp_getset, dispatcher_getset},
    {Py_mp_length, dispatcher_length},
    {0, NULL},
};

static PyType_Spec dispatcher_spec = {
    .name = "mlirgpu.Dispatcher",
    .basicsize = sizeof(mg_dispatcher),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = dispatcher_slots,
};

int mg_dispatch_init(PyObject *module)
{
    mg_Dispatcher_type = mg_add_type(module, &dispatcher_spec, NULL);
    if (mg_Dispatcher_type == NULL || mg_guards_init() < 0)
        return -1;
    /* What a guard's value reads where its name or cell is unbound. */
    if (mg_launch_plan_init(module) < 0)
        return -1;
    return PyObject_SetAttrString((PyObject *)mg_Dispatcher_type, "UNBOUND", mg_guard_unbound);
}
