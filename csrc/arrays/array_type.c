/* DeviceArray's views, copies and NumPy habits (d[...], d.T, reshape,
 * copy, fill), the types' tables, and mg_array_init: the top of arrays/. */
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
/* Views, copies and NumPy's habits: d[...], d.T, reshape, copy, fill      */
/* ---------------------------------------------------------------------- */

/* A view of `base`'s memory (same device, host flag and last-used stream),
 * keeping `base` alive. `strides` NULL: C-contiguous. */
static PyObject *array_view(mg_array *base, Py_ssize_t offset, int ndim, const Py_ssize_t *shape,
                            const Py_ssize_t *strides)
{
    mg_array *view = mg_arrays_array_create(base->dtype, ndim, shape, strides);
    if (view == NULL)
        return NULL;
    /* An empty view reads nothing: keep the base's address rather than one past its end. */
    view->ptr = view->size > 0 ? (CUdeviceptr)((intptr_t)base->ptr + offset) : base->ptr;
    view->device = base->device;
    view->host = base->host;
    view->readonly = base->readonly;   /* a view of read-only memory is read-only too */
    view->owner = Py_NewRef((PyObject *)base);
    mg_array_set_stream((PyObject *)view, base->stream, base->stream_obj);
    return (PyObject *)view;
}

static int is_bool_scalar(PyObject *item) { return PyBool_Check(item) || PyArray_IsScalar(item, Bool); }

/* d[True] / d[False]: NumPy reads a bool scalar as a mask, not as 1 or 0:
 * a view under a new first axis of extent 1 (or 0, empty). */
static PyObject *bool_mask_view(mg_array *self, PyObject *mask)
{
    if (self->ndim == MG_MAX_NDIM)
        return mg_raise(PyExc_IndexError, "d[%s] adds a dimension: a DeviceArray has at most %d",
                        PyObject_IsTrue(mask) ? "True" : "False", MG_MAX_NDIM);
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
    shape[0] = PyObject_IsTrue(mask) ? 1 : 0;
    strides[0] = 0;
    memcpy(shape + 1, self->shape, (size_t)self->ndim * sizeof *shape);
    memcpy(strides + 1, self->strides, (size_t)self->ndim * sizeof *strides);
    return array_view(self, 0, self->ndim + 1, shape, strides);
}

/* d[i], d[a:b:c], d[i, ..., a:b]: basic indexing, as NumPy's, gives a view
 * (a 0-d one for as many ints as dimensions). */
static PyObject *array_subscript(mg_array *self, PyObject *key)
{
    PyObject *lone = PyTuple_Check(key) && PyTuple_GET_SIZE(key) == 1 ? PyTuple_GET_ITEM(key, 0) : key;
    if (is_bool_scalar(lone))
        return bool_mask_view(self, lone);
    PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
    if (items == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(items), used = 0, ellipsis = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (item == Py_Ellipsis) {
            if (ellipsis >= 0) {
                Py_DECREF(items);
                return mg_raise(PyExc_IndexError, "an index can only have a single ellipsis ('...')");
            }
            ellipsis = i;
        }
        else if (is_bool_scalar(item)) {
            Py_DECREF(items);
            return mg_raise(PyExc_IndexError, "a bool index is a mask: DeviceArray takes one only alone, "
                            "as d[True] or d[False]");
        }
        else if (item == Py_None) {
            Py_DECREF(items);
            return mg_raise(PyExc_IndexError, "DeviceArray indexing does not add dimensions (None): "
                            "use reshape()");
        }
        else {
            used++;
        }
    }
    if (used > self->ndim) {
        Py_DECREF(items);
        return mg_raise(PyExc_IndexError, "too many indices for a %d-d DeviceArray: %zd", self->ndim, used);
    }
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM], offset = 0;
    int out = 0, dim = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (item == Py_Ellipsis) {
            for (Py_ssize_t k = 0; k < self->ndim - used; k++, dim++, out++) {
                shape[out] = self->shape[dim];
                strides[out] = self->strides[dim];
            }
        }
        else if (PySlice_Check(item)) {
            Py_ssize_t start, stop, step;
            if (PySlice_Unpack(item, &start, &stop, &step) < 0) {
                Py_DECREF(items);
                return NULL;
            }
            shape[out] = PySlice_AdjustIndices(self->shape[dim], &start, &stop, step);
            strides[out] = self->strides[dim] * step;
            offset += start * self->strides[dim];
            out++, dim++;
        }
        else {
            Py_ssize_t index = PyNumber_AsSsize_t(item, PyExc_IndexError);
            if (index == -1 && PyErr_Occurred()) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_TypeError, "DeviceArray indices are ints, slices and '...', not "
                                 "%.100s (read elements on the host: d.get()[...])", Py_TYPE(item)->tp_name);
                }
                Py_DECREF(items);
                return NULL;
            }
            Py_ssize_t extent = self->shape[dim];
            if (index < -extent || index >= extent) {
                Py_DECREF(items);
                return mg_raise(PyExc_IndexError, "index %zd is out of bounds for dimension %d of size %zd",
                                index, dim, extent);
            }
            offset += (index < 0 ? index + extent : index) * self->strides[dim];
            dim++;
        }
    }
    Py_DECREF(items);
    for (; dim < self->ndim; dim++, out++) {
        shape[out] = self->shape[dim];
        strides[out] = self->strides[dim];
    }
    return array_view(self, offset, out, shape, strides);
}

static PyObject *array_get_transpose(mg_array *self, void *closure)
{
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
    for (int i = 0; i < self->ndim; i++) {
        shape[i] = self->shape[self->ndim - 1 - i];
        strides[i] = self->strides[self->ndim - 1 - i];
    }
    return array_view(self, 0, self->ndim, shape, strides);
}

static PyObject *array_get_itemsize(mg_array *self, void *closure)
{
    return PyLong_FromLong(self->dtype->itemsize);
}

/* reshape(2, 3) or reshape((2, 3)); one extent may be -1. A view of a C-contiguous array. */
static PyObject *array_reshape(mg_array *self, PyObject *args)
{
    PyObject *dims = args;
    if (PyTuple_GET_SIZE(args) == 1 && (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) ||
                                        PyList_Check(PyTuple_GET_ITEM(args, 0))))
        dims = PyTuple_GET_ITEM(args, 0);
    PyObject *seq = PySequence_Fast(dims, "reshape takes ints or a tuple of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), shape[MG_MAX_NDIM], known = 1;
    int unknown = -1;
    if (n > MG_MAX_NDIM) {
        Py_DECREF(seq);
        return mg_raise(PyExc_ValueError, "a DeviceArray has at most %d dimensions", MG_MAX_NDIM);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        shape[i] = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i), PyExc_ValueError);
        if (shape[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (shape[i] == -1 && unknown < 0) {
            unknown = (int)i;
        }
        else if (shape[i] < 0) {
            Py_DECREF(seq);
            return mg_raise(PyExc_ValueError, "reshape: extents are non-negative (one may be -1)");
        }
        else if (mg_arrays_checked_mul(known, shape[i], &known) < 0) {
            Py_DECREF(seq);
            return mg_raise(PyExc_ValueError, "reshape: the new shape's size exceeds the maximum allowed size");
        }
    }
    Py_DECREF(seq);
    if (unknown >= 0)
        shape[unknown] = known == 0 ? 0 : self->size / known;
    /* Cannot overflow: the -1 extent keeps the product within self->size. */
    Py_ssize_t size = unknown >= 0 ? known * shape[unknown] : known;
    if (size != self->size)
        return mg_raise(PyExc_ValueError, "cannot reshape a DeviceArray of %zd elements into %zd elements",
                        self->size, size);
    if (!mg_arrays_is_c_contiguous(self))
        return mg_raise(PyExc_ValueError, "reshape needs a C-contiguous DeviceArray: copy() the view first");
    return array_view(self, 0, (int)n, shape, NULL);
}

/* A new C-contiguous array with the same contents, in the same kind of memory. */
static PyObject *array_copy(mg_array *self, PyObject *unused)
{
    PyObject *copy = mg_arrays_array_allocate(self->dtype, self->ndim, self->shape, Py_None, 0, self->host);
    if (copy == NULL || self->size == 0)
        return copy;
    PyObject *done;
    if (mg_arrays_is_c_contiguous(self)) {
        done = PyObject_CallMethod(copy, "copy_from", "O", (PyObject *)self);
    }
    else {   /* a strided view: gathered on the host */
        PyObject *host = PyObject_CallMethod((PyObject *)self, "get", NULL);
        done = host == NULL ? NULL : PyObject_CallMethod(copy, "copy_from_host", "O", host);
        Py_XDECREF(host);
    }
    if (done == NULL) {
        Py_DECREF(copy);
        return NULL;
    }
    Py_DECREF(done);
    return copy;
}

/* fill(value): every element set to `value`, converted as NumPy converts it. */
static PyObject *array_fill(mg_array *self, PyObject *value)
{
    if (!mg_arrays_is_c_contiguous(self))
        return mg_raise(PyExc_ValueError, "fill() of a strided DeviceArray view: fill a C-contiguous array");
    PyArray_Descr *descr = (PyArray_Descr *)mg_dtype_numpy(self->dtype);
    if (descr == NULL)
        return NULL;
    PyObject *host = PyArray_Empty(self->ndim, self->shape, descr, 0);   /* steals descr */
    if (host == NULL)
        return NULL;
    PyObject *done = NULL;
    if (PyArray_FillWithScalar((PyArrayObject *)host, value) == 0 && self->size > 0)
        done = PyObject_CallMethod((PyObject *)self, "copy_from_host", "O", host);
    else if (!PyErr_Occurred())
        done = Py_NewRef(Py_None);
    Py_DECREF(host);
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    Py_RETURN_NONE;
}

/* np.asarray(d) would make a 0-d object array: refused, as CuPy does. */
static PyObject *array_array(mg_array *self, PyObject *args, PyObject *kwargs)
{
    return mg_raise(PyExc_TypeError, "implicit conversion of a DeviceArray to a NumPy array is not allowed: "
                    "call .get() for a NumPy copy%s", self->host ? " (or np.from_dlpack(d) for a zero-copy view "
                    "of a host array)" : "");
}

/* ---------------------------------------------------------------------- */
/* Type and module setup                                                   */
/* ---------------------------------------------------------------------- */

static PyMethodDef array_methods[] = {
    {"get", (PyCFunction)(void (*)(void))mg_arrays_array_get, METH_VARARGS | METH_KEYWORDS,
     "get(stream=None, blocking=True): a new numpy.ndarray with the contents. By default the copy "
     "is ordered on the stream that last used the array; blocking=False does not wait for it."},
    {"copy_to_host", (PyCFunction)(void (*)(void))mg_arrays_array_copy_to_host, METH_VARARGS | METH_KEYWORDS,
     "copy_to_host(out, stream=None, blocking=True): copies into the numpy.ndarray `out` (same shape and "
     "dtype); returns out. blocking=False does not wait (C-contiguous arrays; truly asynchronous into "
     "pinned memory)."},
    {"copy_from_host", (PyCFunction)(void (*)(void))mg_arrays_array_copy_from_host, METH_VARARGS | METH_KEYWORDS,
     "copy_from_host(src, stream=None): copies the numpy.ndarray `src` (same shape and dtype, both "
     "C-contiguous) into this array on `stream` (default: the array's last-used stream), not waited for."},
    {"to", (PyCFunction)(void (*)(void))mg_arrays_array_to, METH_VARARGS | METH_KEYWORDS,
     "to(device, stream=None): the array on `device` (an ordinal or mlirgpu.cuda.Device): itself if it is "
     "there, else a copy made on `stream` (a stream of that device), peer to peer where the devices allow."},
    {"copy_from", (PyCFunction)(void (*)(void))mg_arrays_array_copy_from, METH_VARARGS | METH_KEYWORDS,
     "copy_from(src, stream=None): copies the DeviceArray `src` (same shape and dtype, both C-contiguous, "
     "both in device or both in host memory) into this one; device to device on `stream`, not waited for."},
    {"__dlpack__", (PyCFunction)(void (*)(void))mg_arrays_array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None): a DLPack capsule."},
    {"copy", (PyCFunction)array_copy, METH_NOARGS,
     "copy(): a new C-contiguous DeviceArray with the same contents (a strided view is gathered)."},
    {"fill", (PyCFunction)array_fill, METH_O,
     "fill(value): sets every element of a C-contiguous array to `value`."},
    {"reshape", (PyCFunction)array_reshape, METH_VARARGS,
     "reshape(*shape): a view of a C-contiguous array with another shape; one extent may be -1."},
    {"__array__", (PyCFunction)(void (*)(void))array_array, METH_VARARGS | METH_KEYWORDS,
     "Refused: np.asarray(d) does not copy device memory; call d.get()."},
    {"__dlpack_device__", (PyCFunction)mg_arrays_array_dlpack_device, METH_NOARGS,
     "(2, ordinal): kDLCUDA; (1, 0): kDLCPU for a host array (the CPU backend's)."},
    {NULL},
};

static PyGetSetDef array_getset[] = {
    {"shape", (getter)mg_arrays_array_get_shape, NULL, NULL, NULL},
    {"strides", (getter)mg_arrays_array_get_strides, NULL, "Strides in bytes, like NumPy.", NULL},
    {"dtype", (getter)mg_arrays_array_get_dtype, NULL, NULL, NULL},
    {"nbytes", (getter)mg_arrays_array_get_nbytes, NULL, NULL, NULL},
    {"ptr", (getter)mg_arrays_array_get_ptr, NULL, "The address of the first element (a host address for a host array).", NULL},
    {"is_c_contiguous", (getter)mg_arrays_array_get_contiguous, NULL, NULL, NULL},
    {"__cuda_array_interface__", (getter)mg_arrays_array_get_cai, NULL,
     "Version 3; TypeError for bf16; AttributeError for a host array.", NULL},
    {"is_host", (getter)mg_arrays_array_get_host, NULL, "True for host memory (a DeviceArray of the CPU backend).", NULL},
    {"readonly", (getter)mg_arrays_array_get_readonly, NULL, "True for memory its producer exported read-only "
     "(__cuda_array_interface__ data[1], DLPack's read-only flag): copies into it and kernels that store to it "
     "are refused, and its own exports say so.", NULL},
    {"T", (getter)array_get_transpose, NULL, "The transposed view (dimensions reversed).", NULL},
    {"itemsize", (getter)array_get_itemsize, NULL, "Bytes of one element.", NULL},
    {NULL},
};

static PyMemberDef array_members[] = {
    {"ndim", T_INT, offsetof(mg_array, ndim), READONLY, NULL},
    {"size", T_PYSSIZET, offsetof(mg_array, size), READONLY, "Number of elements."},
    {"device", T_INT, offsetof(mg_array, device), READONLY, "CUDA ordinal; -1 for a host array."},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(mg_array, weakrefs), READONLY},
    {NULL},
};

static PyType_Slot array_slots[] = {
    {Py_tp_doc, "An array in CUDA device memory (host memory on the CPU backend), made by mlirgpu.empty, "
                "zeros, to_device and asarray.\n\nFor example::\n\n"
                "    d = mg.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))\n"
                "    d.shape, d.dtype, d.strides, d.nbytes, len(d)\n"
                "    host = d.get()              # a NumPy copy\n"
                "    torch.from_dlpack(d)        # zero-copy exchange: DLPack, __cuda_array_interface__"},
    {Py_tp_dealloc, mg_arrays_array_dealloc},
    {Py_tp_traverse, mg_arrays_array_traverse},
    {Py_tp_clear, mg_arrays_array_clear},
    {Py_tp_repr, mg_arrays_array_repr},
    {Py_sq_length, mg_arrays_array_length},
    {Py_mp_length, mg_arrays_array_length},
    {Py_mp_subscript, array_subscript},
    {Py_tp_methods, array_methods},
    {Py_tp_getset, array_getset},
    {Py_tp_members, array_members},
    {0, NULL},
};

static PyType_Spec array_spec = {
    .name = "mlirgpu.DeviceArray",
    .basicsize = sizeof(mg_array),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = array_slots,
};

static PyMethodDef array_functions[] = {
    {"dtype", mg_arrays_array_dtype_function, METH_O,
     "dtype(x): the mlirgpu dtype of a DType, numpy dtype, NumPy scalar type or name.\n\nFor example::\n\n"
     "    mg.dtype(np.float32)     # mlirgpu.f32\n"
     "    mg.dtype(\"float64\")      # mlirgpu.f64\n"
     "    mg.dtype(\"i8\")           # mlirgpu.i8 (mlirgpu's names give bits, not bytes)"},
    {"empty", (PyCFunction)(void (*)(void))mg_arrays_array_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype=f32, stream=None, *, host=False): an uninitialized DeviceArray (host memory with "
     "host=True: the CPU backend's)."},
    {"zeros", (PyCFunction)(void (*)(void))mg_arrays_array_zeros, METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype=f32, stream=None, *, host=False): a DeviceArray of zeros (set on `stream`)."},
    {"to_device", (PyCFunction)(void (*)(void))mg_arrays_array_to_device, METH_VARARGS | METH_KEYWORDS,
     "to_device(array, stream=None, *, host=False): a DeviceArray copy of a NumPy array or array-like."},
    {"pinned_empty", (PyCFunction)(void (*)(void))mg_arrays_array_pinned_empty, METH_VARARGS | METH_KEYWORDS,
     "pinned_empty(shape, dtype=f32, *, host=False): an uninitialized numpy.ndarray in page-locked host "
     "memory (cuMemHostAlloc, portable), freed when the last array on it dies; ordinary memory with "
     "host=True (the CPU backend's) or for zero bytes."},
    {"pinned_zeros", (PyCFunction)(void (*)(void))mg_arrays_array_pinned_zeros, METH_VARARGS | METH_KEYWORDS,
     "pinned_zeros(shape, dtype=f32, *, host=False): pinned_empty filled with zeros."},
    {"asarray", (PyCFunction)(void (*)(void))mg_arrays_array_asarray_function, METH_VARARGS | METH_KEYWORDS,
     "asarray(obj, *, host=False, synchronize=True): obj itself if a DeviceArray, else a zero-copy view of a "
     "__cuda_array_interface__ or CUDA __dlpack__ object; with host=True, of a host __dlpack__ object. "
     "synchronize=False: the producer orders none of its pending work before the view (DLPack's stream -1), "
     "for a caller that uses it on the producer's own current stream."},
    {NULL},
};

static int intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

/* The graph replay's callback (cuda/graph.h): a replayed array was last used on the replay's stream. */
static void graph_replayed(PyObject *retained, CUstream stream, PyObject *stream_obj)
{
    if (mg_array_check_device(retained))
        mg_array_set_stream(retained, stream, stream_obj);
}

int mg_array_init(PyObject *module)
{
    static const mg_graph_hooks graph_hooks = {.replayed = graph_replayed};
    mg_graph_register_hooks(&graph_hooks);
    if (intern(&mg_arrays_str_cai, "__cuda_array_interface__") < 0 || intern(&mg_arrays_str_dlpack, "__dlpack__") < 0 ||
        intern(&mg_arrays_str_dlpack_device, "__dlpack_device__") < 0 ||
        intern(&mg_arrays_str_array_interface, "__array_interface__") < 0 || intern(&mg_arrays_str_array, "__array__") < 0 ||
        intern(&mg_arrays_str_is_cuda, "is_cuda") < 0 || intern(&mg_arrays_str_is_cpu, "is_cpu") < 0 ||
        intern(&mg_arrays_str_data_ptr, "data_ptr") < 0 || intern(&mg_arrays_str_dtype_attr, "dtype") < 0 ||
        intern(&mg_arrays_str_shape, "shape") < 0 || intern(&mg_arrays_str_stride, "stride") < 0 ||
        intern(&mg_arrays_str_get_device, "get_device") < 0 || intern(&mg_arrays_str_module, "__module__") < 0 ||
        intern(&mg_arrays_str_is_contiguous, "is_contiguous") < 0 || intern(&mg_arrays_str_data, "data") < 0 ||
        intern(&mg_arrays_str_ptr, "ptr") < 0 || intern(&mg_arrays_str_device_id, "device_id") < 0 ||
        intern(&mg_arrays_str_c_contiguous, "_c_contiguous") < 0 || intern(&mg_arrays_str_strides, "strides") < 0 ||
        intern(&mg_arrays_str_get_current_stream, "get_current_stream") < 0 ||
        intern(&mg_arrays_str_export_version, "CUDA_ARRAY_INTERFACE_EXPORT_VERSION") < 0 ||
        intern(&mg_arrays_str_cupy_cuda, "cupy.cuda") < 0 || intern(&mg_arrays_str_cupy_util, "cupy._util") < 0 ||
        intern(&mg_arrays_str_is_ready, "is_ready") < 0 || intern(&mg_arrays_str_block_until_ready, "block_until_ready") < 0 ||
        intern(&mg_arrays_str_unsafe_buffer_pointer, "unsafe_buffer_pointer") < 0 ||
        intern(&mg_arrays_str_is_deleted, "is_deleted") < 0 || intern(&mg_arrays_str_aval, "aval") < 0 ||
        intern(&mg_arrays_str_ndim, "ndim") < 0 ||
        intern(&mg_arrays_str_torch_function, "__torch_function__") < 0 ||
        intern(&mg_arrays_str_torch_dispatch, "__torch_dispatch__") < 0 || intern(&mg_arrays_str_torch_c, "torch._C") < 0 ||
        intern(&mg_arrays_str_disabled_torch_function, "_disabled_torch_function_impl") < 0 ||
        intern(&mg_arrays_str_torch_utils_dlpack, "torch.utils.dlpack") < 0 || intern(&mg_arrays_str_to_dlpack, "to_dlpack") < 0 ||
        intern(&mg_arrays_str_dlpack_exchange, "__dlpack_c_exchange_api__") < 0 ||
        intern(&mg_arrays_str_pyx_capi, "__pyx_capi__") < 0 || intern(&mg_arrays_str_cupy_backends_stream, "cupy_backends.cuda.stream") < 0 ||
        intern(&mg_arrays_str_get_current_stream_ptr, "get_current_stream_ptr") < 0 ||
        intern(&mg_arrays_str_get_stream_ptr, "get_stream_ptr") < 0 ||
        intern(&mg_arrays_str_is_ptds_enabled, "is_ptds_enabled") < 0 || intern(&mg_arrays_str_memory_pointer, "MemoryPointer") < 0)
        return -1;
    if ((mg_arrays_torch_dtypes = PyDict_New()) == NULL)
        return -1;
    if ((mg_DType_type = mg_add_type(module, &mg_arrays_dtype_spec, NULL)) == NULL ||
        (mg_array_type = mg_add_type(module, &array_spec, NULL)) == NULL ||
        (mg_arrays_pinned_type = mg_add_type(module, &mg_arrays_pinned_spec, NULL)) == NULL)
        return -1;
    for (int id = 0; id < MG_DT_COUNT; id++) {
        mg_dtype *dt = (mg_dtype *)mg_DType_type->tp_alloc(mg_DType_type, 0);
        if (dt == NULL)
            return -1;
        dt->id = (mg_dtype_id)id;
        dt->name = mg_arrays_dtype_table[id].name;
        dt->itemsize = mg_arrays_dtype_table[id].itemsize;
        dt->kind = mg_arrays_dtype_table[id].kind;
        dt->dlpack_code = mg_arrays_dtype_table[id].dlpack_code;
        dt->bits = (uint8_t)(8 * mg_arrays_dtype_table[id].itemsize);
        dt->typestr = mg_arrays_dtype_table[id].typestr;
        dt->npy_type = mg_arrays_dtype_table[id].npy_type;
        dt->hash = -1;
        mg_arrays_dtypes[id] = dt;
        if (PyModule_AddObjectRef(module, dt->name, (PyObject *)dt) < 0)
            return -1;
    }
    return PyModule_AddFunctions(module, array_functions);
}
