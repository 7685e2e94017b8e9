/* Zero-copy exchange: DLPack export (__dlpack__, 1.x and legacy), and views
 * of what others export through __cuda_array_interface__ v3 and DLPack. */
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
/* DLPack export                                                           */
/* ---------------------------------------------------------------------- */

/* One allocation per export: the managed tensor with its shape and strides.
 * Raw allocator: the consumer may call the deleter without the GIL. */
typedef struct {
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } managed;   /* first: a pointer to it is a pointer to the block */
    int64_t shape[MG_MAX_NDIM];
    int64_t strides[MG_MAX_NDIM];
} export_block;

static void release_export(void *block, PyObject *array)
{
    /* Once the interpreter is gone there is no reference left to drop. */
    if (Py_IsInitialized()) {
        PyGILState_STATE gil = PyGILState_Ensure();
        Py_DECREF(array);
        PyGILState_Release(gil);
    }
    PyMem_RawFree(block);
}

static void versioned_deleter(DLManagedTensorVersioned *m) { release_export(m, m->manager_ctx); }
static void legacy_deleter(DLManagedTensor *m) { release_export(m, m->manager_ctx); }

/* A capsule nobody consumed still owns its tensor; a consumed one was
 * renamed "used_..." and belongs to its consumer. */
static void capsule_destructor(PyObject *capsule)
{
    const char *name = PyCapsule_GetName(capsule);
    if (name == NULL)
        return;
    if (strcmp(name, MG_DLPACK_VERSIONED_NAME) == 0) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, name);
        if (m != NULL && m->deleter != NULL)
            m->deleter(m);
    }
    else if (strcmp(name, MG_DLPACK_NAME) == 0) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, name);
        if (m != NULL && m->deleter != NULL)
            m->deleter(m);
    }
}

static int parse_dl_device(mg_array *self, PyObject *dl_device)
{
    if (dl_device == Py_None)
        return 0;
    int type, id;
    if (!PyTuple_Check(dl_device) || !PyArg_ParseTuple(dl_device, "ii", &type, &id)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "dl_device must be a (device_type, device_id) tuple, not %R", dl_device);
        return -1;
    }
    if (self->host) {
        if (type != kDLCPU || id != 0) {
            PyErr_Format(PyExc_BufferError, "cannot export a host DeviceArray to dl_device (%d, %d)", type, id);
            return -1;
        }
        return 0;
    }
    if (type != kDLCUDA || id != self->device) {
        PyErr_Format(PyExc_BufferError, "cannot export a DeviceArray of CUDA device %d to dl_device (%d, %d)",
                     self->device, type, id);
        return -1;
    }
    return 0;
}

/* max_version=None asks for the legacy capsule; (major, minor) with
 * major >= 1 for the versioned one. */
static int parse_max_version(PyObject *max_version, int *versioned)
{
    *versioned = 0;
    if (max_version == Py_None)
        return 0;
    long major;
    if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2 ||
        (major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0))) == -1) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "max_version must be a (major, minor) tuple, not %R", max_version);
        return -1;
    }
    *versioned = major >= 1;
    return 0;
}

PyObject *mg_arrays_array_dlpack(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream_arg = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", keywords,
                                     &stream_arg, &max_version, &dl_device, &copy))
        return NULL;
    int versioned;
    if (parse_max_version(max_version, &versioned) < 0 || parse_dl_device(self, dl_device) < 0)
        return NULL;
    if (copy == Py_True)
        return mg_raise(PyExc_BufferError, "DeviceArray.__dlpack__ shares memory; copy=True is not supported");
    if (self->readonly && !versioned)
        return mg_raise(PyExc_BufferError, "a read-only DeviceArray is exported through versioned DLPack only "
                        "(max_version=(1, 0)): the legacy capsule cannot say it is read-only");
    /* The stream is the consumer's: None is the legacy default stream, -1
     * asks for no synchronization, 0 is ambiguous and not allowed. */
    CUstream consumer = NULL;
    int synchronize = 1;
    if (PyLong_Check(stream_arg)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(stream_arg, &overflow);
        if (!overflow && value == 0)
            return mg_raise(PyExc_ValueError, "__dlpack__(stream=0) is ambiguous for CUDA: use 1 for the legacy "
                            "default stream or 2 for the per-thread one");
        if (!overflow && value == -1)
            synchronize = 0;
    }
    if (self->host)
        synchronize = 0;   /* host memory: the launches that wrote it have returned */
    if (synchronize && stream_arg != Py_None && !mg_cu_stream_converter(stream_arg, &consumer))
        return NULL;
    for (int i = 0; i < self->ndim; i++)
        if (self->strides[i] % self->dtype->itemsize != 0)
            return mg_raise(PyExc_BufferError, "a stride of %zd bytes is not a whole number of %s elements",
                            self->strides[i], self->dtype->name);
    if (synchronize && mg_cu_stream_order(self->stream, consumer) < 0)
        return NULL;

    export_block *block = PyMem_RawCalloc(1, sizeof *block);
    if (block == NULL)
        return PyErr_NoMemory();
    DLTensor *tensor = versioned ? &block->managed.versioned.dl_tensor : &block->managed.legacy.dl_tensor;
    tensor->data = (void *)(uintptr_t)self->ptr;
    tensor->device.device_type = self->host ? kDLCPU : kDLCUDA;
    tensor->device.device_id = self->host ? 0 : self->device;
    tensor->ndim = self->ndim;
    tensor->dtype.code = self->dtype->dlpack_code;
    tensor->dtype.bits = self->dtype->bits;
    tensor->dtype.lanes = 1;
    tensor->shape = block->shape;
    tensor->strides = block->strides;
    for (int i = 0; i < self->ndim; i++) {
        block->shape[i] = self->shape[i];
        block->strides[i] = self->strides[i] / self->dtype->itemsize;
    }
    if (versioned) {
        block->managed.versioned.version.major = MG_DLPACK_MAJOR;
        block->managed.versioned.version.minor = MG_DLPACK_MINOR;
        block->managed.versioned.manager_ctx = self;
        block->managed.versioned.flags = self->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
        block->managed.versioned.deleter = versioned_deleter;
    }
    else {
        block->managed.legacy.manager_ctx = self;
        block->managed.legacy.deleter = legacy_deleter;
    }
    PyObject *capsule = PyCapsule_New(block, versioned ? MG_DLPACK_VERSIONED_NAME : MG_DLPACK_NAME,
                                      capsule_destructor);
    if (capsule == NULL) {
        PyMem_RawFree(block);
        return NULL;
    }
    Py_INCREF(self);   /* the managed tensor's reference, dropped by its deleter */
    return capsule;
}

PyObject *mg_arrays_array_dlpack_device(mg_array *self, PyObject *unused)
{
    if (self->host)
        return Py_BuildValue("(ii)", kDLCPU, 0);
    return Py_BuildValue("(ii)", kDLCUDA, self->device);
}

/* ---------------------------------------------------------------------- */
/* Views: __cuda_array_interface__ and DLPack import                       */
/* ---------------------------------------------------------------------- */

PyObject *mg_arrays_str_cai, *mg_arrays_str_dlpack, *mg_arrays_str_dlpack_device, *mg_arrays_str_array_interface, *mg_arrays_str_array;

PyObject *mg_arrays_host_array_error(PyObject *obj)
{
    return PyErr_Format(PyExc_TypeError, "host array: use mlirgpu.to_device (got %.100s)", Py_TYPE(obj)->tp_name);
}

/* A CAI typestr such as "<f4": ValueError if malformed, TypeError if
 * well-formed but not an mlirgpu dtype. */
static int dtype_from_typestr(PyObject *typestr, mg_dtype **out)
{
    if (!PyUnicode_Check(typestr)) {
        PyErr_Format(PyExc_TypeError, "typestr must be a str, not %.100s", Py_TYPE(typestr)->tp_name);
        return -1;
    }
    const char *text = PyUnicode_AsUTF8(typestr);
    if (text == NULL)
        return -1;
    size_t n = strlen(text);
    if (n < 3 || strchr("<>|=", text[0]) == NULL || text[1] == '\0' || strspn(text + 2, "0123456789") != n - 2) {
        PyErr_Format(PyExc_ValueError, "malformed typestr %R", typestr);
        return -1;
    }
    long size = strtol(text + 2, NULL, 10);
    int big_endian = text[0] == '>' && size > 1;
    for (int id = 0; id < MG_DT_COUNT && !big_endian; id++) {
        if (id == MG_DT_INDEX || mg_arrays_dtype_table[id].typestr == NULL)
            continue;
        if (mg_arrays_dtype_table[id].kind == text[1] && mg_arrays_dtype_table[id].itemsize == size) {
            *out = mg_arrays_dtypes[id];
            return 0;
        }
    }
    PyErr_Format(PyExc_TypeError, "typestr %R is not an mlirgpu dtype", typestr);
    return -1;
}

/* A required key of a CAI dict: borrowed, or NULL with ValueError. */
static PyObject *cai_item(PyObject *cai, const char *key, int required)
{
    PyObject *value = PyDict_GetItemString(cai, key);   /* borrowed; errors are impossible for str keys */
    if (value == NULL && required)
        PyErr_Format(PyExc_ValueError, "__cuda_array_interface__ has no '%s'", key);
    return value;
}

/* Whether `cai` gives the dtype only as raw bytes (a "V" typestr, as torch
 * exports bfloat16) and `obj` has __dlpack__, whose dtype codes can name it:
 * such an array is read through DLPack instead. */
int mg_arrays_cai_untyped(PyObject *obj, PyObject *cai)
{
    PyObject *typestr = PyDict_Check(cai) ? cai_item(cai, "typestr", 0) : NULL;
    const char *text = typestr != NULL && PyUnicode_Check(typestr) ? PyUnicode_AsUTF8(typestr) : NULL;
    if (text == NULL) {
        PyErr_Clear();   /* the interface's own reading says what is wrong with it */
        return 0;
    }
    return text[0] != '\0' && text[1] == 'V' && PyObject_HasAttr(obj, mg_arrays_str_dlpack);
}

static int int_tuple(PyObject *obj, const char *what, Py_ssize_t *out, int max, int *count, int nonneg)
{
    if (!PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "__cuda_array_interface__ '%s' must be a tuple, not %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(obj);
    if (n > max) {
        PyErr_Format(PyExc_ValueError, "at most %d dimensions are supported, '%s' has %zd", max, what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(obj, i);
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "__cuda_array_interface__ '%s' holds ints, not %.100s",
                         what, Py_TYPE(item)->tp_name);
            return -1;
        }
        out[i] = PyLong_AsSsize_t(item);
        if (out[i] == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear(); /* malformed, as a negative extent is: ValueError */
            PyErr_Format(PyExc_ValueError, "__cuda_array_interface__ '%s' holds %R, out of range", what, item);
            return -1;
        }
        if (nonneg && out[i] < 0) {
            PyErr_Format(PyExc_ValueError, "negative extent in __cuda_array_interface__ '%s'", what);
            return -1;
        }
    }
    *count = (int)n;
    return 0;
}


/* Reads and checks a CAI dict (v0 to v3): 0, or -1 with TypeError or
 * ValueError. Nothing here runs Python code, so the dict's borrowed items
 * stay valid throughout. */
int mg_arrays_cai_parse(PyObject *cai, cai_fields *f)
{
    if (!PyDict_Check(cai)) {
        PyErr_Format(PyExc_TypeError, "__cuda_array_interface__ must be a dict, not %.100s", Py_TYPE(cai)->tp_name);
        return -1;
    }
    PyObject *shape_obj, *typestr, *data, *version, *strides_obj, *mask, *stream_obj;
    if ((shape_obj = cai_item(cai, "shape", 1)) == NULL || (typestr = cai_item(cai, "typestr", 1)) == NULL ||
        (data = cai_item(cai, "data", 1)) == NULL || (version = cai_item(cai, "version", 1)) == NULL)
        return -1;
    strides_obj = cai_item(cai, "strides", 0);
    mask = cai_item(cai, "mask", 0);
    stream_obj = cai_item(cai, "stream", 0);
    if (!PyLong_Check(version)) {
        PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__ 'version' must be an int");
        return -1;
    }
    if (mask != NULL && mask != Py_None) {
        PyErr_SetString(PyExc_ValueError, "masked __cuda_array_interface__ arrays are not supported");
        return -1;
    }
    int nstrides;
    if (int_tuple(shape_obj, "shape", f->shape, MG_MAX_NDIM, &f->ndim, 1) < 0 ||
        dtype_from_typestr(typestr, &f->dtype) < 0)
        return -1;
    /* The read-only flag is a bool (an int is taken too); anything else could run Python code while
     * the dict's items are borrowed. */
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 || !PyLong_Check(PyTuple_GET_ITEM(data, 0)) ||
        !PyLong_Check(PyTuple_GET_ITEM(data, 1))) {
        PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__ 'data' must be a (pointer, read_only) tuple");
        return -1;
    }
    if ((f->readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1))) < 0)
        return -1;
    f->pointer = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (f->pointer == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear(); /* a malformed dict is a ValueError, as every other field's */
        mg_raise(PyExc_ValueError, "__cuda_array_interface__ 'data' pointer %R is not an address in "
                 "[0, 2**64)", PyTuple_GET_ITEM(data, 0));
        return -1;
    }
    f->has_strides = strides_obj != NULL && strides_obj != Py_None;
    if (f->has_strides) {
        if (int_tuple(strides_obj, "strides", f->strides, MG_MAX_NDIM, &nstrides, 0) < 0)
            return -1;
        if (nstrides != f->ndim) {
            PyErr_Format(PyExc_ValueError, "__cuda_array_interface__ has %d strides for %d dimensions",
                         nstrides, f->ndim);
            return -1;
        }
    }
    /* None or absent: nothing to wait for. */
    f->has_stream = 0;
    if (stream_obj != NULL && stream_obj != Py_None) {
        if (!PyLong_Check(stream_obj)) {
            PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__ 'stream' must be an int or None");
            return -1;
        }
        if (PyLong_AsLongLong(stream_obj) == 0 && !PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ 'stream' 0 is disallowed by version 3");
            return -1;
        }
        PyErr_Clear();
        if (!mg_cu_stream_converter(stream_obj, &f->stream))
            return -1;
        f->has_stream = 1;
    }
    return 0;
}

/* A view of a CAI object. v3: the consumer orders its work after the
 * producer's `stream`: the legacy default stream, the view's stream, waits
 * for it now (unless not `synchronize`: see mg_array_asarray). */
PyObject *mg_arrays_view_from_cai(PyObject *obj, PyObject *cai, int synchronize)
{
    cai_fields f;
    if (mg_arrays_cai_parse(cai, &f) < 0)
        return NULL;
    if (synchronize && f.has_stream && mg_cu_stream_order(f.stream, NULL) < 0)
        return NULL;
    return mg_arrays_view_at(f.dtype, f.ndim, f.shape, f.has_strides ? f.strides : NULL, (CUdeviceptr)f.pointer,
                             f.readonly, -1, obj);
}

PyObject *mg_arrays_view_at(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                            CUdeviceptr ptr, int readonly, int device, PyObject *owner)
{
    mg_array *view = mg_arrays_array_create(dtype, ndim, shape, strides);
    if (view == NULL)
        return NULL;
    Py_ssize_t lo, hi;
    if (view->size > 0 && mg_arrays_byte_extent(view, &lo, &hi) < 0) {
        Py_DECREF(view);
        return NULL;
    }
    view->ptr = ptr;
    view->readonly = readonly;
    view->device = device >= 0 ? device
                   : view->size > 0 && ptr != 0 ? mg_cu_pointer_device(ptr) : mg_cu_current_device();
    view->owner = Py_NewRef(owner);
    return (PyObject *)view;
}

int mg_arrays_dtype_from_dl(DLDataType t, mg_dtype **out)
{
    int id = -1;
    if (t.lanes == 1) {
        switch (t.code) {
        case kDLInt: id = t.bits == 8 ? MG_DT_I8 : t.bits == 16 ? MG_DT_I16 : t.bits == 32 ? MG_DT_I32 : t.bits == 64 ? MG_DT_I64 : -1; break;
        case kDLUInt: id = t.bits == 8 ? MG_DT_U8 : t.bits == 16 ? MG_DT_U16 : t.bits == 32 ? MG_DT_U32 : t.bits == 64 ? MG_DT_U64 : -1; break;
        case kDLFloat: id = t.bits == 16 ? MG_DT_F16 : t.bits == 32 ? MG_DT_F32 : t.bits == 64 ? MG_DT_F64 : -1; break;
        case kDLBfloat: id = t.bits == 16 ? MG_DT_BF16 : -1; break;
        case kDLBool: id = t.bits == 8 ? MG_DT_BOOL : -1; break;
        case kDLFloat8_e4m3fn: id = t.bits == 8 ? MG_DT_F8E4M3 : -1; break;
        case kDLFloat8_e5m2: id = t.bits == 8 ? MG_DT_F8E5M2 : -1; break;
        }
    }
    if (id < 0) {
        PyErr_Format(PyExc_TypeError, "DLPack dtype (code %d, bits %d, lanes %d) is not an mlirgpu dtype",
                     t.code, t.bits, t.lanes);
        return -1;
    }
    *out = mg_arrays_dtypes[id];
    return 0;
}

/* A view of a "dltensor" or "dltensor_versioned" capsule. On success the
 * capsule is renamed "used_..." and the view calls the deleter when it dies;
 * on failure the capsule is left as it was, so its own destructor frees it. */
/* A zero-copy view of a consumed DLPack capsule: of CUDA memory, or with
 * `host` of host memory (a host DeviceArray, the CPU backend's). */
PyObject *mg_arrays_view_from_capsule_on(PyObject *capsule, int host)
{
    const char *name = PyCapsule_GetName(capsule);
    if (name == NULL && PyErr_Occurred())
        return NULL;
    int versioned;
    if (name != NULL && strcmp(name, MG_DLPACK_VERSIONED_NAME) == 0)
        versioned = 1;
    else if (name != NULL && strcmp(name, MG_DLPACK_NAME) == 0)
        versioned = 0;
    else if (name != NULL && strncmp(name, "used_", 5) == 0)
        return mg_raise(PyExc_ValueError, "this DLPack capsule was already consumed");
    else
        return PyErr_Format(PyExc_ValueError, "not a DLPack capsule: its name is '%s', not 'dltensor' or "
                            "'dltensor_versioned'", name ? name : "(null)");
    void *managed = PyCapsule_GetPointer(capsule, name);
    if (managed == NULL)
        return NULL;
    DLTensor *t;
    int readonly = 0;
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->version.major != MG_DLPACK_MAJOR)
            return PyErr_Format(PyExc_BufferError, "DLPack %u.%u is newer than this mlirgpu understands (%d.x)",
                                m->version.major, m->version.minor, MG_DLPACK_MAJOR);
        t = &m->dl_tensor;
        readonly = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    }
    else {
        t = &((DLManagedTensor *)managed)->dl_tensor;
    }
    if (host) {
        if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
            return mg_raise(PyExc_TypeError, "DLPack device type %d is not host memory: the CPU backend "
                            "views host arrays only", (int)t->device.device_type);
    }
    else if (t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost)
        return mg_raise(PyExc_TypeError, "host array: use mlirgpu.to_device (DLPack device type %d)",
                        (int)t->device.device_type);
    else if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
        return mg_raise(PyExc_TypeError, "DLPack device type %d is not CUDA", (int)t->device.device_type);
    if (t->ndim < 0 || t->ndim > MG_MAX_NDIM)
        return mg_raise(PyExc_ValueError, "DLPack tensor has %d dimensions; at most %d are supported",
                        (int)t->ndim, MG_MAX_NDIM);
    mg_dtype *dtype;
    if (mg_arrays_dtype_from_dl(t->dtype, &dtype) < 0)
        return NULL;
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > PY_SSIZE_T_MAX)
            return mg_raise(PyExc_ValueError, "DLPack tensor has a bad extent %lld", (long long)t->shape[i]);
        shape[i] = (Py_ssize_t)t->shape[i];
        if (t->strides != NULL && mg_arrays_checked_mul((Py_ssize_t)t->strides[i], dtype->itemsize, &strides[i]) < 0)
            return mg_raise(PyExc_ValueError, "DLPack tensor has a stride too large to address");
    }
    mg_array *view = (host ? mg_arrays_host_create : mg_arrays_array_create)(dtype, t->ndim, shape, t->strides != NULL ? strides : NULL);
    if (view == NULL)
        return NULL;
    Py_ssize_t lo, hi;
    if (view->size > 0 && mg_arrays_byte_extent(view, &lo, &hi) < 0)
        goto error;
    view->ptr = (CUdeviceptr)(uintptr_t)t->data + (CUdeviceptr)t->byte_offset;
    view->readonly = readonly;
    if (!host)
        view->device = t->device.device_id;
    if (PyCapsule_SetName(capsule, versioned ? MG_DLPACK_USED_VERSIONED_NAME : MG_DLPACK_USED_NAME) < 0)
        goto error;
    view->dl_managed = managed;
    view->dl_versioned = versioned;
    view->owner = Py_NewRef(capsule);
    return (PyObject *)view;
error:
    Py_DECREF(view);
    return NULL;
}

PyObject *mg_arrays_view_from_capsule(PyObject *capsule)
{
    return mg_arrays_view_from_capsule_on(capsule, 0);
}

/* obj.__dlpack__(max_version=(1, 0), stream=stream), or without max_version
 * for producers that predate it. Stream 1: order the export after the
 * producer's work as seen from the legacy default stream; -1: no ordering. */
static PyObject *call_dlpack(PyObject *obj, int stream)
{
    PyObject *method = PyObject_GetAttr(obj, mg_arrays_str_dlpack);
    if (method == NULL)
        return NULL;
    PyObject *capsule = NULL;
    PyObject *kwargs = Py_BuildValue("{s:(ii),s:i}", "max_version", MG_DLPACK_MAJOR, MG_DLPACK_MINOR, "stream", stream);
    PyObject *empty = PyTuple_New(0);
    if (kwargs == NULL || empty == NULL)
        goto error;
    capsule = PyObject_Call(method, empty, kwargs);
    if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        if (PyDict_DelItemString(kwargs, "max_version") < 0)
            goto error;
        capsule = PyObject_Call(method, empty, kwargs);
    }
error:
    Py_DECREF(method);
    Py_XDECREF(kwargs);
    Py_XDECREF(empty);
    return capsule;
}

PyObject *mg_arrays_view_from_dlpack(PyObject *obj, int synchronize)
{
    PyObject *device = NULL, *capsule = NULL, *view = NULL;
    int found;
    /* Ask where the data lives first: a host producer gets no stream argument. */
    found = PyObject_HasAttr(obj, mg_arrays_str_dlpack_device);
    if (found) {
        device = PyObject_CallMethodNoArgs(obj, mg_arrays_str_dlpack_device);
        if (device == NULL)
            goto error;
        int type, id;
        if (!PyTuple_Check(device) || !PyArg_ParseTuple(device, "ii", &type, &id)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%.100s.__dlpack_device__() must return (device_type, device_id)",
                         Py_TYPE(obj)->tp_name);
            goto error;
        }
        if (type == kDLCPU || type == kDLCUDAHost) {
            mg_arrays_host_array_error(obj);
            goto error;
        }
        if (type != kDLCUDA && type != kDLCUDAManaged) {
            PyErr_Format(PyExc_TypeError, "%.100s lives on DLPack device type %d, not CUDA",
                         Py_TYPE(obj)->tp_name, type);
            goto error;
        }
    }
    capsule = call_dlpack(obj, synchronize ? 1 : -1);
    if (capsule == NULL)
        goto error;
    if (!PyCapsule_CheckExact(capsule)) {
        PyErr_Format(PyExc_TypeError, "%.100s.__dlpack__() returned %.100s, not a capsule",
                     Py_TYPE(obj)->tp_name, Py_TYPE(capsule)->tp_name);
        goto error;
    }
    view = mg_arrays_view_from_capsule(capsule);
error:
    Py_XDECREF(device);
    Py_XDECREF(capsule);   /* a consumed capsule lives on as the view's owner */
    return view;
}

