/* What ExecutionEngine.invoke passes and gets back: the results it is told
 * to expect, arguments packed as the C interface takes them (scalars and
 * memref descriptors), and memref results copied out and freed. */
#include "host/engine.h"
#include "arrays/array.h"
#include "cuda/driver.h"
#include "mlir/ir.h"
#include "host/async_runtime.h"
#include "host/runner_utils.h"
#include "host/runtime.h"

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/LLVM.h>
#include <mlir-c/ExecutionEngine.h>
#include <mlir-c/Target/LLVMIR.h>
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/numpy_api.h"
#include "host/engine_shared.h"
static PyObject *type_str(MlirType type)
{
    mg_buf buf = {0};
    mlirTypePrint(type, mg_buf_callback, &buf);
    return mg_buf_finish(&buf);
}
/* ------------------------------------------------------------------------ */
/* Results: what invoke is told to expect, checked against the function      */


static MlirType scalar_type(MlirContext ctx, mg_dtype *dt)
{
    switch (dt->id) {
    case MG_DT_BOOL: return mlirIntegerTypeGet(ctx, 1);
    case MG_DT_F16: return mlirF16TypeGet(ctx);
    case MG_DT_BF16: return mlirBF16TypeGet(ctx);
    case MG_DT_F8E4M3: return mlirFloat8E4M3FNTypeGet(ctx);
    case MG_DT_F8E5M2: return mlirFloat8E5M2TypeGet(ctx);
    case MG_DT_F32: return mlirF32TypeGet(ctx);
    case MG_DT_F64: return mlirF64TypeGet(ctx);
    default: return mlirIntegerTypeGet(ctx, (unsigned)dt->itemsize * 8);
    }
}

/* The LLVM struct of a memref descriptor of `rank`. */
static MlirType descriptor_type(MlirContext ctx, int rank)
{
    MlirType ptr = mlirLLVMPointerTypeGet(ctx, 0), i64 = mlirIntegerTypeGet(ctx, 64);
    MlirType array = mlirLLVMArrayTypeGet(i64, (unsigned)rank);
    MlirType fields[5] = {ptr, ptr, i64, array, array};
    return mlirLLVMStructTypeLiteralGet(ctx, rank > 0 ? 5 : 3, fields, false);
}

static MlirType result_type(MlirContext ctx, const result_spec *r)
{
    return r->memref ? descriptor_type(ctx, r->rank) : scalar_type(ctx, r->dtype);
}

/* The return type func-to-llvm gives a function with these results. */
static MlirType expected_return(MlirContext ctx, const result_spec *spec, Py_ssize_t n)
{
    if (n == 0)
        return mlirLLVMVoidTypeGet(ctx);
    if (n == 1)
        return result_type(ctx, &spec[0]);
    MlirType *fields = PyMem_Calloc((size_t)n, sizeof *fields);
    if (fields == NULL)
        return (MlirType){NULL};
    for (Py_ssize_t i = 0; i < n; i++)
        fields[i] = result_type(ctx, &spec[i]);
    MlirType type = mlirLLVMStructTypeLiteralGet(ctx, n, fields, false);
    PyMem_Free(fields);
    return type;
}

static int parse_result(PyObject *item, Py_ssize_t i, result_spec *r)
{
    PyObject *kind = PyTuple_Check(item) && PyTuple_GET_SIZE(item) > 0 ? PyTuple_GET_ITEM(item, 0) : NULL;
    int memref = kind != NULL && PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "memref") == 0;
    int scalar = kind != NULL && PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "scalar") == 0;
    if ((memref && PyTuple_GET_SIZE(item) != 3) || (scalar && PyTuple_GET_SIZE(item) != 2) || (!memref && !scalar)) {
        PyErr_Format(PyExc_ValueError, "results[%zd] must be ('memref', rank, dtype) or ('scalar', dtype), not %R",
                     i, item);
        return -1;
    }
    r->memref = memref;
    r->rank = 0;
    if (memref) {
        int overflow;
        long rank = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(item, 1), &overflow);
        if (rank == -1 && PyErr_Occurred())
            return -1;
        if (overflow || rank < 0 || rank > NPY_MAXDIMS) {
            PyErr_Format(PyExc_ValueError, "results[%zd]: rank must be 0..%d", i, NPY_MAXDIMS);
            return -1;
        }
        r->rank = (int)rank;
    }
    if (!mg_dtype_converter(PyTuple_GET_ITEM(item, memref ? 2 : 1), &r->dtype))
        return -1;
    r->size = memref ? (size_t)(3 + 2 * r->rank) * 8 : (size_t)r->dtype->itemsize;
    r->align = memref ? 8 : r->size;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Arguments                                                                 */

/* Bytes of a scalar parameter of the C interface (8 for a pointer), or 0
 * for a type invoke cannot pass. */
static Py_ssize_t parameter_bytes(MlirType t)
{
    if (mlirTypeIsALLVMPointerType(t))
        return 8;
    if (mlirTypeIsAInteger(t)) {
        unsigned width = mlirIntegerTypeGetWidth(t);
        return width <= 64 ? (Py_ssize_t)(width + 7) / 8 : 0;
    }
    if (mlirTypeIsAF16(t) || mlirTypeIsABF16(t))
        return 2;
    if (mlirTypeIsAF32(t))
        return 4;
    if (mlirTypeIsAF64(t))
        return 8;
    return 0;
}


/* Fills `d` with a memref descriptor over `data`; -1 with ValueError when
 * a stride is not a multiple of the element size. */
static int fill_descriptor(int64_t *d, void *data, int rank, const npy_intp *shape, const npy_intp *strides,
                           Py_ssize_t itemsize, Py_ssize_t i)
{
    d[0] = d[1] = (int64_t)(intptr_t)data;
    d[2] = 0;
    for (int k = 0; k < rank; k++) {
        if (strides[k] % itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "argument %zd: stride %zd of dimension %d is not a multiple of the "
                         "item size %zd", i, (Py_ssize_t)strides[k], k, itemsize);
            return -1;
        }
        d[3 + k] = shape[k];
        d[3 + rank + k] = strides[k] / itemsize;
    }
    return 0;
}

/* Kernels cannot read pageable host memory: the memory of NumPy array `a`
 * (the span its descriptor covers) is lent to the call, and the descriptor
 * points into the copy. */
void mg_engine_lend(mg_rt_state *state, PyArrayObject *a, borrowed *b)
{
    int64_t *d = b->descriptor;
    int rank = PyArray_NDIM(a);
    int64_t itemsize = PyArray_ITEMSIZE(a), low = 0, high = 0;
    for (int k = 0; k < rank; k++) {
        int64_t size = d[3 + k], stride = d[3 + rank + k];
        if (size == 0)
            return;
        *(stride < 0 ? &low : &high) += (size - 1) * stride;
    }
    char *first = (char *)(intptr_t)d[1] + low * itemsize;
    char *copy = mg_rt_lend(state, first, (size_t)((high - low + 1) * itemsize), PyArray_ISWRITEABLE(a));
    d[0] = d[1] = (int64_t)(intptr_t)(copy - low * itemsize);
    b->allocated = (uintptr_t)d[0];
}

/* ------------------------------------------------------------------------ */
/* Copying memref results                                                    */

enum { OWNER_FUNCTION, OWNER_ARGUMENT, OWNER_GLOBAL, OWNER_RUNTIME };


/* The calling thread's stack: a memref.alloca returned is gone. */
static int on_stack(uintptr_t p)
{
    static _Thread_local uintptr_t low, high;
    if (high == 0) {
        pthread_attr_t attr;
        void *base;
        size_t size;
        if (pthread_getattr_np(pthread_self(), &attr) != 0)
            return 0;
        if (pthread_attr_getstack(&attr, &base, &size) == 0) {
            low = (uintptr_t)base;
            high = low + size;
        }
        pthread_attr_destroy(&attr);
    }
    return p >= low && p < high;
}

/* A C-contiguous NumPy copy of the memref `d` of `rank`, whose memory is on
 * the host or (`device`) on the GPU. Steals `descr`. */
static PyObject *copy_memref(const int64_t *d, int rank, PyArray_Descr *descr, int device, Py_ssize_t i)
{
    npy_intp shape[NPY_MAXDIMS], strides[NPY_MAXDIMS];
    Py_ssize_t itemsize = PyDataType_ELSIZE(descr);
    int64_t low = 0, high = 0, empty = 0; /* the elements touched, relative to the first */
    for (int k = 0; k < rank; k++) {
        int64_t size = d[3 + k], stride = d[3 + rank + k];
        if (size < 0) {
            Py_DECREF(descr);
            return PyErr_Format(PyExc_ValueError, "result %zd: dimension %d has size %lld", i, k, (long long)size);
        }
        shape[k] = (npy_intp)size;
        strides[k] = (npy_intp)(stride * itemsize);
        empty |= size == 0;
        if (size > 0)
            *(stride < 0 ? &low : &high) += (size - 1) * stride;
    }
    char *first = (char *)(intptr_t)d[1] + d[2] * itemsize;
    if (empty)
        return PyArray_Empty(rank, shape, descr, 0);
    if (d[1] == 0) {
        Py_DECREF(descr);
        return PyErr_Format(PyExc_ValueError, "result %zd is a memref over a null pointer", i);
    }
    char *staging = NULL;
    if (device) {
        /* The span the memref covers comes to the host first. */
        size_t span = (size_t)(high - low + 1) * (size_t)itemsize;
        staging = PyMem_Malloc(span);
        if (staging == NULL) {
            Py_DECREF(descr);
            return PyErr_NoMemory();
        }
        CUresult r = CUDA_SUCCESS;
        if (mg_cu_ensure_context() == 0) {
            CUdeviceptr source = (CUdeviceptr)(first + low * itemsize);
            Py_BEGIN_ALLOW_THREADS
            r = mg_cu.cuMemcpyDtoHAsync(staging, source, span, NULL);
            if (r == CUDA_SUCCESS)
                r = mg_cu.cuStreamSynchronize(NULL);
            Py_END_ALLOW_THREADS
        }
        if (PyErr_Occurred() || mg_cu_check(r, "copying a memref result to the host: cuMemcpyDtoHAsync") < 0) {
            PyMem_Free(staging);
            Py_DECREF(descr);
            return NULL;
        }
        first = staging - low * itemsize;
    }
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, strides, first, 0, NULL);
    PyObject *copy = view != NULL ? PyArray_NewCopy((PyArrayObject *)view, NPY_CORDER) : NULL;
    Py_XDECREF(view);
    PyMem_Free(staging);
    return copy;
}

/* ------------------------------------------------------------------------ */
/* invoke                                                                    */

/* What Python printed before the call comes before what the program prints
 * (C stdio on file descriptor 1). Printing is not worth failing a call for:
 * a sys.stdout that cannot flush is left as it is. */
void mg_engine_flush_python_stdout(void)
{
    PyObject *out = PySys_GetObject("stdout"); /* borrowed */
    if (out == NULL || out == Py_None)
        return;
    PyObject *done = PyObject_CallMethod(out, "flush", NULL);
    if (done == NULL)
        PyErr_Clear();
    Py_XDECREF(done);
}

engine_function *mg_engine_find_function(mg_engine *self, const char *name)
{
    for (Py_ssize_t i = 0; i < self->nfunctions; i++)
        if (strcmp(self->functions[i].name, name) == 0)
            return &self->functions[i];
    return NULL;
}

/* Checks `results` against f's return type; fills spec and the struct layout. */
int mg_engine_check_results(engine_function *f, const char *name, PyObject *seq, result_spec *spec, size_t *struct_size)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t offset = 0, align = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        result_spec *r = &spec[i];
        if (parse_result(PySequence_Fast_GET_ITEM(seq, i), i, r) < 0)
            return -1;
        offset = (offset + r->align - 1) / r->align * r->align;
        r->offset = offset;
        offset += r->size;
        align = r->align > align ? r->align : align;
    }
    *struct_size = (offset + align - 1) / align * align;
    MlirType returned = mlirLLVMFunctionTypeGetReturnType(f->type);
    MlirType expected = expected_return(mlirTypeGetContext(f->type), spec, n);
    if (mlirTypeIsNull(expected)) {
        PyErr_NoMemory();
        return -1;
    }
    if (!mlirTypeEqual(returned, expected)) {
        PyObject *text = type_str(returned);
        if (text != NULL)
            PyErr_Format(PyExc_ValueError, "%s returns %U (in the llvm dialect), which results=%R does not describe",
                         name, text, seq);
        Py_XDECREF(text);
        return -1;
    }
    return 0;
}

static PyObject *parameter_error(PyObject *cls, engine_function *f, int by_pointer, Py_ssize_t i, const char *what)
{
    PyObject *text = type_str(mlirLLVMFunctionTypeGetInput(f->interface, i + by_pointer));
    if (text != NULL)
        PyErr_Format(cls, "argument %zd of %s: the parameter is %U (in the C interface), %s", i, f->name, text, what);
    Py_XDECREF(text);
    return NULL;
}

/* A new reference to a tuple of the items of `seq` (TypeError `message` when it is no sequence). */
PyObject *mg_engine_tuple_of(PyObject *seq, const char *message)
{
    PyObject *fast = PySequence_Fast(seq, message);
    if (fast == NULL || !PyList_Check(fast))
        return fast;
    PyObject *tuple = PyList_AsTuple(fast);
    Py_DECREF(fast);
    return tuple;
}

/* The int64 slots the memref descriptors of the array arguments take. */
size_t mg_engine_descriptor_slots(PyObject *argseq)
{
    size_t ndesc = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(argseq); i++) {
        PyObject *arg = PySequence_Fast_GET_ITEM(argseq, i);
        if (PyArray_Check(arg))
            ndesc += 3 + 2 * (size_t)PyArray_NDIM((PyArrayObject *)arg);
        else if (PyObject_TypeCheck(arg, mg_array_type))
            ndesc += 3 + 2 * (size_t)((mg_array *)arg)->ndim;
    }
    return ndesc;
}

/* Ends the runtime's invocation: -1 when it failed, its error then replacing
 * any other (it explains garbage results); else 0, any error kept. */
int mg_engine_end_invocation(mg_rt_state *state, PyObject *timeline)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (mg_rt_end(state, timeline != Py_None ? timeline : NULL) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return -1;
    }
    PyErr_Restore(type, value, traceback);
    return 0;
}

/* Packs argument i of an invocation: the bytes of a scalar into scalars[i],
 * or an array's memref descriptor at *d (advanced past it), with what it
 * lends in lent[i]. 0, or -1 with TypeError or ValueError. */
int mg_engine_pack_argument(engine_function *f, int by_pointer, Py_ssize_t i, PyObject *arg, int64_t *scalars,
                         void **pointers, void **packed, Py_ssize_t *k, int64_t **d, borrowed *lent)
{
    MlirType param = mlirLLVMFunctionTypeGetInput(f->interface, i + by_pointer);
    Py_ssize_t bytes = parameter_bytes(param);
    if (bytes == 0) {
        parameter_error(PyExc_TypeError, f, by_pointer, i, "which invoke cannot pass");
        return -1;
    }
    if (PyBytes_Check(arg)) {
        Py_ssize_t n = PyBytes_GET_SIZE(arg);
        if (n != 1 && n != 2 && n != 4 && n != 8) {
            PyErr_Format(PyExc_ValueError, "argument %zd: a scalar is 1, 2, 4 or 8 bytes, got %zd", i, n);
            return -1;
        }
        if (n != bytes) {
            char what[64];
            PyOS_snprintf(what, sizeof what, "not %zd bytes", n);
            parameter_error(PyExc_ValueError, f, by_pointer, i, what);
            return -1;
        }
        memcpy(&scalars[i], PyBytes_AS_STRING(arg), (size_t)n);
        packed[(*k)++] = &scalars[i];
        return 0;
    }
    int is_ndarray = PyArray_Check(arg), is_device_array = PyObject_TypeCheck(arg, mg_array_type);
    if (!is_ndarray && !is_device_array) {
        PyErr_Format(PyExc_TypeError, "argument %zd: expected a numpy.ndarray, an mlirgpu.DeviceArray or the "
                     "bytes of a scalar, not %.100s", i, Py_TYPE(arg)->tp_name);
        return -1;
    }
    if (!mlirTypeIsALLVMPointerType(param)) {
        parameter_error(PyExc_TypeError, f, by_pointer, i, "not a memref");
        return -1;
    }
    int64_t *descriptor = *d;
    if (is_ndarray) {
        PyArrayObject *a = (PyArrayObject *)arg;
        PyArray_Descr *descr = PyArray_DESCR(a);
        if (PyDataType_FLAGCHK(descr, NPY_ITEM_REFCOUNT) || PyDataType_ELSIZE(descr) == 0) {
            PyErr_Format(PyExc_TypeError, "argument %zd: arrays of dtype %R cannot be passed", i, (PyObject *)descr);
            return -1;
        }
        if (fill_descriptor(*d, PyArray_DATA(a), PyArray_NDIM(a), PyArray_DIMS(a), PyArray_STRIDES(a),
                            PyDataType_ELSIZE(descr), i) < 0)
            return -1;
        lent[i] = (borrowed){(uintptr_t)PyArray_DATA(a), 0, *d};
        *d += 3 + 2 * PyArray_NDIM(a);
    } else {
        mg_array *a = (mg_array *)arg;
        npy_intp shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
        for (int j = 0; j < a->ndim; j++) {
            shape[j] = a->shape[j];
            strides[j] = a->strides[j];
        }
        if (fill_descriptor(*d, (void *)(uintptr_t)a->ptr, a->ndim, shape, strides, a->dtype->itemsize, i) < 0)
            return -1;
        lent[i] = (borrowed){(uintptr_t)a->ptr, !a->host, NULL};
        *d += 3 + 2 * a->ndim;
    }
    /* The C interface takes a pointer to the descriptor; packed, a pointer to that. */
    pointers[i] = descriptor;
    packed[(*k)++] = &pointers[i];
    return 0;
}

/* Who owns each memref result's memory: an argument, a global, the
 * runtime (freed by mg_rt_end), or the function (memory it allocated,
 * which comes back copied and is freed here). Returns `skip`, set where a
 * result cannot be returned (with ValueError, unless skip was already set). */
int mg_engine_result_owners(mg_rt_state *state, const char *name, const result_spec *spec, result_memory *memory,
                         Py_ssize_t nresults, int64_t *returned, PyObject *argseq, const borrowed *lent, int skip)
{
    for (Py_ssize_t i = 0; i < nresults; i++) {
        if (!spec[i].memref)
            continue;
        uintptr_t allocated = (uintptr_t)*(int64_t *)((char *)returned + spec[i].offset);
        int kind = state != NULL ? mg_rt_memory(state, (void *)allocated) : MG_RT_NOT_OURS;
        if (kind == MG_RT_FREED) {
            if (!skip)
                PyErr_Format(PyExc_ValueError, "result %zd of %s is GPU memory the program freed", i, name);
            skip = 1;
            memory[i].owner = OWNER_GLOBAL; /* never freed */
        } else if (allocated == MG_GLOBAL_MARKER)
            memory[i].owner = OWNER_GLOBAL;
        else if (kind != MG_RT_NOT_OURS)
            memory[i] = (result_memory){OWNER_RUNTIME, kind == MG_RT_DEVICE};
        else
            memory[i].owner = OWNER_FUNCTION;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(argseq) && memory[i].owner == OWNER_FUNCTION; j++)
            if (!PyBytes_Check(PySequence_Fast_GET_ITEM(argseq, j)) && lent[j].allocated == allocated)
                memory[i] = (result_memory){OWNER_ARGUMENT, lent[j].device};
        if (memory[i].owner == OWNER_FUNCTION && allocated != 0 && on_stack(allocated)) {
            if (!skip)
                PyErr_Format(PyExc_ValueError, "result %zd of %s is stack memory (memref.alloca), gone once the "
                             "function returned", i, name);
            skip = 1;
            memory[i].owner = OWNER_GLOBAL; /* never freed */
        }
    }
    return skip;
}

/* The results as a new tuple of NumPy arrays and scalars, or NULL with the error set. */
PyObject *mg_engine_results_tuple(const result_spec *spec, const result_memory *memory, Py_ssize_t nresults,
                               int64_t *returned)
{
    PyObject *tuple = PyTuple_New(nresults);
    for (Py_ssize_t i = 0; tuple != NULL && i < nresults; i++) {
        char *data = (char *)returned + spec[i].offset;
        PyObject *descr = mg_dtype_numpy(spec[i].dtype);
        PyObject *value = NULL;
        if (descr != NULL && spec[i].memref)
            value = copy_memref((int64_t *)data, spec[i].rank, (PyArray_Descr *)descr, memory[i].device, i);
        else if (descr != NULL) {
            value = PyArray_Scalar(data, (PyArray_Descr *)descr, NULL);
            Py_DECREF(descr);
        }
        if (value == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, value);
    }
    return tuple;
}

/* Frees what the function allocated, once per allocation, error or not. */
void mg_engine_free_function_results(const result_spec *spec, const result_memory *memory, Py_ssize_t nresults,
                                  int64_t *returned)
{
    for (Py_ssize_t i = 0; i < nresults; i++) {
        if (!spec[i].memref || memory[i].owner != OWNER_FUNCTION)
            continue;
        void *allocated = (void *)(intptr_t)*(int64_t *)((char *)returned + spec[i].offset);
        int seen = 0;
        for (Py_ssize_t j = 0; j < i && !seen; j++)
            seen = spec[j].memref && memory[j].owner == OWNER_FUNCTION &&
                   *(int64_t *)((char *)returned + spec[j].offset) == (int64_t)(intptr_t)allocated;
        if (!seen)
            free(allocated);
    }
}

