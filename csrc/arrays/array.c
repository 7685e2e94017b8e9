/* mlirgpu.DeviceArray: creation (empty, zeros, to_device) and release,
 * copies to and from the host and between arrays, properties, and the
 * __cuda_array_interface__ it exports. */
#include "arrays/array.h"
#include "cuda/driver.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "arrays/dlpack.h"
#include "cuda/graph.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "base/numpy_api.h"
#include "arrays/array_shared.h"
/* ---------------------------------------------------------------------- */
/* DeviceArray: creation and release                                       */
/* ---------------------------------------------------------------------- */

/* A DeviceArray with no memory yet: ptr 0, the thread's device, the legacy
 * default stream. `strides` NULL means C-contiguous. */
mg_array *mg_arrays_array_create(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides)
{
    mg_array *self = (mg_array *)mg_array_type->tp_alloc(mg_array_type, 0);
    if (self == NULL)
        return NULL;
    self->dtype = (mg_dtype *)Py_NewRef((PyObject *)dtype);
    self->ndim = ndim;
    self->device = mg_cu_current_device();
    /* A 0-d array's shape may be NULL (NumPy's is): memcpy must not see it. */
    if (ndim > 0)
        memcpy(self->shape, shape, (size_t)ndim * sizeof *shape);
    if (mg_arrays_c_strides(ndim, shape, dtype->itemsize, self->strides, &self->size) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    if (strides != NULL && ndim > 0)
        memcpy(self->strides, strides, (size_t)ndim * sizeof *strides);
    return self;
}

static void release_memory(mg_array *self)
{
    if (self->owns) {
        self->owns = 0;
        if (self->host)
            free((void *)(uintptr_t)self->ptr);
        else
            mg_cu_free_quietly(self->ptr, self->device);
    }
    if (self->dl_managed != NULL) {
        /* We renamed the capsule "used_...": its deleter is ours to call. */
        void *managed = self->dl_managed;
        self->dl_managed = NULL;
        if (self->dl_versioned) {
            DLManagedTensorVersioned *m = managed;
            if (m->deleter != NULL)
                m->deleter(m);
        }
        else {
            DLManagedTensor *m = managed;
            if (m->deleter != NULL)
                m->deleter(m);
        }
    }
    Py_CLEAR(self->owner);
}

int mg_arrays_array_traverse(mg_array *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    Py_VISIT(self->stream_obj);
    return 0;
}

int mg_arrays_array_clear(mg_array *self)
{
    release_memory(self);
    Py_CLEAR(self->stream_obj);
    return 0;
}

void mg_arrays_array_dealloc(mg_array *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    mg_arrays_array_clear(self);
    Py_XDECREF(self->dtype);
    type->tp_free(self);
    Py_DECREF(type);
}

void mg_array_set_stream(PyObject *obj, CUstream stream, PyObject *stream_obj)
{
    mg_array *self = (mg_array *)obj;
    self->stream = stream;
    if (self->stream_obj != stream_obj)
        Py_XSETREF(self->stream_obj, Py_XNewRef(stream_obj));
}

/* stream= argument: the handle and the object to keep alive (NULL for None). */
static int parse_stream(PyObject *obj, CUstream *stream, PyObject **keep)
{
    *keep = NULL;
    if (obj == NULL || obj == Py_None) {
        *stream = NULL;
        return 0;
    }
    if (!mg_cu_stream_converter(obj, stream))
        return -1;
    *keep = obj;
    return 0;
}

/* Host memory for a host DeviceArray of `nbytes` (> 0), aligned for any
 * vector load a kernel may do: 0, or -1 with MemoryError. */
static int host_allocate(mg_array *self, size_t nbytes, int zero)
{
    void *memory = NULL;
    size_t rounded = (nbytes + MG_HOST_ALIGNMENT - 1) / MG_HOST_ALIGNMENT * MG_HOST_ALIGNMENT;
    if (posix_memalign(&memory, MG_HOST_ALIGNMENT, rounded) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (zero)
        memset(memory, 0, rounded);
    self->ptr = (CUdeviceptr)(uintptr_t)memory;
    self->owns = 1;
    return 0;
}

/* A DeviceArray in host memory (the CPU backend's): no CUDA context, no stream. */
mg_array *mg_arrays_host_create(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides)
{
    mg_array *self = mg_arrays_array_create(dtype, ndim, shape, strides);
    if (self != NULL) {
        self->host = 1;
        self->device = -1;
    }
    return self;
}

/* A fresh allocation; `zero` fills it with zero bytes on `stream`. With
 * `host`, host memory, and the stream is not used (the CPU backend runs
 * launches to completion). */
PyObject *mg_arrays_array_allocate(mg_dtype *dtype, int ndim, const Py_ssize_t *shape,
                                PyObject *stream_arg, int zero, int host)
{
    if (host) {
        mg_array *self = mg_arrays_host_create(dtype, ndim, shape, NULL);
        size_t nbytes = self == NULL ? 0 : (size_t)self->size * (size_t)dtype->itemsize;
        if (self != NULL && nbytes > 0 && host_allocate(self, nbytes, zero) < 0)
            Py_CLEAR(self);
        return (PyObject *)self;
    }
    CUstream stream;
    PyObject *stream_obj;
    if (parse_stream(stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    mg_array *self = mg_arrays_array_create(dtype, ndim, shape, NULL);
    if (self == NULL)
        return NULL;
    if (mg_cu_ensure_context() < 0)
        goto error;
    self->device = mg_cu_current_device();
    size_t nbytes = (size_t)self->size * (size_t)dtype->itemsize;
    /* cuMemAlloc refuses 0 bytes; an empty array needs no memory. */
    if (nbytes > 0) {
        if (mg_cu_check(mg_cu.cuMemAlloc(&self->ptr, nbytes), "cuMemAlloc") < 0)
            goto error;
        self->owns = 1;
        if (zero && mg_cu_check(mg_cu.cuMemsetD8Async(self->ptr, 0, nbytes, stream), "cuMemsetD8Async") < 0)
            goto error;
    }
    mg_array_set_stream((PyObject *)self, stream, stream_obj);
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static PyObject *allocate_function(PyObject *args, PyObject *kwargs, const char *format, int zero)
{
    static char *keywords[] = {"shape", "dtype", "stream", "host", NULL};
    PyObject *shape_obj, *stream_obj = Py_None;
    mg_dtype *dtype = mg_arrays_dtypes[MG_DT_F32];
    int host = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &shape_obj,
                                     mg_dtype_converter, &dtype, &stream_obj, &host))
        return NULL;
    int ndim;
    Py_ssize_t shape[MG_MAX_NDIM];
    if (mg_arrays_parse_shape(shape_obj, &ndim, shape) < 0)
        return NULL;
    return mg_arrays_array_allocate(dtype, ndim, shape, stream_obj, zero, host);
}

PyObject *mg_arrays_array_empty(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return allocate_function(args, kwargs, "O|O&O$p:empty", 0);
}

PyObject *mg_arrays_array_zeros(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return allocate_function(args, kwargs, "O|O&O$p:zeros", 1);
}

PyObject *mg_arrays_array_to_device(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"array", "stream", "host", NULL};
    PyObject *obj, *stream_arg = Py_None;
    int host_memory = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$p:to_device", keywords, &obj, &stream_arg, &host_memory))
        return NULL;
    CUstream stream = NULL;
    PyObject *stream_obj = NULL;
    if (!host_memory && parse_stream(stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    PyArrayObject *host = NULL;
    mg_array *self = NULL;
    mg_dtype *dtype;
    /* A C-contiguous, aligned, native-order host copy (or the array itself). */
    host = (PyArrayObject *)PyArray_FROM_OF(obj, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_NOTSWAPPED);
    if (host == NULL)
        goto error;
    if (mg_arrays_dtype_from_descr(PyArray_DESCR(host), &dtype) < 0)
        goto error;
    if (PyArray_NDIM(host) > MG_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "at most %d dimensions are supported, got %d",
                     MG_MAX_NDIM, PyArray_NDIM(host));
        goto error;
    }
    if (host_memory) {
        self = mg_arrays_host_create(dtype, PyArray_NDIM(host), PyArray_SHAPE(host), NULL);
        if (self == NULL)
            goto error;
        if (PyArray_NBYTES(host) > 0) {
            if (host_allocate(self, (size_t)PyArray_NBYTES(host), 0) < 0)
                goto error;
            memcpy((void *)(uintptr_t)self->ptr, PyArray_DATA(host), (size_t)PyArray_NBYTES(host));
        }
        Py_DECREF(host);
        return (PyObject *)self;
    }
    self = mg_arrays_array_create(dtype, PyArray_NDIM(host), PyArray_SHAPE(host), NULL);
    if (self == NULL || mg_cu_ensure_context() < 0)
        goto error;
    self->device = mg_cu_current_device();
    size_t nbytes = (size_t)PyArray_NBYTES(host);
    if (nbytes > 0) {
        if (mg_cu_check(mg_cu.cuMemAlloc(&self->ptr, nbytes), "cuMemAlloc") < 0)
            goto error;
        self->owns = 1;
        CUresult r;
        /* From pageable memory the call returns once the data is staged, so
         * the host copy may go as soon as it returns. */
        Py_BEGIN_ALLOW_THREADS
        r = mg_cu.cuMemcpyHtoDAsync(self->ptr, PyArray_DATA(host), nbytes, stream);
        Py_END_ALLOW_THREADS
        if (mg_cu_check(r, "cuMemcpyHtoDAsync") < 0)
            goto error;
    }
    mg_array_set_stream((PyObject *)self, stream, stream_obj);
    Py_DECREF(host);
    return (PyObject *)self;
error:
    Py_XDECREF(host);
    Py_XDECREF(self);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* DeviceArray: copies to the host                                         */
/* ---------------------------------------------------------------------- */

/* Copies `nbytes` from `src` to host `dst` on `stream`; with `blocking`,
 * waits for it. */
static int copy_to_host(mg_array *self, void *dst, CUdeviceptr src, size_t nbytes, CUstream stream, int blocking)
{
    if (self->host) {
        memcpy(dst, (const void *)(uintptr_t)src, nbytes);
        return 0;
    }
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return -1;
    CUresult r, synced = CUDA_SUCCESS;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuMemcpyDtoHAsync(dst, src, nbytes, stream);
    if (r == CUDA_SUCCESS && blocking)
        synced = mg_cu.cuStreamSynchronize(stream);
    Py_END_ALLOW_THREADS
    mg_cu_pop(pushed);
    if (r != CUDA_SUCCESS)
        return mg_cu_raise_on(r, "cuMemcpyDtoHAsync", NULL, &stream);
    if (synced != CUDA_SUCCESS)
        return mg_cu_raise_on(synced, "cuStreamSynchronize (after cuMemcpyDtoHAsync)", NULL, &stream);
    return 0;
}

/* After an asynchronous copy on `stream`: the array orders later work after
 * it, and a graph being captured keeps both ends of the copy alive. */
static int note_async_copy(mg_array *self, PyObject *host, CUstream stream, PyObject *stream_obj)
{
    mg_array_set_stream((PyObject *)self, stream, stream_obj);
    if (mg_graph_capturing() && (mg_graph_retain((PyObject *)self) < 0 || mg_graph_retain(host) < 0))
        return -1;
    return 0;
}

/* A new C-contiguous NumPy array with the contents of `self`; the copy is
 * waited for. */
static PyObject *array_to_numpy(mg_array *self, CUstream stream)
{
    PyArray_Descr *descr = (PyArray_Descr *)mg_dtype_numpy(self->dtype);
    if (descr == NULL)
        return NULL;
    Py_INCREF(descr);   /* one for the result, one for a strided view */
    PyArrayObject *result = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, descr, self->ndim, self->shape, NULL, NULL, 0, NULL);   /* steals */
    PyArrayObject *view = NULL;
    char *staging = NULL;
    if (result == NULL)
        goto error;
    if (self->size == 0) {
        Py_DECREF(descr);
        return (PyObject *)result;
    }
    if (mg_arrays_is_c_contiguous(self)) {
        if (copy_to_host(self, PyArray_DATA(result), self->ptr, (size_t)PyArray_NBYTES(result), stream, 1) < 0)
            goto error;
        Py_DECREF(descr);
        return (PyObject *)result;
    }
    /* Strided (negative and zero strides included): copy the byte range the
     * view spans, then let NumPy gather it through a view with our strides. */
    Py_ssize_t lo, hi;
    if (mg_arrays_byte_extent(self, &lo, &hi) < 0)
        goto error;
    staging = PyMem_Malloc((size_t)(hi - lo));
    if (staging == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    if (copy_to_host(self, staging, self->ptr + (CUdeviceptr)lo, (size_t)(hi - lo), stream, 1) < 0)
        goto error;
    view = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, descr, self->ndim, self->shape,
                                                 self->strides, staging - lo, 0, NULL);   /* steals */
    descr = NULL;
    if (view == NULL || PyArray_CopyInto(result, view) < 0)
        goto error;
    Py_DECREF(view);
    PyMem_Free(staging);
    return (PyObject *)result;
error:
    Py_XDECREF(descr);
    Py_XDECREF(view);   /* before the staging buffer it points into */
    PyMem_Free(staging);
    Py_XDECREF(result);
    return NULL;
}

/* stream= of a host copy: None is the stream the array was last used on
 * (with the object owning it, borrowed), so the copy is ordered after that use. */
static int stream_or_own(mg_array *self, PyObject *arg, CUstream *stream, PyObject **stream_obj)
{
    if (arg == NULL || arg == Py_None || self->host) {   /* a host array's copies need no stream */
        *stream = self->stream;
        *stream_obj = self->stream_obj;
        return 0;
    }
    return parse_stream(arg, stream, stream_obj);
}

/* A host array that a copy to or from `self` may use as is: a NumPy array
 * of the same dtype (else TypeError) and shape (else ValueError), with
 * `what` naming it in the messages. */
static int check_host_peer(mg_array *self, PyObject *obj, const char *what)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *host = (PyArrayObject *)obj;
    mg_dtype *dtype;
    if (mg_arrays_dtype_from_descr(PyArray_DESCR(host), &dtype) < 0)
        return -1;
    if (dtype != self->dtype) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %s, the array %s", what, dtype->name, self->dtype->name);
        return -1;
    }
    if (PyArray_NDIM(host) != self->ndim ||
        memcmp(PyArray_SHAPE(host), self->shape, (size_t)self->ndim * sizeof(Py_ssize_t)) != 0) {
        PyErr_Format(PyExc_ValueError, "%s has a different shape from the array", what);
        return -1;
    }
    return 0;
}

static int check_async_layout(mg_array *self, PyArrayObject *host, const char *call)
{
    if (!mg_arrays_is_c_contiguous(self) || (host != NULL && !PyArray_IS_C_CONTIGUOUS(host))) {
        PyErr_Format(PyExc_ValueError, "%s(blocking=False) copies C-contiguous arrays only: a strided one "
                     "is gathered on the host after the copy", call);
        return -1;
    }
    return 0;
}

PyObject *mg_arrays_array_get(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", "blocking", NULL};
    PyObject *stream_arg = Py_None, *stream_obj;
    int blocking = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op:get", keywords, &stream_arg, &blocking))
        return NULL;
    if (!blocking && check_async_layout(self, NULL, "get") < 0)
        return NULL;
    CUstream stream;
    if (stream_or_own(self, stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    if (blocking)
        return array_to_numpy(self, stream);
    PyArray_Descr *descr = (PyArray_Descr *)mg_dtype_numpy(self->dtype);
    if (descr == NULL)
        return NULL;
    PyObject *result = PyArray_Empty(self->ndim, self->shape, descr, 0);   /* steals descr */
    if (result == NULL)
        return NULL;
    if (self->size > 0 &&
        (copy_to_host(self, PyArray_DATA((PyArrayObject *)result), self->ptr,
                      (size_t)PyArray_NBYTES((PyArrayObject *)result), stream, 0) < 0 ||
         note_async_copy(self, result, stream, stream_obj) < 0))
        Py_CLEAR(result);
    return result;
}

PyObject *mg_arrays_array_copy_to_host(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"out", "stream", "blocking", NULL};
    PyObject *out, *stream_arg = Py_None, *stream_obj;
    int blocking = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Op:copy_to_host", keywords, &out, &stream_arg, &blocking))
        return NULL;
    if (check_host_peer(self, out, "out") < 0)
        return NULL;
    PyArrayObject *host = (PyArrayObject *)out;
    if (PyArray_FailUnlessWriteable(host, "out") < 0)
        return NULL;
    if (!blocking && check_async_layout(self, host, "copy_to_host") < 0)
        return NULL;
    CUstream stream;
    if (stream_or_own(self, stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    if (!blocking) {
        if (self->size > 0 &&
            (copy_to_host(self, PyArray_DATA(host), self->ptr, (size_t)PyArray_NBYTES(host), stream, 0) < 0 ||
             note_async_copy(self, out, stream, stream_obj) < 0))
            return NULL;
        return Py_NewRef(out);
    }
    if (PyArray_IS_C_CONTIGUOUS(host) && mg_arrays_is_c_contiguous(self)) {
        if (self->size > 0 && copy_to_host(self, PyArray_DATA(host), self->ptr, (size_t)PyArray_NBYTES(host), stream, 1) < 0)
            return NULL;
        return Py_NewRef(out);
    }
    PyObject *copy = array_to_numpy(self, stream);
    if (copy == NULL)
        return NULL;
    int status = PyArray_CopyInto(host, (PyArrayObject *)copy);
    Py_DECREF(copy);
    return status < 0 ? NULL : Py_NewRef(out);
}

/* dst.copy_from_host(src, stream=None): a NumPy array of the same dtype and
 * shape, both C-contiguous, copied in on `stream` (by default the array's
 * last-used stream) without waiting. From page-locked memory the call
 * returns at once; from pageable memory the driver stages the data first. */
static int refuse_readonly(mg_array *self, const char *call)
{
    if (!self->readonly)
        return 0;
    mg_raise(PyExc_ValueError, "%s: the array is read-only (its producer exported it so)", call);
    return -1;
}

PyObject *mg_arrays_array_copy_from_host(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"src", "stream", NULL};
    PyObject *src, *stream_arg = Py_None, *stream_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:copy_from_host", keywords, &src, &stream_arg))
        return NULL;
    if (refuse_readonly(self, "copy_from_host") < 0 || check_host_peer(self, src, "src") < 0)
        return NULL;
    PyArrayObject *host = (PyArrayObject *)src;
    if (!mg_arrays_is_c_contiguous(self) || !PyArray_IS_C_CONTIGUOUS(host))
        return mg_raise(PyExc_ValueError, "copy_from_host: both arrays must be C-contiguous");
    CUstream stream;
    if (stream_or_own(self, stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    size_t nbytes = (size_t)PyArray_NBYTES(host);
    if (self->host) {
        if (nbytes > 0)
            memmove((void *)(uintptr_t)self->ptr, PyArray_DATA(host), nbytes);
        Py_RETURN_NONE;
    }
    if (nbytes == 0)
        Py_RETURN_NONE;
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return NULL;
    CUresult r;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuMemcpyHtoDAsync(self->ptr, PyArray_DATA(host), nbytes, stream);
    Py_END_ALLOW_THREADS
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuMemcpyHtoDAsync") < 0 || note_async_copy(self, src, stream, stream_obj) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------- */
/* DeviceArray: copies between arrays                                      */
/* ---------------------------------------------------------------------- */

/* An mlirgpu.Stream given for work on `device` must belong to it (other
 * stream objects, and None, name a stream of the current context). */
static int check_stream_device(PyObject *stream_obj, int device, const char *call)
{
    if (stream_obj == NULL || !PyObject_TypeCheck(stream_obj, mg_cu_Stream_type) ||
        mg_cu_stream_device(stream_obj) == device)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: the stream belongs to device %d, the copy runs on device %d", call,
                 mg_cu_stream_device(stream_obj), device);
    return -1;
}

/* dst <- src between devices, on `stream` (of dst's device). The copy waits
 * for the source's last stream, and that stream for the copy, so that
 * neither a later write to the source nor its release overtakes it. */
static int copy_across(mg_array *dst, mg_array *src, size_t nbytes, CUstream stream)
{
    if (mg_cu_stream_order_across(src->stream, src->device, stream, dst->device) < 0 ||
        mg_cu_copy_peer(dst->ptr, dst->device, src->ptr, src->device, nbytes, stream) < 0)
        return -1;
    return mg_cu_stream_order_across(stream, dst->device, src->stream, src->device);
}

/* to(device, stream=None): the array on `device`, itself where it is
 * there already, else a C-contiguous copy made on `stream`. */
PyObject *mg_arrays_array_to(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"device", "stream", NULL};
    int device;
    PyObject *stream_arg = Py_None, *stream_obj;
    CUstream stream;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|O:to", keywords, mg_cu_device_converter, &device,
                                     &stream_arg))
        return NULL;
    if (self->host)
        return mg_raise(PyExc_TypeError, "to: a host DeviceArray (the CPU backend's) is on no device: "
                        "copy it with mlirgpu.to_device(array.get())");
    if (device == self->device)
        return Py_NewRef((PyObject *)self);
    if (!mg_arrays_is_c_contiguous(self))
        return mg_raise(PyExc_ValueError, "to: the array must be C-contiguous");
    if (parse_stream(stream_arg, &stream, &stream_obj) < 0 || check_stream_device(stream_obj, device, "to") < 0)
        return NULL;
    mg_array *copy = mg_arrays_array_create(self->dtype, self->ndim, self->shape, NULL);
    if (copy == NULL)
        return NULL;
    copy->device = device;
    size_t nbytes = (size_t)self->size * (size_t)self->dtype->itemsize;
    if (nbytes > 0) {
        int pushed;
        if (mg_cu_push(device, &pushed) < 0)
            goto error;
        CUresult r = mg_cu.cuMemAlloc(&copy->ptr, nbytes);
        mg_cu_pop(pushed);
        if (mg_cu_check(r, "cuMemAlloc") < 0)
            goto error;
        copy->owns = 1;
        if (copy_across(copy, self, nbytes, stream) < 0)
            goto error;
    }
    mg_array_set_stream((PyObject *)copy, stream, stream_obj);
    return (PyObject *)copy;
error:
    Py_DECREF(copy);
    return NULL;
}

/* dst.copy_from(src, stream=None): both C-contiguous, of one shape and
 * dtype, both in device memory (cuMemcpyDtoDAsync on `stream`, not waited
 * for) or both in host memory (memcpy). A snapshot taken this way can be
 * restored the same way (mlirgpu.autotune does, around its timing runs). */
PyObject *mg_arrays_array_copy_from(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"src", "stream", NULL};
    PyObject *src_obj, *stream_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|O:copy_from", keywords, mg_array_type, &src_obj,
                                     &stream_arg))
        return NULL;
    mg_array *src = (mg_array *)src_obj;
    if (refuse_readonly(self, "copy_from") < 0)
        return NULL;
    if (src->dtype != self->dtype)
        return PyErr_Format(PyExc_TypeError, "copy_from: src has dtype %s, the array %s", src->dtype->name,
                            self->dtype->name);
    if (src->ndim != self->ndim || memcmp(src->shape, self->shape, (size_t)self->ndim * sizeof(Py_ssize_t)) != 0)
        return mg_raise(PyExc_ValueError, "copy_from: src has a different shape from the array");
    if (!mg_arrays_is_c_contiguous(self) || !mg_arrays_is_c_contiguous(src))
        return mg_raise(PyExc_ValueError, "copy_from: both arrays must be C-contiguous");
    if (src->host != self->host)
        return mg_raise(PyExc_ValueError, "copy_from: one array is in host memory and the other in device memory");
    size_t nbytes = (size_t)self->size * (size_t)self->dtype->itemsize;
    if (self->host) {
        if (nbytes > 0)
            memmove((void *)(uintptr_t)self->ptr, (const void *)(uintptr_t)src->ptr, nbytes);
        Py_RETURN_NONE;
    }
    CUstream stream;
    PyObject *stream_obj;
    if (parse_stream(stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    if (check_stream_device(stream_obj, self->device, "copy_from") < 0)
        return NULL;
    if (src->device != self->device) {
        if (nbytes > 0 && copy_across(self, src, nbytes, stream) < 0)
            return NULL;
        mg_array_set_stream((PyObject *)self, stream, stream_obj);
        Py_RETURN_NONE;
    }
    if (nbytes > 0) {
        int pushed;
        if (mg_cu_push(self->device, &pushed) < 0)
            return NULL;
        CUresult r;
        Py_BEGIN_ALLOW_THREADS
        r = mg_cu.cuMemcpyDtoDAsync(self->ptr, src->ptr, nbytes, stream);
        Py_END_ALLOW_THREADS
        mg_cu_pop(pushed);
        if (mg_cu_check(r, "cuMemcpyDtoDAsync") < 0)
            return NULL;
    }
    mg_array_set_stream((PyObject *)self, stream, stream_obj);
    mg_array_set_stream((PyObject *)src, stream, stream_obj);
    if (mg_graph_capturing() && (mg_graph_retain((PyObject *)self) < 0 || mg_graph_retain(src_obj) < 0))
        return NULL;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------- */
/* DeviceArray: properties                                                 */
/* ---------------------------------------------------------------------- */

static PyObject *ssize_tuple(int n, const Py_ssize_t *values)
{
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *item = PyLong_FromSsize_t(values[i]);
        if (item == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, item);
    }
    return tuple;
}

PyObject *mg_arrays_array_get_shape(mg_array *self, void *closure) { return ssize_tuple(self->ndim, self->shape); }
PyObject *mg_arrays_array_get_strides(mg_array *self, void *closure) { return ssize_tuple(self->ndim, self->strides); }
PyObject *mg_arrays_array_get_dtype(mg_array *self, void *closure) { return Py_NewRef((PyObject *)self->dtype); }
PyObject *mg_arrays_array_get_nbytes(mg_array *self, void *closure) { return PyLong_FromSsize_t(self->size * self->dtype->itemsize); }
PyObject *mg_arrays_array_get_ptr(mg_array *self, void *closure) { return PyLong_FromUnsignedLongLong(self->ptr); }
PyObject *mg_arrays_array_get_host(mg_array *self, void *closure) { return PyBool_FromLong(self->host); }
PyObject *mg_arrays_array_get_readonly(mg_array *self, void *closure) { return PyBool_FromLong(self->readonly); }
PyObject *mg_arrays_array_get_contiguous(mg_array *self, void *closure) { return PyBool_FromLong(mg_arrays_is_c_contiguous(self)); }

/* __cuda_array_interface__ version 3. */
PyObject *mg_arrays_array_get_cai(mg_array *self, void *closure)
{
    if (self->host)
        return mg_raise(PyExc_AttributeError, "a DeviceArray of the CPU backend is host memory: it has no "
                        "__cuda_array_interface__ (use __dlpack__ or get())");
    if (self->dtype->typestr == NULL)
        return PyErr_Format(PyExc_TypeError, "%s has no __cuda_array_interface__ typestr: use __dlpack__",
                            self->dtype->name);
    PyObject *shape = NULL, *strides = NULL, *result = NULL;
    shape = ssize_tuple(self->ndim, self->shape);
    strides = mg_arrays_is_c_contiguous(self) ? Py_NewRef(Py_None) : ssize_tuple(self->ndim, self->strides);
    if (shape == NULL || strides == NULL)
        goto error;
    /* The consumer syncs on the stream that last used the array; 1 is the
     * legacy default stream (0 is not allowed by v3). */
    unsigned long long stream = self->stream == NULL ? 1 : (unsigned long long)(uintptr_t)self->stream;
    unsigned long long data = self->size == 0 ? 0 : (unsigned long long)self->ptr;
    result = Py_BuildValue("{s:O,s:s,s:(KO),s:i,s:O,s:K}", "shape", shape, "typestr", self->dtype->typestr,
                           "data", data, self->readonly ? Py_True : Py_False, "version", 3, "strides", strides, "stream", stream);
error:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return result;
}

PyObject *mg_arrays_array_repr(mg_array *self)
{
    PyObject *shape = ssize_tuple(self->ndim, self->shape);
    if (shape == NULL)
        return NULL;
    /* What .device and .is_host say: a host array's device is -1. */
    PyObject *repr = self->host
        ? PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=mlirgpu.%s, device=-1, is_host=True)", shape,
                               self->dtype->name)
        : PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=mlirgpu.%s, device=%d)",
                               shape, self->dtype->name, self->device);
    Py_DECREF(shape);
    return repr;
}

Py_ssize_t mg_arrays_array_length(mg_array *self)
{
    if (self->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d DeviceArray");
        return -1;
    }
    return self->shape[0];
}

