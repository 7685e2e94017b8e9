/* The CPU backend's runtime (see cpu.h and docs/cpu.md).
 *
 * A launch runs the grid's blocks one after another. Within a block every
 * thread is a fiber with its own stack; the scheduler (the launching thread's
 * own context) resumes each fiber in turn until it returns or reaches
 * mg_cpu_barrier, which switches back. When a sweep over the block leaves
 * every fiber at a barrier, all are released; when some have returned while
 * others wait, that is barrier divergence and the launch stops with
 * mlirgpu.KernelError. Fibers never unwind: an abandoned fiber's stack is
 * simply reused by the next block or launch. The GIL is held throughout, so
 * the scheduler's state can be process-wide. */
#include "cpu.h"
#include "ir.h"

#include <mlir-c/ExecutionEngine.h>
#include <setjmp.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <numpy/ndarraytypes.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL mg_ARRAY_API
#include <numpy/arrayobject.h>

extern _Thread_local jmp_buf *mg_fatal_target; /* ir.c: LLVM fatal errors longjmp there */

#define MG_CPU_STACK (64 * 1024)
#define MG_CPU_MAX_THREADS 1024 /* threads per block, as on the GPU */
#define MG_CPU_NINDEX 12        /* thread, block, block_dim, grid_dim: x, y, z each */

/* ------------------------------------------------------------------------ */
/* Fibers and the scheduler                                                  */

typedef void (*mg_packed_fn)(void **);

enum { FIBER_READY, FIBER_AT_BARRIER, FIBER_DONE };

typedef struct {
    ucontext_t context;
    int state;
    int32_t line; /* the barrier it waits at */
} mg_fiber;

static struct {
    ucontext_t scheduler;
    mg_fiber *fibers;
    char *stacks;      /* one mapping: per fiber a guard page, then its stack */
    size_t capacity;   /* fibers (and stacks) allocated */
    size_t page;
    int current;
    mg_packed_fn function;
    void ***arguments; /* per thread: the packed argument array */
} sched;

static size_t stack_stride(void) { return sched.page + MG_CPU_STACK; }

/* Grows the fiber pool to `n` (kept across launches: stacks are reused). */
static int reserve_fibers(size_t n)
{
    if (n <= sched.capacity)
        return 0;
    if (sched.page == 0)
        sched.page = (size_t)sysconf(_SC_PAGESIZE);
    mg_fiber *fibers = PyMem_Calloc(n, sizeof *fibers);
    if (fibers == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char *stacks = mmap(NULL, n * stack_stride(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stacks == MAP_FAILED) {
        PyMem_Free(fibers);
        PyErr_SetFromErrno(PyExc_MemoryError);
        return -1;
    }
    /* A guard page under each stack: an overflow faults instead of corrupting its neighbour. */
    for (size_t i = 0; i < n; i++)
        mprotect(stacks + i * stack_stride(), sched.page, PROT_NONE);
    if (sched.stacks != NULL)
        munmap(sched.stacks, sched.capacity * stack_stride());
    PyMem_Free(sched.fibers);
    sched.fibers = fibers;
    sched.stacks = stacks;
    sched.capacity = n;
    return 0;
}

static void fiber_main(void)
{
    int t = sched.current;
    sched.function(sched.arguments[t]);
    sched.fibers[t].state = FIBER_DONE;
    /* Returning resumes uc_link: the scheduler. */
}

void mg_cpu_barrier(int32_t line)
{
    mg_fiber *f = &sched.fibers[sched.current];
    f->state = FIBER_AT_BARRIER;
    f->line = line;
    swapcontext(&f->context, &sched.scheduler);
}

/* Runs one block of `n` threads; -1 with KernelError on barrier divergence. */
static int run_block(int n, const int64_t *block, const int64_t *bdim, const char *source)
{
    for (int t = 0; t < n; t++) {
        mg_fiber *f = &sched.fibers[t];
        getcontext(&f->context);
        f->context.uc_stack.ss_sp = sched.stacks + (size_t)t * stack_stride() + sched.page;
        f->context.uc_stack.ss_size = MG_CPU_STACK;
        f->context.uc_link = &sched.scheduler;
        makecontext(&f->context, fiber_main, 0);
        f->state = FIBER_READY;
    }
    for (;;) {
        for (int t = 0; t < n; t++) {
            if (sched.fibers[t].state == FIBER_DONE)
                continue;
            sched.fibers[t].state = FIBER_READY;
            sched.current = t;
            swapcontext(&sched.scheduler, &sched.fibers[t].context);
        }
        int waiting = -1, done = -1;
        for (int t = 0; t < n; t++) {
            if (sched.fibers[t].state == FIBER_AT_BARRIER) {
                if (waiting < 0)
                    waiting = t;
            } else if (done < 0) {
                done = t;
            }
        }
        if (waiting < 0)
            return 0;
        if (done >= 0) {
            int64_t wx = waiting % bdim[0], wy = waiting / bdim[0] % bdim[1], wz = waiting / (bdim[0] * bdim[1]);
            int64_t dx = done % bdim[0], dy = done / bdim[0] % bdim[1], dz = done / (bdim[0] * bdim[1]);
            mg_raise(mg_st->KernelError,
                     "barrier divergence at %s:%d: thread (%lld, %lld, %lld) of block (%lld, %lld, %lld) "
                     "waits at mg.syncthreads() on line %d, but thread (%lld, %lld, %lld) returned "
                     "without reaching it",
                     source, (int)sched.fibers[waiting].line, (long long)wx, (long long)wy, (long long)wz,
                     (long long)block[0], (long long)block[1], (long long)block[2],
                     (int)sched.fibers[waiting].line, (long long)dx, (long long)dy, (long long)dz);
            return -1;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* CpuEngine                                                                 */

enum { PARAM_MEMREF, PARAM_SCALAR };

typedef struct {
    int kind;
    int rank;        /* memref */
    Py_ssize_t size; /* memref: element size; scalar: bytes */
} mg_cpu_param;

typedef struct {
    PyObject_HEAD
    MlirExecutionEngine engine;
    mg_packed_fn function;
    mg_cpu_param *params;
    Py_ssize_t nparams;
    int uses_barrier;
    PyObject *name;   /* str */
    PyObject *source; /* str: the kernel's file, for errors */
} mg_CpuEngine;

static PyTypeObject *CpuEngineType;

static int parse_params(mg_CpuEngine *self, PyObject *params)
{
    PyObject *seq = PySequence_Fast(params, "params must be a sequence of (kind, rank, size) tuples");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->params = PyMem_Calloc(n ? (size_t)n : 1, sizeof *self->params);
    if (self->params == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *kind;
        int rank;
        Py_ssize_t size;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sin:param", &kind, &rank, &size)) {
            Py_DECREF(seq);
            return -1;
        }
        mg_cpu_param *p = &self->params[i];
        if (strcmp(kind, "memref") == 0 && rank >= 0 && rank <= 8 && size > 0)
            *p = (mg_cpu_param){PARAM_MEMREF, rank, size};
        else if (strcmp(kind, "scalar") == 0 && size > 0 && size <= 16)
            *p = (mg_cpu_param){PARAM_SCALAR, 0, size};
        else {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "param %zd: bad (kind, rank, size) (%s, %d, %zd)", i, kind, rank, size);
            return -1;
        }
    }
    self->nparams = n;
    Py_DECREF(seq);
    return 0;
}

/* mlirExecutionEngineCreate; 1 if LLVM hit a fatal error inside. */
static int create_guarded(MlirModule module, int opt_level, MlirExecutionEngine *engine)
{
    jmp_buf target;
    mg_fatal_target = &target;
    if (setjmp(target) != 0) {
        mg_fatal_target = NULL;
        return 1;
    }
    /* Position-independent code: with the small code model a JIT'd call or
     * data reference reaches +-2 GB only, and a process holding a CUDA
     * context has reserved so much address space that the JIT's memory can
     * land farther than that from libc and from our runtime functions. */
    *engine = mlirExecutionEngineCreate(module, opt_level, 0, NULL, false, true);
    mg_fatal_target = NULL;
    return 0;
}

static PyObject *CpuEngine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"module", "name", "params", "source", "uses_barrier", "opt_level", NULL};
    PyObject *module, *name, *params, *source;
    int uses_barrier = 1, opt_level = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUOU|pi:CpuEngine", kwlist, &module, &name, &params, &source,
                                     &uses_barrier, &opt_level))
        return NULL;
    if (opt_level < 0 || opt_level > 3)
        return PyErr_Format(PyExc_ValueError, "opt_level must be 0..3, not %d", opt_level);
    mg_ir_Operation *op = mg_ir_module_operation(module);
    if (op == NULL)
        return NULL;
    mg_CpuEngine *self = (mg_CpuEngine *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->source = Py_NewRef(source);
    self->uses_barrier = uses_barrier;
    if (parse_params(self, params) < 0)
        goto error;

    mg_ir_Context *ctx = op->context;
    mg_ir_diag_clear(ctx);
    if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx)) {
        mg_ir_diag_raise(ctx, mg_st->MLIRError, "the host module does not verify");
        goto error;
    }
    MlirModule m = mlirModuleFromOperation(op->op);
    if (create_guarded(m, opt_level, &self->engine)) {
        self->engine.ptr = NULL; /* half-built by LLVM: leaked, never touched */
        mg_raise(mg_st->CompileError, "LLVM failed while JIT-compiling %U for the host", name);
        goto error;
    }
    if (mlirExecutionEngineIsNull(self->engine)) {
        if (mg_ir_diag_has_error(ctx))
            mg_ir_diag_raise(ctx, mg_st->CompileError, "JIT-compiling the host module failed");
        else
            mg_raise(mg_st->CompileError, "JIT-compiling %U for the host failed (is it lowered to the llvm "
                                          "dialect?)", name);
        goto error;
    }
    mlirExecutionEngineRegisterSymbol(self->engine, mlirStringRefCreateFromCString("mg_cpu_barrier"),
                                      (void *)mg_cpu_barrier);
    mlirExecutionEngineInitialize(self->engine);
    PyObject *packed = PyUnicode_FromFormat("_mlir_ciface_%U", name);
    if (packed == NULL)
        goto error;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(packed, &len);
    if (text != NULL)
        self->function = (mg_packed_fn)mlirExecutionEngineLookupPacked(self->engine,
                                                                      mlirStringRefCreate(text, (size_t)len));
    Py_DECREF(packed);
    if (text == NULL)
        goto error;
    if (self->function == NULL) {
        mg_raise(mg_st->CompileError, "the host module has no function %U with llvm.emit_c_interface", name);
        goto error;
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static void CpuEngine_dealloc(mg_CpuEngine *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (!mlirExecutionEngineIsNull(self->engine))
        mlirExecutionEngineDestroy(self->engine);
    PyMem_Free(self->params);
    Py_XDECREF(self->name);
    Py_XDECREF(self->source);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* A (x, y, z) of positive ints, or an int (y = z = 1). */
static int dim3(PyObject *obj, const char *what, int64_t out[3])
{
    out[0] = out[1] = out[2] = 1;
    if (PyLong_Check(obj)) {
        out[0] = PyLong_AsLongLong(obj);
    } else {
        PyObject *seq = PySequence_Fast(obj, "");
        if (seq == NULL || PySequence_Fast_GET_SIZE(seq) < 1 || PySequence_Fast_GET_SIZE(seq) > 3) {
            Py_XDECREF(seq);
            PyErr_Clear();
            mg_raise(mg_st->LaunchError, "%s must be an int or a tuple of 1 to 3 ints", what);
            return -1;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (out[i] == -1 && PyErr_Occurred())
                break;
        }
        Py_DECREF(seq);
    }
    if (PyErr_Occurred()) {
        PyErr_Clear();
        mg_raise(mg_st->LaunchError, "%s must be an int or a tuple of 1 to 3 ints", what);
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (out[i] < 1 || out[i] > INT32_MAX) {
            mg_raise(mg_st->LaunchError, "%s[%d] = %lld is not in 1..2**31-1", what, i, (long long)out[i]);
            return -1;
        }
    return 0;
}

/* launch(args, grid, block, shared_mem=0): args as the kernel's parameters
 * (C-contiguous aligned writeable ndarrays for memrefs, bytes for scalars). */
static PyObject *CpuEngine_launch(mg_CpuEngine *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"args", "grid", "block", "shared_mem", NULL};
    PyObject *arglist, *gridobj, *blockobj;
    Py_ssize_t shared_mem = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|n:launch", kwlist, &arglist, &gridobj, &blockobj, &shared_mem))
        return NULL;
    int64_t grid[3], block[3];
    if (dim3(gridobj, "grid", grid) < 0 || dim3(blockobj, "block", block) < 0)
        return NULL;
    int64_t nthreads = block[0] * block[1] * block[2];
    if (nthreads > MG_CPU_MAX_THREADS)
        return mg_raise(mg_st->LaunchError, "block has %lld threads; at most %d", (long long)nthreads,
                        MG_CPU_MAX_THREADS);
    if (shared_mem != 0)
        return mg_raise(mg_st->LaunchError, "dynamic shared memory is not supported on the CPU backend yet");
    PyObject *seq = PySequence_Fast(arglist, "args must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = self->nparams;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        return mg_raise(mg_st->LaunchError, "%U takes %zd arguments, got %zd", self->name, n,
                        PySequence_Fast_GET_SIZE(seq));
    }

    /* One allocation: descriptors and scalar slots (shared by all threads),
     * then per thread its packed argument array and its 12 index values. */
    size_t ndesc = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        ndesc += self->params[i].kind == PARAM_MEMREF ? 3 + 2 * (size_t)self->params[i].rank : 2;
    size_t nargs = (size_t)n + MG_CPU_NINDEX;
    size_t bytes = ndesc * 8 + (size_t)n * sizeof(void *) + (size_t)nthreads * (nargs * sizeof(void *) +
                   MG_CPU_NINDEX * sizeof(int64_t) + sizeof(void **));
    char *memory = PyMem_Calloc(1, bytes);
    if (memory == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int64_t *slots = (int64_t *)memory;
    void **descriptors = (void **)(slots + ndesc); /* per param: what its packed slot points to */
    void ***per_thread = (void ***)(descriptors + n);
    void **packed = (void **)(per_thread + nthreads);
    int64_t *indices = (int64_t *)(packed + (size_t)nthreads * nargs);

    PyObject *result = NULL;
    int64_t *slot = slots;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PySequence_Fast_GET_ITEM(seq, i);
        mg_cpu_param *p = &self->params[i];
        if (p->kind == PARAM_SCALAR) {
            if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) != p->size) {
                mg_raise(mg_st->LaunchError, "argument %zd: expected %zd bytes of a scalar", i, p->size);
                goto done;
            }
            memcpy(slot, PyBytes_AS_STRING(arg), (size_t)p->size);
            descriptors[i] = slot;
            slot += 2;
            continue;
        }
        if (!PyArray_Check(arg)) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected a numpy.ndarray, not %.100s", i,
                     Py_TYPE(arg)->tp_name);
            goto done;
        }
        PyArrayObject *a = (PyArrayObject *)arg;
        if (PyArray_NDIM(a) != p->rank || PyArray_ITEMSIZE(a) != p->size ||
            !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || !PyArray_ISWRITEABLE(a)) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected a C-contiguous, aligned, writeable array of "
                     "rank %d and item size %zd", i, p->rank, p->size);
            goto done;
        }
        /* {allocated, aligned, offset, sizes[rank], strides[rank]} in elements */
        slot[0] = (int64_t)(intptr_t)PyArray_DATA(a);
        slot[1] = (int64_t)(intptr_t)PyArray_DATA(a);
        slot[2] = 0;
        for (int d = 0; d < p->rank; d++) {
            slot[3 + d] = PyArray_DIM(a, d);
            slot[3 + p->rank + d] = PyArray_STRIDE(a, d) / p->size;
        }
        /* The C interface takes a pointer to the descriptor; packed, a pointer to that. */
        descriptors[i] = slot;
        slot += 3 + 2 * p->rank;
    }

    for (int64_t t = 0; t < nthreads; t++) {
        void **a = packed + (size_t)t * nargs;
        int64_t *ix = indices + (size_t)t * MG_CPU_NINDEX;
        for (Py_ssize_t i = 0; i < n; i++)
            a[i] = self->params[i].kind == PARAM_MEMREF ? (void *)&descriptors[i] : descriptors[i];
        for (int k = 0; k < MG_CPU_NINDEX; k++)
            a[n + k] = &ix[k];
        ix[0] = t % block[0];
        ix[1] = t / block[0] % block[1];
        ix[2] = t / (block[0] * block[1]);
        for (int k = 0; k < 3; k++) {
            ix[6 + k] = block[k];
            ix[9 + k] = grid[k];
        }
        per_thread[t] = a;
    }
    if (self->uses_barrier && reserve_fibers((size_t)nthreads) < 0)
        goto done;

    sched.function = self->function;
    sched.arguments = per_thread;
    const char *source = PyUnicode_AsUTF8(self->source);
    if (source == NULL)
        goto done;
    for (int64_t bz = 0; bz < grid[2]; bz++)
        for (int64_t by = 0; by < grid[1]; by++)
            for (int64_t bx = 0; bx < grid[0]; bx++) {
                int64_t b[3] = {bx, by, bz};
                for (int64_t t = 0; t < nthreads; t++)
                    memcpy(indices + (size_t)t * MG_CPU_NINDEX + 3, b, sizeof b);
                if (self->uses_barrier) {
                    if (run_block((int)nthreads, b, block, source) < 0)
                        goto done;
                } else {
                    for (int64_t t = 0; t < nthreads; t++)
                        self->function(per_thread[t]);
                }
            }
    result = Py_NewRef(Py_None);
done:
    sched.function = NULL;
    sched.arguments = NULL;
    PyMem_Free(memory);
    Py_DECREF(seq);
    return result;
}

static PyObject *CpuEngine_repr(mg_CpuEngine *self)
{
    return PyUnicode_FromFormat("<mlirgpu.CpuEngine %U>", self->name);
}

static PyMethodDef CpuEngine_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))CpuEngine_launch, METH_VARARGS | METH_KEYWORDS,
     "launch(args, grid, block, shared_mem=0): runs every thread of every block; memref arguments are "
     "C-contiguous ndarrays, scalars their bytes. Raises KernelError on barrier divergence."},
    {NULL},
};

static PyType_Slot CpuEngine_slots[] = {
    {Py_tp_doc, "CpuEngine(module, name, params, source, uses_barrier=True, opt_level=2): the host module "
                "(lowered to the llvm dialect) JIT-compiled; `name` is its func.func with "
                "llvm.emit_c_interface, `params` a (kind, rank, size) tuple per kernel parameter."},
    {Py_tp_new, CpuEngine_new},
    {Py_tp_dealloc, CpuEngine_dealloc},
    {Py_tp_repr, CpuEngine_repr},
    {Py_tp_methods, CpuEngine_methods},
    {0, NULL},
};

static PyType_Spec CpuEngine_spec = {
    .name = "mlirgpu.CpuEngine",
    .basicsize = sizeof(mg_CpuEngine),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = CpuEngine_slots,
};

int mg_cpu_init(PyObject *module)
{
    CpuEngineType = mg_add_type(module, &CpuEngine_spec, NULL);
    return CpuEngineType == NULL ? -1 : 0;
}
