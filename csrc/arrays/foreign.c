/* Foreign arrays: asarray, and what a launch needs to know of an array
 * argument (mg_array_foreign_info, mg_array_foreign_pointer). */
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
static int refuse_deleted_jax(PyObject *obj);

/* A view of a CUDA torch tensor read as a launch reads it (torch's DLPack
 * exchange table: one C call), where no ordering is asked for: torch builds
 * its __cuda_array_interface__ in Python on every access, and a bf16 tensor
 * then goes through __dlpack__ too. NULL with no error set: not such a
 * tensor, take the protocols. */
static PyObject *torch_view(PyObject *obj)
{
    reader_info info;
    if (!mg_arrays_known_reader(Py_TYPE(obj), &info)) {
        mg_arrays_reader_info_release(&info);
        if (mg_arrays_reader_of(Py_TYPE(obj), &info) < 0)
            return NULL;
    }
    mg_foreign f = {.device = -1, .contiguous = 1};
    int status = info.reader == READER_TORCH ? mg_arrays_torch_read(obj, &info.reads->torch, &f, 1) : 0;
    mg_arrays_reader_info_release(&info);
    if (status <= 0 || f.host || f.dtype == NULL || f.view != NULL)
        return NULL;    /* status -1 has set the error */
    return mg_arrays_view_at(f.dtype, f.ndim, f.shape, f.strides, f.ptr, f.readonly, f.device, obj);
}

PyObject *mg_array_asarray(PyObject *obj, int synchronize)
{
    if (PyObject_TypeCheck(obj, mg_array_type))
        return Py_NewRef(obj);
    if (PyArray_Check(obj))
        return mg_arrays_host_array_error(obj);
    if (refuse_deleted_jax(obj) < 0)
        return NULL;
    if (!synchronize) {
        PyObject *view = torch_view(obj);
        if (view != NULL || PyErr_Occurred())
            return view;
    }
    if (PyCapsule_CheckExact(obj))
        return mg_arrays_view_from_capsule(obj);
    PyObject *cai = PyObject_GetAttr(obj, mg_arrays_str_cai);
    if (cai != NULL) {
        int untyped = mg_arrays_cai_untyped(obj, cai);
        PyObject *view = untyped ? NULL : mg_arrays_view_from_cai(obj, cai, synchronize);
        Py_DECREF(cai);
        return untyped ? mg_arrays_view_from_dlpack(obj, synchronize) : view;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    /* No interface, or one that cannot describe this array (torch raises for
     * its 8-bit floats, which the interface has no type string for): DLPack
     * may, and says so itself when it cannot either. */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int missing = PyErr_GivenExceptionMatches(type, PyExc_AttributeError);
    int has_dlpack = PyObject_HasAttr(obj, mg_arrays_str_dlpack);
    if (has_dlpack || missing) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
    else {
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    if (has_dlpack)
        return mg_arrays_view_from_dlpack(obj, synchronize);
    if (PyObject_HasAttr(obj, mg_arrays_str_array_interface) || PyObject_HasAttr(obj, mg_arrays_str_array))
        return mg_arrays_host_array_error(obj);
    return PyErr_Format(PyExc_TypeError, "cannot view %.100s as a device array: it has neither "
                        "__cuda_array_interface__ nor __dlpack__", Py_TYPE(obj)->tp_name);
}

/* The CPU backend's asarray: a host DeviceArray viewing a host DLPack
 * object (NumPy arrays included), or a DeviceArray itself. */
static PyObject *host_asarray(PyObject *obj)
{
    if (refuse_deleted_jax(obj) < 0)
        return NULL;
    if (PyObject_TypeCheck(obj, mg_array_type)) {
        if (!((mg_array *)obj)->host)
            return mg_raise(PyExc_TypeError, "a DeviceArray in CUDA memory on the CPU backend: use get()");
        return Py_NewRef(obj);
    }
    if (PyCapsule_CheckExact(obj))
        return mg_arrays_view_from_capsule_on(obj, 1);
    if (!PyObject_HasAttr(obj, mg_arrays_str_dlpack))
        return PyErr_Format(PyExc_TypeError, "cannot view %.100s as a host array: it has no __dlpack__",
                            Py_TYPE(obj)->tp_name);
    /* Versioned first: only its capsule can say the memory is read-only. */
    PyObject *capsule = NULL, *method = PyObject_GetAttr(obj, mg_arrays_str_dlpack);
    PyObject *kwargs = Py_BuildValue("{s:(ii)}", "max_version", MG_DLPACK_MAJOR, MG_DLPACK_MINOR);
    PyObject *empty = PyTuple_New(0);
    if (method != NULL && kwargs != NULL && empty != NULL) {
        capsule = PyObject_Call(method, empty, kwargs);
        if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            capsule = PyObject_CallNoArgs(method);
        }
    }
    Py_XDECREF(method);
    Py_XDECREF(kwargs);
    Py_XDECREF(empty);
    if (capsule == NULL)
        return NULL;
    if (!PyCapsule_CheckExact(capsule)) {
        PyErr_Format(PyExc_TypeError, "%.100s.__dlpack__() returned %.100s, not a capsule",
                     Py_TYPE(obj)->tp_name, Py_TYPE(capsule)->tp_name);
        Py_DECREF(capsule);
        return NULL;
    }
    PyObject *view = mg_arrays_view_from_capsule_on(capsule, 1);
    Py_DECREF(capsule);   /* a consumed capsule lives on as the view's owner */
    return view;
}

PyObject *mg_arrays_array_asarray_function(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"obj", "host", "synchronize", NULL};
    PyObject *obj;
    int host = 0, synchronize = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$pp:asarray", keywords, &obj, &host, &synchronize))
        return NULL;
    return host ? host_asarray(obj) : mg_array_asarray(obj, synchronize);
}

/* The entry that holds `obj`, or NULL. Runs no Python code. */
static const jax_memo *jax_memo_of(PyObject *obj)
{
    jax_memo *pair = mg_arrays_jax_memo_pair(obj);
    for (int i = 0; i < 2; i++)
        if (pair[i].ref != NULL && pair[i].version != 0 && pair[i].version == Py_TYPE(obj)->tp_version_tag &&
            mg_arrays_weak_target(pair[i].ref) == obj)
            return &pair[i];
    return NULL;
}

/* Remembers what `out` says of `obj`; an object without weak references is
 * not remembered. */
static void jax_remember(PyObject *obj, const mg_foreign *out)
{
    PyObject *ref = PyWeakref_NewRef(obj, NULL);
    if (ref == NULL) {
        PyErr_Clear();
        return;
    }
    /* An entry of this object (its type changed since), or one whose array died, else the first. */
    jax_memo *pair = mg_arrays_jax_memo_pair(obj), *m = &pair[0];
    for (int i = 1; i >= 0; i--)
        if (pair[i].ref == NULL || mg_arrays_weak_target(pair[i].ref) == obj || mg_arrays_weak_target(pair[i].ref) == NULL)
            m = &pair[i];
    PyObject *old = m->ref;
    *m = (jax_memo){ref, Py_TYPE(obj)->tp_version_tag, out->ptr, out->dtype, out->ndim, out->device,
                    out->readonly, {0}};
    memcpy(m->shape, out->shape, (size_t)out->ndim * sizeof out->shape[0]);
    Py_XDECREF(old);   /* a weak reference without a callback: its release runs no Python code */
}

/* 0 for a JAX array that was not deleted; -1 with ValueError for one that
 * was (JAX's is_ready() and protocols must not be asked: its memory is
 * gone), or with the error of is_deleted(). */
static int jax_check_not_deleted(PyObject *obj)
{
    PyObject *deleted = mg_arrays_call_method(obj, mg_arrays_str_is_deleted);
    if (deleted == Py_False) {
        Py_DECREF(deleted);
        return 0;
    }
    if (deleted != NULL)
        PyErr_SetString(PyExc_ValueError, "the JAX array was deleted (by delete(), or by donating it to a "
                        "jitted function): its memory is gone");
    Py_XDECREF(deleted);
    return -1;
}

/* -1 with ValueError for a deleted JAX array, else 0: asarray must not ask
 * its protocols either. */
static int refuse_deleted_jax(PyObject *obj)
{
    reader_info info;
    if (mg_arrays_reader_of(Py_TYPE(obj), &info) < 0)
        return -1;
    int jax = info.reader == READER_JAX;
    mg_arrays_reader_info_release(&info);
    return jax ? jax_check_not_deleted(obj) : 0;
}

/* A JAX array on one GPU. A deleted one raises ValueError. One seen before
 * (jax_memo) costs is_deleted() alone. Otherwise: is_ready(), and
 * block_until_ready() only when it is not (JAX's __cuda_array_interface__,
 * version 2 and without a stream, returns once the buffer is ready: so does
 * this reader); __dlpack_device__(), which must name a CUDA device;
 * unsafe_buffer_pointer(); dtype and shape from its aval (JAX arrays are
 * C-contiguous); read-only where JAX's protocol says so. An array on several
 * devices, or on the host, takes the protocol, which says why it cannot be
 * passed (or, on the CPU backend, reads it as host memory). */
static int jax_read(PyObject *obj, reader_info *info, mg_foreign *out)
{
    PyObject *value = NULL, *aval = NULL;
    long long number;
    Py_ssize_t size;
    const jax_memo *m = jax_memo_of(obj);
    int known = m != NULL;
    if (known) {   /* copied before is_deleted() runs code that may change the table */
        out->ptr = m->ptr;
        out->dtype = m->dtype;
        out->ndim = m->ndim;
        out->device = m->device;
        out->readonly = m->readonly;
        memcpy(out->shape, m->shape, (size_t)m->ndim * sizeof m->shape[0]);
    }
    if (jax_check_not_deleted(obj) < 0)
        return -1;
    if (known) {
        out->contiguous = 1;
        return mg_arrays_c_strides(out->ndim, out->shape, out->dtype->itemsize, out->strides, &size) < 0 ? -1 : 1;
    }
    value = mg_arrays_call_method(obj, mg_arrays_str_is_ready);
    if (value == Py_False)
        Py_SETREF(value, mg_arrays_call_method(obj, mg_arrays_str_block_until_ready));
    else if (value != Py_True)
        goto fallback;
    if (value == NULL)
        goto fallback;
    /* (2, ordinal): kDLCUDA; the host (kDLCPU) and the rest take the protocol. */
    Py_SETREF(value, mg_arrays_call_method(obj, mg_arrays_str_dlpack_device));
    if (value == NULL || !PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 2 ||
        PyLong_AsLong(PyTuple_GET_ITEM(value, 0)) != 2)
        goto fallback;
    out->device = PyLong_AsLong(PyTuple_GET_ITEM(value, 1));
    if (out->device < 0 || PyErr_Occurred() || mg_arrays_read_int(obj, mg_arrays_str_unsafe_buffer_pointer, 1, &number) < 0)
        goto fallback;
    out->ptr = (CUdeviceptr)(unsigned long long)number;
    if ((out->readonly = mg_arrays_jax_readonly(obj, info)) < 0 || (aval = PyObject_GetAttr(obj, mg_arrays_str_aval)) == NULL)
        goto fallback;
    Py_SETREF(value, PyObject_GetAttr(aval, mg_arrays_str_dtype_attr));
    if (value == NULL || mg_arrays_numpy_dtype(value, &out->dtype) < 0)
        goto fallback;
    Py_SETREF(value, PyObject_GetAttr(aval, mg_arrays_str_shape));
    if (value == NULL || mg_arrays_read_ints(value, out->shape, &out->ndim) < 0 ||
        mg_arrays_c_strides(out->ndim, out->shape, out->dtype->itemsize, out->strides, &size) < 0)
        goto fallback;
    out->contiguous = 1;
    Py_DECREF(value);
    Py_DECREF(aval);
    /* Asked again after the code above ran: an array deleted meanwhile is not remembered. */
    if (jax_check_not_deleted(obj) < 0)
        return -1;
    jax_remember(obj, out);
    return 1;
fallback:
    Py_XDECREF(value);
    Py_XDECREF(aval);
    out->readonly = 0;
    return mg_arrays_reader_fallback(out);
}

/* Any other __cuda_array_interface__, read from its dict
 * without building a view: the caller holds the object, which keeps the
 * memory alive, for as long as the pointer is used. 1, or -1. */
static int cai_read(PyObject *cai, mg_foreign *out, int full)
{
    cai_fields f;
    if (mg_arrays_cai_parse(cai, &f) < 0)
        return -1;
    Py_ssize_t size;
    out->ptr = (CUdeviceptr)f.pointer;
    out->dtype = f.dtype;
    out->ndim = f.ndim;
    out->readonly = f.readonly;
    memcpy(out->shape, f.shape, (size_t)f.ndim * sizeof f.shape[0]);
    if (mg_arrays_c_strides(f.ndim, f.shape, f.dtype->itemsize, out->strides, &size) < 0)
        return -1;
    if (f.has_strides)
        memcpy(out->strides, f.strides, (size_t)f.ndim * sizeof f.strides[0]);
    out->contiguous = mg_arrays_foreign_contiguous(out);
    if (full && (out->device = mg_cu_sole_device()) < 0)
        out->device = size > 0 && f.pointer != 0 ? mg_cu_pointer_device(out->ptr) : mg_cu_current_device();
    out->wait = f.has_stream;
    out->producer = f.has_stream ? f.stream : NULL;
    return 1;
}

static void fill_from_array(const mg_array *a, mg_foreign *out)
{
    out->ptr = a->ptr;
    out->dtype = a->dtype;
    out->ndim = a->ndim;
    out->device = a->device;
    out->host = a->host;
    out->readonly = a->readonly;
    memcpy(out->shape, a->shape, (size_t)a->ndim * sizeof a->shape[0]);
    memcpy(out->strides, a->strides, (size_t)a->ndim * sizeof a->strides[0]);
    out->contiguous = mg_arrays_is_c_contiguous(a);
}

static void fill_from_numpy(PyArrayObject *a, mg_foreign *out)
{
    out->host = 1;
    out->readonly = !PyArray_ISWRITEABLE(a);
    out->ptr = (CUdeviceptr)(uintptr_t)PyArray_DATA(a);
    out->contiguous = PyArray_IS_C_CONTIGUOUS(a);
    if (PyArray_NDIM(a) > MG_MAX_NDIM || mg_arrays_dtype_from_descr(PyArray_DESCR(a), &out->dtype) < 0) {
        PyErr_Clear();   /* documented: dtype NULL, the array is beyond mlirgpu */
        out->dtype = NULL;
        return;
    }
    out->ndim = PyArray_NDIM(a);
    memcpy(out->shape, PyArray_SHAPE(a), (size_t)out->ndim * sizeof out->shape[0]);
    memcpy(out->strides, PyArray_STRIDES(a), (size_t)out->ndim * sizeof out->strides[0]);
}

/* `library`: only an array of a type known to be torch's, CuPy's or JAX's
 * is read, anything else gives MG_NOT_LIBRARY. */
static int foreign_read(PyObject *obj, mg_foreign *out, int full, mg_foreign_memo *memo, int library)
{
    reader_info info;
    int known = mg_arrays_known_reader(Py_TYPE(obj), &info) && info.reader != READER_GENERIC;
    if (library && !known) {
        mg_arrays_reader_info_release(&info);
        return MG_NOT_LIBRARY;
    }
    out->view = NULL;
    out->dtype = NULL;
    out->ndim = 0;
    out->device = -1;
    out->contiguous = 1;
    out->host = 0;
    out->readonly = 0;
    out->wait = 0;
    out->producer = NULL;
    /* A torch, CuPy or JAX array's type is known: the checks below are for the rest. */
    if (!known) {
        mg_arrays_reader_info_release(&info);
        if (PyObject_TypeCheck(obj, mg_array_type)) {
            fill_from_array((mg_array *)obj, out);
            return 1;
        }
        if (PyArray_Check(obj)) {
            fill_from_numpy((PyArrayObject *)obj, out);
            return 1;
        }
        if (mg_arrays_reader_of(Py_TYPE(obj), &info) < 0)
            return -1;
    }
    int status = 0;
    if (info.reader == READER_TORCH)
        status = mg_arrays_torch_read(obj, &info.reads->torch, out, full);
    else if (info.reader == READER_CUPY)
        status = mg_arrays_cupy_read(obj, &info.reads->cupy, out, full, memo);
    else if (info.reader == READER_JAX)
        status = jax_read(obj, &info, out);
    mg_arrays_reader_info_release(&info);
    if (status != 0)
        return status;
    /* The protocols, without asking for __cuda_array_interface__ twice:
     * producers such as torch build the dict anew on every access. */
    PyObject *cai = PyObject_GetAttr(obj, mg_arrays_str_cai);
    if (cai != NULL && !mg_arrays_cai_untyped(obj, cai)) {
        status = cai_read(cai, out, full);
        Py_DECREF(cai);
        return status;
    }
    if (cai != NULL) {
        Py_DECREF(cai);
    }
    else {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        if (!PyObject_HasAttr(obj, mg_arrays_str_dlpack))
            return 0;
    }
    PyObject *view = mg_arrays_view_from_dlpack(obj, 1);
    if (view == NULL)
        return -1;
    fill_from_array((mg_array *)view, out);
    out->view = view;
    out->wait = 1;   /* the producer ordered its work before the legacy default stream (stream=1) */
    out->producer = NULL;
    return 1;
}

int mg_array_foreign_info(PyObject *obj, mg_foreign *out, mg_foreign_memo *memo)
{
    return foreign_read(obj, out, 1, memo, 0);
}

int mg_array_library_read(PyObject *obj, mg_foreign *out, int full, mg_foreign_memo *memo)
{
    return foreign_read(obj, out, full, memo, 1);
}

int mg_array_foreign_pointer(PyObject *obj, mg_foreign *out, mg_foreign_memo *memo)
{
    return foreign_read(obj, out, 0, memo, 0);
}

int mg_dtype_of_scalar(PyObject *obj, mg_dtype **out)
{
    if (!PyArray_IsScalar(obj, Generic))
        return 0;
    PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
    int found = descr != NULL && mg_arrays_dtype_from_descr(descr, out) == 0;
    Py_XDECREF(descr);
    if (!found)
        PyErr_Clear();   /* complex, str, datetime...: not a scalar a kernel takes */
    return found;
}

