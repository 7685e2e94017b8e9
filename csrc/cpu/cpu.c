/* The CPU backend's runtime (see cpu.h and docs/design/cpu_backend.md).
 *
 * A launch runs the grid's blocks one after another. Within a block every
 * thread is a fiber with its own stack; the scheduler (the launching thread's
 * own context) resumes each fiber in turn until it returns or reaches
 * mg_cpu_barrier, which switches back. When a sweep over the block leaves
 * every fiber at a barrier, all are released; when some have returned while
 * others wait, that is barrier divergence and the launch stops with
 * mlirgpu.KernelError. Fibers never unwind: an abandoned fiber's stack is
 * simply reused by the next block or launch.
 *
 * A kernel that calls mg.grid.sync() (a cooperative one) needs every block
 * live at once: its launch runs all the grid's threads as fibers of one
 * group, each block with its own shared memory, up to
 * MG_CPU_MAX_COOPERATIVE_THREADS threads (past that, LaunchError, as the GPU
 * refuses a grid larger than it holds at once). The scheduler then releases
 * each block's mg.syncthreads() on its own, and mg_cpu_grid_sync once every
 * thread of the grid waits there.
 *
 * Everything a launch runs on is its own (mg_cpu_launch): the fibers and their
 * stacks, the scheduler's context, printf output, a failed bounds check. The
 * runtime calls below find it through a thread-local pointer, set while the
 * launch's blocks run on that thread. So two Python threads launch at the same
 * time, and Python code that runs between blocks (sys.stdout.write printing a
 * kernel's output) may itself launch a kernel. Blocks run without the GIL:
 * between blocks the launch takes it back to print, to check for signals
 * (Ctrl-C) and to raise errors; within a block, the scheduler's sweeps and
 * mg_cpu_poll (at the top of a long loop's body) notice a SIGINT through
 * base/interrupt.h and end the launch with KeyboardInterrupt. The only state shared by launches is the
 * cache of idle fiber pools, which is touched with the GIL held.
 *
 * The other runtime calls of the host trace: mg_cpu_shared (the block's
 * shared memory), mg_cpu_shuffle (a warp-level barrier that exchanges one
 * value per lane), mg_cpu_warp_put / mg_cpu_warp_collective / mg_cpu_warp_get
 * (the tensor-core collectives mma.sync and ldmatrix, at the same warp-level
 * barrier), mg_cpu_printf_arg / mg_cpu_printf (formatted into a buffer
 * that goes to sys.stdout between blocks), mg_cpu_bounds_index /
 * mg_cpu_out_of_bounds (a failed bounds check: recorded, and the fiber never
 * resumes). */
#include "cpu/cpu.h"
#include "base/interrupt.h"
#include "host/engine.h"
#include "mlir/ir.h"
#include "host/runner_utils.h"

#include <mlir-c/ExecutionEngine.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "base/numpy_api.h"
#include "cpu/cpu_shared.h"
/* CpuEngine                                                                 */

enum { PARAM_MEMREF, PARAM_SCALAR, PARAM_TENSOR_MAP };
#define MG_CPU_TENSOR_MAP_WORDS 16 /* the 128 bytes of a tensor map */

typedef struct {
    int kind;
    int rank;        /* memref */
    int written;     /* memref: the kernel may store to it (a read-only array is refused) */
    Py_ssize_t size; /* memref: element size; scalar: bytes */
} mg_cpu_param;

typedef struct {
    PyObject_HEAD
    MlirExecutionEngine engine;
    mg_packed_fn function;
    mg_cpu_param *params;
    Py_ssize_t nparams;
    int uses_fibers;
    int cooperative;   /* it calls mg.grid.sync(): every block of a launch runs at once */
    int checks_shared; /* it calls mg_cpu_shared_access: a launch keeps a shadow of shared memory (races.c) */
    int checks_global; /* it calls mg_cpu_global_access: a launch keeps a table of global memory (races.c) */
    Py_ssize_t static_shared; /* bytes of the kernel's mg.shared.array arrays */
    PyObject *name;    /* str */
    PyObject *source;  /* str: the kernel's file, for errors */
    PyObject *strings; /* tuple of str: printf formats and array names, by index */
    const char **texts; /* their UTF-8, owned by `strings` */
} mg_CpuEngine;

static PyTypeObject *CpuEngineType;

static int parse_params(mg_CpuEngine *self, PyObject *params)
{
    /* A tuple of our own: the items' conversions may run Python code that changes a list. */
    PyObject *seq = PySequence_Check(params) ? PySequence_Tuple(params) : NULL;
    if (seq == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "params must be a sequence of (kind, rank, size[, written]) tuples");
        }
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    self->params = PyMem_Calloc(n ? (size_t)n : 1, sizeof *self->params);
    if (self->params == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *kind;
        int rank, written = 1;
        Py_ssize_t size;
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (!PyTuple_Check(item)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "param %zd must be a (kind, rank, size[, written]) tuple", i);
            return -1;
        }
        if (!PyArg_ParseTuple(item, "sin|p:param", &kind, &rank, &size, &written)) {
            Py_DECREF(seq);
            return -1;
        }
        mg_cpu_param *p = &self->params[i];
        if (strcmp(kind, "memref") == 0 && rank >= 0 && rank <= 8 && size > 0)
            *p = (mg_cpu_param){PARAM_MEMREF, rank, written, size};
        else if (strcmp(kind, "scalar") == 0 && size > 0 && size <= 16)
            *p = (mg_cpu_param){PARAM_SCALAR, 0, 0, size};
        else if (strcmp(kind, "tensormap") == 0 && size == MG_CPU_TENSOR_MAP_WORDS * 8)
            *p = (mg_cpu_param){PARAM_TENSOR_MAP, 0, 0, size};
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

static const struct {
    const char *name;
    void *address;
} runtime_symbols[] = {
    {"mg_cpu_barrier", (void *)mg_cpu_barrier},
    {"mg_cpu_grid_sync", (void *)mg_cpu_grid_sync},
    {"_mlir_ciface_mg_cpu_shared", (void *)mg_cpu__mlir_ciface_mg_cpu_shared},
    {"mg_cpu_shuffle", (void *)mg_cpu_shuffle},
    {"mg_cpu_warp_put", (void *)mg_cpu_warp_put},
    {"mg_cpu_warp_collective", (void *)mg_cpu_warp_collective},
    {"mg_cpu_warp_get", (void *)mg_cpu_warp_get},
    {"mg_cpu_printf_arg", (void *)mg_cpu_printf_arg},
    {"mg_cpu_printf", (void *)mg_cpu_printf},
    {"mg_cpu_bounds_index", (void *)mg_cpu_bounds_index},
    {"mg_cpu_out_of_bounds", (void *)mg_cpu_out_of_bounds},
    {"mg_cpu_division_fault", (void *)mg_cpu_division_fault},
    {"mg_cpu_poll", (void *)mg_cpu_poll},
    {"mg_cpu_shared_access", (void *)mg_cpu_shared_access},
    {"mg_cpu_global_access", (void *)mg_cpu_global_access},
    {"mg_cpu_mbarrier_init", (void *)mg_cpu_mbarrier_init},
    {"mg_cpu_mbarrier_arrive", (void *)mg_cpu_mbarrier_arrive},
    {"mg_cpu_mbarrier_wait", (void *)mg_cpu_mbarrier_wait},
    {"mg_cpu_named_barrier", (void *)mg_cpu_named_barrier},
    {"mg_cpu_tma_load", (void *)mg_cpu_tma_load},
    {"mg_cpu_tma_store", (void *)mg_cpu_tma_store},
    {"mg_cpu_tma_reduce_add", (void *)mg_cpu_tma_reduce_add},
    {"_mlir_ciface_mg_cpu_wgmma_buffer", (void *)mg_cpu__mlir_ciface_mg_cpu_wgmma_buffer},
    {"mg_cpu_wgmma", (void *)mg_cpu_wgmma},
    {"mg_cpu_float8x4", (void *)mg_cpu_float8x4},
};

typedef struct {
    MlirExecutionEngine engine;
    MlirStringRef name;
    mg_packed_fn function;
} engine_start;

/* Registers the runtime, runs the JIT (materialization happens here and in
 * the lookup, where LLVM may still hit a fatal error) and finds the kernel. */
static void start_engine(void *arg)
{
    engine_start *s = arg;
    for (size_t i = 0; i < sizeof runtime_symbols / sizeof *runtime_symbols; i++)
        mlirExecutionEngineRegisterSymbol(s->engine, mlirStringRefCreateFromCString(runtime_symbols[i].name),
                                          runtime_symbols[i].address);
    for (const mg_runtime_symbol *c = mg_conversion_symbols; c->name != NULL; c++)
        mlirExecutionEngineRegisterSymbol(s->engine, mlirStringRefCreateFromCString(c->name), c->address);
    mlirExecutionEngineInitialize(s->engine);
    s->function = (mg_packed_fn)mlirExecutionEngineLookupPacked(s->engine, s->name);
}

static PyObject *CpuEngine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"module", "name", "params", "source", "uses_fibers", "strings", "static_shared",
                             "opt_level", "cooperative", "checks_shared", "checks_global", NULL};
    PyObject *module, *name, *params, *source, *strings = NULL, *held = NULL;
    int uses_fibers = 1, opt_level = 2, cooperative = 0, checks_shared = 0, checks_global = 0;
    Py_ssize_t static_shared = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUOU|pOnippp:CpuEngine", kwlist, &module, &name, &params,
                                     &source, &uses_fibers, &strings, &static_shared, &opt_level, &cooperative,
                                     &checks_shared, &checks_global))
        return NULL;
    if (opt_level < 0 || opt_level > 3)
        return PyErr_Format(PyExc_ValueError, "opt_level must be 0..3, not %d", opt_level);
    if (static_shared < 0)
        return PyErr_Format(PyExc_ValueError, "static_shared must be >= 0, not %zd", static_shared);
    mg_CpuEngine *self = (mg_CpuEngine *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->source = Py_NewRef(source);
    self->cooperative = cooperative;
    self->checks_shared = checks_shared;
    self->checks_global = checks_global;
    self->uses_fibers = uses_fibers || cooperative || checks_shared || checks_global;
    self->static_shared = static_shared;
    /* Everything that can run Python code (the sequences) before the module is looked at. */
    self->strings = strings != NULL ? PySequence_Tuple(strings) : PyTuple_New(0);
    if (self->strings == NULL || parse_params(self, params) < 0)
        goto error;
    self->texts = PyMem_Calloc((size_t)PyTuple_GET_SIZE(self->strings) + 1, sizeof *self->texts);
    if (self->texts == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->strings); i++) {
        PyObject *text = PyTuple_GET_ITEM(self->strings, i);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "strings must be str");
            goto error;
        }
        if ((self->texts[i] = PyUnicode_AsUTF8(text)) == NULL)
            goto error;
    }

    /* The engine is JIT-compiled from text: the module as lower() returns it,
     * or an ir.Module printed here. */
    mg_buf printed = {0};
    held = Py_NewRef(module);
    MlirStringRef ir_text;
    int allow_unregistered = 0;
    if (PyUnicode_Check(module)) {
        Py_ssize_t len;
        /* A str never changes; `held` keeps it alive while the GIL is released. */
        const char *data = PyUnicode_AsUTF8AndSize(module, &len);
        if (data == NULL)
            goto error;
        ir_text = mlirStringRefCreate(data, (size_t)len);
    } else {
        mg_ir_Operation *op = mg_ir_module_operation(module);
        if (op == NULL)
            goto error;
        mg_ir_Context *ctx = op->context;
        mg_ir_diag_clear(ctx);
        if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx)) {
            mg_ir_diag_raise(ctx, mg_st->MLIRError, "the host module does not verify");
            goto error;
        }
        if (mg_engine_print_source(op, &printed) < 0)
            goto error;
        ir_text = mlirStringRefCreate(printed.data, printed.len);
        allow_unregistered = mlirContextGetAllowUnregisteredDialects(ctx->context);
    }
    PyObject *what = PyUnicode_FromFormat("%U for the host", name);
    const char *what_text = what != NULL ? PyUnicode_AsUTF8(what) : NULL;
    if (what_text != NULL)
        self->engine = mg_engine_create_detached(ir_text, allow_unregistered, opt_level, what_text);
    Py_XDECREF(what);
    free(printed.data);
    if (mlirExecutionEngineIsNull(self->engine))
        goto error;
    PyObject *packed = PyUnicode_FromFormat("_mlir_ciface_%U", name);
    if (packed == NULL)
        goto error;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(packed, &len);
    if (text == NULL) {
        Py_DECREF(packed);
        goto error;
    }
    engine_start s = {self->engine, mlirStringRefCreate(text, (size_t)len), NULL};
    /* No Python object can reach the engine yet: materialized without the GIL. */
    int fatal;
    Py_BEGIN_ALLOW_THREADS
    fatal = mg_fatal_guarded(start_engine, &s);
    Py_END_ALLOW_THREADS
    Py_DECREF(packed);
    if (fatal) {
        self->engine.ptr = NULL; /* LLVM stopped half-way through it: leaked, never touched */
        mg_raise(mg_st->CompileError, "LLVM failed while JIT-compiling %U for the host: %s", name,
                 mg_fatal_reason);
        goto error;
    }
    self->function = s.function;
    if (self->function == NULL) {
        mg_raise(mg_st->CompileError, "the host module has no function %U with llvm.emit_c_interface", name);
        goto error;
    }
    Py_DECREF(held);
    return (PyObject *)self;
error:
    Py_XDECREF(held);
    Py_DECREF(self);
    return NULL;
}

static void CpuEngine_dealloc(mg_CpuEngine *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (!mlirExecutionEngineIsNull(self->engine))
        mlirExecutionEngineDestroy(self->engine);
    PyMem_Free(self->params);
    PyMem_Free(self->texts);
    Py_XDECREF(self->strings);
    Py_XDECREF(self->name);
    Py_XDECREF(self->source);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* A (x, y, z) of positive ints, or an int (y = z = 1). A list is copied into
 * a tuple first: an item's __index__ may change the list while it is read. */
static int dim3(PyObject *obj, const char *what, int64_t out[3])
{
    out[0] = out[1] = out[2] = 1;
    PyObject *items = NULL;
    if (PyIndex_Check(obj) && !PyBool_Check(obj)) {
        out[0] = PyLong_AsLongLong(obj);
    } else if (PyTuple_Check(obj) || PyList_Check(obj)) {
        items = PySequence_Tuple(obj);
        if (items == NULL)
            return -1;
        Py_ssize_t n = PyTuple_GET_SIZE(items);
        if (n < 1 || n > 3) {
            Py_DECREF(items);
            mg_raise(mg_st->LaunchError, "%s must be an int or a tuple of 1 to 3 ints, got %zd items", what, n);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(items, i);
            if (!PyIndex_Check(item) || PyBool_Check(item)) {
                PyErr_SetString(PyExc_TypeError, "not an int");
                break;
            }
            out[i] = PyLong_AsLongLong(item);
            if (out[i] == -1 && PyErr_Occurred())
                break;
        }
        Py_DECREF(items);
    } else {
        PyErr_SetString(PyExc_TypeError, "not an int");
    }
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;  /* KeyboardInterrupt and the like go on as they are */
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

/* The threads of a block, or -1 past MG_CPU_MAX_THREADS (the product of three
 * extents up to 2**31-1 does not fit in 64 bits: checked step by step). */
int64_t mg_cpu_block_threads(const int64_t block[3])
{
    int64_t n = 1;
    for (int i = 0; i < 3; i++)
        if (__builtin_mul_overflow(n, block[i], &n) || n > MG_CPU_MAX_THREADS)
            return -1;
    return n;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs every block of the grid, one group of `group` blocks at a time (one
 * block, or all of a cooperative launch's); the GIL is released while blocks
 * run and taken back after a slice (MG_CPU_SLICE_NS) or when a group printed
 * or failed, to print, check for signals and raise. 0, or -1 with an error. */
static int run_grid(mg_CpuEngine *self, mg_cpu_launch *l, const int64_t grid[3], const int64_t block[3],
                    int64_t per_block, int64_t group, int64_t *indices, char *shared, size_t shared_bytes,
                    const char *source)
{
    mg_cpu_launch *outer = mg_cpu_running; /* a launch from sys.stdout.write inside another's flush */
    int status = 0;
    int64_t b[3] = {0, 0, 0}, first = 0;
    PyThreadState *thread = PyEval_SaveThread();
    int64_t slice_end = now_ns() + MG_CPU_SLICE_NS;
    mg_cpu_running = l;
    for (b[2] = 0; b[2] < grid[2] && status == 0; b[2]++)
        for (b[1] = 0; b[1] < grid[1] && status == 0; b[1]++)
            for (b[0] = 0; b[0] < grid[0] && status == 0; b[0]++) {
                if (group == 1) {
                    for (int64_t t = 0; t < per_block; t++)
                        memcpy(indices + (size_t)t * MG_CPU_NINDEX + 3, b, sizeof b);
                } else if (b[0] + b[1] + b[2] != 0) {
                    continue; /* the group that started at block (0, 0, 0) ran them all */
                }
                /* Fresh for each block, as far as a program can tell. */
                memset(shared, 0, shared_bytes);
                mg_cpu_synchronized(l);
                l->block_epoch = l->epoch;
                int failed = BLOCK_OK;
                if (self->uses_fibers)
                    failed = mg_cpu_run_blocks(l, (int)group, (int)per_block);
                else
                    for (int64_t t = 0; t < per_block; t++)
                        self->function(l->arguments[t]);
                first += group;
                if (failed == BLOCK_OK && l->output_len == 0 && !l->output_failed && now_ns() < slice_end)
                    continue;
                mg_cpu_running = outer;
                PyEval_RestoreThread(thread);
                if (failed == BLOCK_INTERRUPTED) {
                    mg_cpu_flush_output(l);
                    /* Python's handler raises KeyboardInterrupt; a user's that does not still stops the launch. */
                    if (PyErr_CheckSignals() == 0)
                        PyErr_SetNone(PyExc_KeyboardInterrupt);
                    status = -1;
                }
                else if (failed != BLOCK_OK) {
                    mg_cpu_flush_output(l); /* what ran before the error is printed; its own error is lost */
                    PyErr_Clear();
                    mg_group_place at = {grid, block, first - group, (int)per_block, source};
                    mg_cpu_raise_block_error(l, &at);
                    status = -1;
                }
                else if (mg_cpu_flush_output(l) < 0 || PyErr_CheckSignals() < 0) {
                    status = -1;
                }
                thread = PyEval_SaveThread();
                slice_end = now_ns() + MG_CPU_SLICE_NS;
                mg_cpu_running = l;
            }
    mg_cpu_running = outer;
    PyEval_RestoreThread(thread);
    if (status == 0 && (mg_cpu_flush_output(l) < 0 || PyErr_CheckSignals() < 0))
        status = -1;
    return status;
}

/* launch(args, grid, block, shared_mem=0): args as the kernel's parameters
 * (C-contiguous aligned ndarrays for memrefs, writeable where the kernel may
 * store to them; bytes for scalars). */
/* The blocks a cooperative launch runs at once (all of its grid) in *group:
 * 0, or -1 with LaunchError when they hold more threads than the backend runs at once. */
static int cooperative_group(mg_CpuEngine *self, const int64_t grid[3], int64_t per_block, int64_t *group)
{
    int64_t fit = MG_CPU_MAX_COOPERATIVE_THREADS / per_block;
    if (__builtin_mul_overflow(grid[0], grid[1], group) || __builtin_mul_overflow(*group, grid[2], group) ||
        *group > fit) {
        mg_raise(mg_st->LaunchError,
                 "launch of kernel '%U': it calls mg.grid.sync(), so every block of its grid must run "
                 "at once, and the CPU backend runs at most %lld blocks of %lld threads at once "
                 "(%d threads in all); the grid (%lld, %lld, %lld) has more",
                 self->name, (long long)fit, (long long)per_block, MG_CPU_MAX_COOPERATIVE_THREADS,
                 (long long)grid[0], (long long)grid[1], (long long)grid[2]);
        return -1;
    }
    return 0;
}

/* Packs argument i: a scalar's bytes, a tensor map's bytes and the pointer
 * to them, or an array's memref descriptor, at *slot (advanced past it);
 * descriptors[i] is what its packed slot points to. 0, or -1 with LaunchError. */
static int pack_argument(mg_CpuEngine *self, Py_ssize_t i, PyObject *arg, int64_t **slot, void **descriptors)
{
    mg_cpu_param *p = &self->params[i];
    if (p->kind == PARAM_SCALAR) {
        if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) != p->size) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected %zd bytes of a scalar", i, p->size);
            return -1;
        }
        memcpy(*slot, PyBytes_AS_STRING(arg), (size_t)p->size);
        descriptors[i] = *slot;
        *slot += 2;
        return 0;
    }
    if (p->kind == PARAM_TENSOR_MAP) {
        /* The map's bytes, then the pointer the kernel takes (an !llvm.ptr) to them. */
        mg_cpu_tensor_map map;
        if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) != p->size) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected the %zd bytes of a tensor map", i, p->size);
            return -1;
        }
        memcpy(&map, PyBytes_AS_STRING(arg), sizeof map);
        if (map.magic != MG_CPU_TENSOR_MAP_MAGIC) {
            mg_raise(mg_st->LaunchError, "argument %zd is a tensor map made for the GPU: on the CPU backend, "
                     "make it with mg.tensor_map of a host array", i);
            return -1;
        }
        memcpy(*slot + 1, PyBytes_AS_STRING(arg), (size_t)p->size);
        (*slot)[0] = (int64_t)(intptr_t)(*slot + 1);
        descriptors[i] = *slot;
        *slot += 1 + MG_CPU_TENSOR_MAP_WORDS;
        return 0;
    }
    if (!PyArray_Check(arg)) {
        mg_raise(mg_st->LaunchError, "argument %zd: expected a numpy.ndarray, not %.100s", i,
                 Py_TYPE(arg)->tp_name);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)arg;
    if (PyArray_NDIM(a) != p->rank || PyArray_ITEMSIZE(a) != p->size ||
        !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
        mg_raise(mg_st->LaunchError, "argument %zd: expected a C-contiguous, aligned array of "
                 "rank %d and item size %zd", i, p->rank, p->size);
        return -1;
    }
    if (p->written && !PyArray_ISWRITEABLE(a)) {
        mg_raise(mg_st->LaunchError, "argument %zd is read-only, and %U stores to it", i, self->name);
        return -1;
    }
    /* {allocated, aligned, offset, sizes[rank], strides[rank]} in elements */
    (*slot)[0] = (int64_t)(intptr_t)PyArray_DATA(a);
    (*slot)[1] = (int64_t)(intptr_t)PyArray_DATA(a);
    (*slot)[2] = 0;
    for (int d = 0; d < p->rank; d++) {
        (*slot)[3 + d] = PyArray_DIM(a, d);
        (*slot)[3 + p->rank + d] = PyArray_STRIDE(a, d) / p->size;
    }
    /* The C interface takes a pointer to the descriptor; packed, a pointer to that. */
    descriptors[i] = *slot;
    *slot += 3 + 2 * p->rank;
    return 0;
}

/* Per thread its packed arguments (the kernel's, then pointers to its 12
 * index values) and those values: thread, block, block_dim and grid_dim. */
static void thread_arguments(mg_CpuEngine *self, void **descriptors, void ***per_thread, void **packed,
                             int64_t *indices, int64_t nthreads, int64_t per_block, const int64_t grid[3],
                             const int64_t block[3])
{
    Py_ssize_t n = self->nparams;
    size_t nargs = (size_t)n + MG_CPU_NINDEX;
    for (int64_t t = 0; t < nthreads; t++) {
        void **a = packed + (size_t)t * nargs;
        int64_t *ix = indices + (size_t)t * MG_CPU_NINDEX;
        for (Py_ssize_t i = 0; i < n; i++)
            a[i] = self->params[i].kind == PARAM_MEMREF ? (void *)&descriptors[i] : descriptors[i];
        for (int k = 0; k < MG_CPU_NINDEX; k++)
            a[n + k] = &ix[k];
        int64_t in_block = t % per_block, b = t / per_block; /* b: the block, in a cooperative launch */
        ix[0] = in_block % block[0];
        ix[1] = in_block / block[0] % block[1];
        ix[2] = in_block / (block[0] * block[1]);
        ix[3] = b % grid[0];
        ix[4] = b / grid[0] % grid[1];
        ix[5] = b / (grid[0] * grid[1]);
        for (int k = 0; k < 3; k++) {
            ix[6 + k] = block[k];
            ix[9 + k] = grid[k];
        }
        per_thread[t] = a;
    }
}

/* What the race checks a kernel makes keep in its launch (races.c): the
 * shadow of shared memory, and the table of global memory with the bytes of
 * each array argument the kernel may store to. 0, or -1 with MemoryError. */
static int race_state(mg_CpuEngine *self, PyObject *args, mg_cpu_launch *l)
{
    /* Zeros: every byte's epochs are before the first block's. */
    if (self->checks_shared && (l->shadow = PyMem_Calloc(l->shared_total ? l->shared_total : 1,
                                                         sizeof *l->shadow)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!self->checks_global)
        return 0;
    if (mg_cpu_global_table(l) < 0)
        return -1;
    if ((l->written = PyMem_Calloc((size_t)self->nparams + 1, sizeof *l->written)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->nparams; i++) {
        if (self->params[i].kind != PARAM_MEMREF || !self->params[i].written)
            continue;
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(args, i); /* checked by pack_argument */
        uint64_t start = (uint64_t)(uintptr_t)PyArray_DATA(a);
        l->written[l->nwritten++] = (mg_written_array){start, start + (uint64_t)PyArray_NBYTES(a)};
    }
    return 0;
}

static void race_state_free(mg_cpu_launch *l)
{
    PyMem_Free(l->shadow);
    free(l->global);
    PyMem_Free(l->written);
}

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
    int64_t per_block = mg_cpu_block_threads(block);
    if (per_block < 0)
        return mg_raise(mg_st->LaunchError, "block (%lld, %lld, %lld) has too many threads: at most %d",
                        (long long)block[0], (long long)block[1], (long long)block[2], MG_CPU_MAX_THREADS);
    if (shared_mem < 0)
        return mg_raise(mg_st->LaunchError, "shared_mem must be >= 0, not %zd", shared_mem);
    /* A cooperative launch runs every block at once: its threads are all fibers. */
    int64_t group = 1;
    if (self->cooperative && cooperative_group(self, grid, per_block, &group) < 0)
        return NULL;
    int64_t nthreads = per_block * group;
    /* Our own tuple: it keeps every array (and so its memory) alive while the blocks run without the GIL. */
    PyObject *seq = PyTuple_Check(arglist) || PyList_Check(arglist) ? PySequence_Tuple(arglist) : NULL;
    if (seq == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "args must be a tuple or list");
        return NULL;
    }
    Py_ssize_t n = self->nparams;
    if (PyTuple_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        return mg_raise(mg_st->LaunchError, "%U takes %zd arguments, got %zd", self->name, n,
                        PyTuple_GET_SIZE(seq));
    }
    const char *source = PyUnicode_AsUTF8(self->source);
    if (source == NULL) {
        Py_DECREF(seq);
        return NULL;
    }

    /* One allocation: descriptors and scalar slots (shared by all threads),
     * then per thread its packed argument array and its 12 index values. */
    size_t ndesc = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        ndesc += self->params[i].kind == PARAM_MEMREF ? 3 + 2 * (size_t)self->params[i].rank
               : self->params[i].kind == PARAM_TENSOR_MAP ? 1 + MG_CPU_TENSOR_MAP_WORDS : 2;
    size_t nargs = (size_t)n + MG_CPU_NINDEX;
    size_t bytes = ndesc * 8 + (size_t)n * sizeof(void *) + (size_t)nthreads * (nargs * sizeof(void *) +
                   MG_CPU_NINDEX * sizeof(int64_t) + sizeof(void **));
    char *memory = PyMem_Calloc(1, bytes);
    /* The block's shared memory: static arrays, then the dynamic bytes, 16-byte aligned after them, as
     * a GPU lays them out: a kernel that puts swizzled tiles in its dynamic shared memory must find the
     * 1024-byte boundary there itself (the 128-byte swizzle's period, from the window's aligned start). */
    size_t static_bytes = ((size_t)self->static_shared + 15) / 16 * 16;
    size_t shared_stride = (static_bytes + (size_t)shared_mem + MG_CPU_SHARED_ALIGN - 1) / MG_CPU_SHARED_ALIGN *
                           MG_CPU_SHARED_ALIGN;
    size_t shared_bytes = shared_stride * (size_t)group; /* one block's each */
    char *shared = NULL;
    uint64_t *named = PyMem_Calloc((size_t)group * MG_CPU_NAMED_BARRIERS * 2, sizeof *named);
    if (memory == NULL || named == NULL ||
        posix_memalign((void **)&shared, MG_CPU_SHARED_ALIGN, shared_bytes ? shared_bytes : 1) != 0) {
        PyMem_Free(memory);
        PyMem_Free(named);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int64_t *slots = (int64_t *)memory;
    void **descriptors = (void **)(slots + ndesc); /* per param: what its packed slot points to */
    void ***per_thread = (void ***)(descriptors + n);
    void **packed = (void **)(per_thread + nthreads);
    int64_t *indices = (int64_t *)(packed + (size_t)nthreads * nargs);

    PyObject *result = NULL;
    mg_cpu_launch *launch = NULL;
    int64_t *slot = slots;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pack_argument(self, i, PyTuple_GET_ITEM(seq, i), &slot, descriptors) < 0)
            goto done;

    thread_arguments(self, descriptors, per_thread, packed, indices, nthreads, per_block, grid, block);
    launch = PyMem_Calloc(1, sizeof *launch);
    if (launch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (self->uses_fibers && (launch->pool = mg_cpu_pool_take((size_t)nthreads)) == NULL)
        goto done;
    launch->function = self->function;
    launch->arguments = per_thread;
    launch->strings = self->texts;
    launch->nstrings = PyTuple_GET_SIZE(self->strings);
    launch->shared[0] = shared;
    launch->shared_size[0] = self->static_shared;
    launch->shared[1] = shared + static_bytes;
    launch->shared_size[1] = shared_mem;
    launch->block_threads = (int)per_block;
    launch->shared_stride = shared_stride;
    launch->shared_window = static_bytes + (size_t)shared_mem;
    launch->named = named;
    launch->interrupts = mg_interrupt_watch();
    launch->shared_total = shared_bytes;
    if (race_state(self, seq, launch) < 0)
        goto done;
    if (run_grid(self, launch, grid, block, per_block, group, indices, shared, shared_bytes, source) == 0)
        result = Py_NewRef(Py_None);
done:
    if (launch != NULL) {
        if (launch->pool != NULL)
            mg_cpu_pool_give(launch->pool);
        free(launch->output);
        race_state_free(launch);
        PyMem_Free(launch);
    }
    free(shared);
    PyMem_Free(named);
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
     "C-contiguous ndarrays (writeable where the kernel stores), scalars their bytes. Raises KernelError on "
     "barrier or warp divergence and on a failed bounds check; printf output goes to sys.stdout between "
     "blocks. Blocks run without the GIL; Ctrl-C stops the launch (KeyboardInterrupt) at its next barrier, long loop's "
     "iteration or block."},
    {NULL},
};

static PyType_Slot CpuEngine_slots[] = {
    {Py_tp_doc, "CpuEngine(module, name, params, source, uses_fibers=True, strings=(), static_shared=0, "
                "opt_level=2, cooperative=False, checks_shared=False, checks_global=False): the host module (lowered to the llvm dialect: an ir.Module, "
                "or its text as lower() returns it) JIT-compiled without the GIL; `name` is its "
                "func.func with llvm.emit_c_interface, `params` a (kind, rank, size[, written]) tuple per kernel "
                "parameter (written, default True: the kernel may store to that memref), `strings` the printf "
                "formats and array names its runtime calls refer to by index, `static_shared` the bytes of "
                "its static shared memory, `checks_shared` whether it calls mg_cpu_shared_access (a launch then keeps "
                "a shadow of shared memory for the race and uninitialized-read checks), `checks_global` whether it "
                "calls mg_cpu_global_access (a launch then keeps a table of the global memory each epoch touched, "
                "for the race check), `cooperative` whether "
                "it calls mg.grid.sync() (every block of a "
                "launch then runs at once, as fibers of one group)."},
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
    if (CpuEngineType == NULL)
        return -1;
    return PyModule_AddIntConstant(module, "CPU_MAX_COOPERATIVE_THREADS", MG_CPU_MAX_COOPERATIVE_THREADS);
}
