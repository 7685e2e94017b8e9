/* Element types and device arrays: mlirgpu.DType singletons, dtype(),
 * mlirgpu.DeviceArray with empty/zeros/to_device/get and the asynchronous
 * copies, pinned host memory (pinned_empty), and zero-copy exchange through
 * __cuda_array_interface__ v3 and DLPack (1.x and legacy). */
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

/* Host DeviceArrays (the CPU backend's) are aligned like a cache line, so any
 * vector load a kernel does on them is aligned too. */
#define MG_HOST_ALIGNMENT 64

/* ---------------------------------------------------------------------- */
/* DType                                                                   */
/* ---------------------------------------------------------------------- */

PyTypeObject *mg_DType_type;
PyTypeObject *mg_array_type;

/* The singletons; the attribute name doubles as DType.name. Typestrs
 * assume a little-endian host, as every CUDA host is. */
static const struct {
    const char *name;
    int itemsize;
    char kind;
    uint8_t dlpack_code;
    int npy_type;
    const char *typestr;
    const char *ml_dtypes_name;   /* the type of ml_dtypes that is its NumPy dtype, where NumPy has none */
} dtype_table[MG_DT_COUNT] = {
    [MG_DT_BOOL] = {"bool_", 1, 'b', kDLBool, NPY_BOOL, "|b1"},
    [MG_DT_I8] = {"i8", 1, 'i', kDLInt, NPY_INT8, "|i1"},
    [MG_DT_I16] = {"i16", 2, 'i', kDLInt, NPY_INT16, "<i2"},
    [MG_DT_I32] = {"i32", 4, 'i', kDLInt, NPY_INT32, "<i4"},
    [MG_DT_I64] = {"i64", 8, 'i', kDLInt, NPY_INT64, "<i8"},
    [MG_DT_U8] = {"u8", 1, 'u', kDLUInt, NPY_UINT8, "|u1"},
    [MG_DT_U16] = {"u16", 2, 'u', kDLUInt, NPY_UINT16, "<u2"},
    [MG_DT_U32] = {"u32", 4, 'u', kDLUInt, NPY_UINT32, "<u4"},
    [MG_DT_U64] = {"u64", 8, 'u', kDLUInt, NPY_UINT64, "<u8"},
    [MG_DT_F16] = {"f16", 2, 'f', kDLFloat, NPY_FLOAT16, "<f2"},
    [MG_DT_BF16] = {"bf16", 2, 'V', kDLBfloat, -1, NULL, "bfloat16"},
    [MG_DT_F32] = {"f32", 4, 'f', kDLFloat, NPY_FLOAT32, "<f4"},
    [MG_DT_F64] = {"f64", 8, 'f', kDLFloat, NPY_FLOAT64, "<f8"},
    [MG_DT_INDEX] = {"index", 8, 'i', kDLInt, NPY_INTP, "<i8"},
    [MG_DT_F8E4M3] = {"f8e4m3", 1, 'V', kDLFloat8_e4m3fn, -1, NULL, "float8_e4m3fn"},
    [MG_DT_F8E5M2] = {"f8e5m2", 1, 'V', kDLFloat8_e5m2, -1, NULL, "float8_e5m2"},
};

/* Names dtype() knows before asking NumPy. They win over NumPy's reading:
 * "i8" is int8 here (MLIR's spelling), not NumPy's 8-byte int64. */
static const struct {
    const char *name;
    mg_dtype_id id;
} dtype_names[] = {
    {"bool", MG_DT_BOOL}, {"bool_", MG_DT_BOOL}, {"i1", MG_DT_BOOL},
    {"i8", MG_DT_I8}, {"i16", MG_DT_I16}, {"i32", MG_DT_I32}, {"i64", MG_DT_I64},
    {"u8", MG_DT_U8}, {"u16", MG_DT_U16}, {"u32", MG_DT_U32}, {"u64", MG_DT_U64},
    {"f16", MG_DT_F16}, {"bf16", MG_DT_BF16}, {"bfloat16", MG_DT_BF16},
    {"f32", MG_DT_F32}, {"f64", MG_DT_F64}, {"index", MG_DT_INDEX},
    {"f8e4m3", MG_DT_F8E4M3}, {"f8e4m3fn", MG_DT_F8E4M3}, {"float8_e4m3fn", MG_DT_F8E4M3},
    {"f8e5m2", MG_DT_F8E5M2}, {"float8_e5m2", MG_DT_F8E5M2},
};

static mg_dtype *dtypes[MG_DT_COUNT];   /* strong refs, for the life of the process */
static PyObject *ml_dtypes_descrs[MG_DT_COUNT];   /* ml_dtypes' NumPy dtypes, once imported */

mg_dtype *mg_dtype_get(mg_dtype_id id)
{
    return dtypes[id];
}

PyObject *mg_dtype_numpy(const mg_dtype *dt)
{
    if (dt->npy_type >= 0)
        return (PyObject *)PyArray_DescrFromType(dt->npy_type);
    if (ml_dtypes_descrs[dt->id] == NULL) {
        PyObject *ml_dtypes = PyImport_ImportModule("ml_dtypes");
        if (ml_dtypes == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_ImportError))
                return NULL;
            PyErr_Clear();
            return PyErr_Format(PyExc_TypeError,
                                "%s has no NumPy dtype without ml_dtypes (pip install ml_dtypes)", dt->name);
        }
        PyObject *type = PyObject_GetAttrString(ml_dtypes, dtype_table[dt->id].ml_dtypes_name);
        Py_DECREF(ml_dtypes);
        if (type == NULL)
            return NULL;
        PyArray_Descr *descr = NULL;
        int ok = PyArray_DescrConverter(type, &descr);
        Py_DECREF(type);
        if (!ok)
            return NULL;
        ml_dtypes_descrs[dt->id] = (PyObject *)descr;
    }
    return Py_NewRef(ml_dtypes_descrs[dt->id]);
}

static int ends_with(const char *text, const char *suffix)
{
    size_t n = strlen(text), m = strlen(suffix);
    return n >= m && strcmp(text + n - m, suffix) == 0;
}

/* The singleton for a NumPy dtype: TypeError when there is none. */
static int dtype_from_descr(PyArray_Descr *descr, mg_dtype **out)
{
    Py_ssize_t size = PyDataType_ELSIZE(descr);
    int id = -1;
    /* ml_dtypes' types (registered with NumPy as user types) are named after
     * the type (bfloat16, float8_e4m3fn...); their kind is V, or f for some
     * (float8_e5m2). */
    for (int i = 0; i < MG_DT_COUNT && descr->type_num >= NPY_USERDEF && PyArray_ISNBO(descr->byteorder); i++)
        if (dtype_table[i].ml_dtypes_name != NULL && size == dtype_table[i].itemsize &&
            ends_with(descr->typeobj->tp_name, dtype_table[i].ml_dtypes_name))
            id = i;
    if (id < 0 && PyArray_ISNBO(descr->byteorder)) {
        switch (descr->kind) {
        case 'b': id = size == 1 ? MG_DT_BOOL : -1; break;
        case 'i': id = size == 1 ? MG_DT_I8 : size == 2 ? MG_DT_I16 : size == 4 ? MG_DT_I32 : size == 8 ? MG_DT_I64 : -1; break;
        case 'u': id = size == 1 ? MG_DT_U8 : size == 2 ? MG_DT_U16 : size == 4 ? MG_DT_U32 : size == 8 ? MG_DT_U64 : -1; break;
        case 'f': id = size == 2 ? MG_DT_F16 : size == 4 ? MG_DT_F32 : size == 8 ? MG_DT_F64 : -1; break;
        }
    }
    if (id < 0) {
        PyErr_Format(PyExc_TypeError, "mlirgpu has no dtype for NumPy's %R", (PyObject *)descr);
        return -1;
    }
    *out = dtypes[id];
    return 0;
}

static int dtype_from_string(PyObject *text, mg_dtype **out)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (PyUnicode_CompareWithASCIIString(text, dtype_names[i].name) == 0) {
            *out = dtypes[dtype_names[i].id];
            return 0;
        }
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(text, &descr) || dtype_from_descr(descr, out) < 0) {
        Py_XDECREF(descr);
        /* NumPy says TypeError for a name it does not know; a bad name is a bad value. */
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "unknown dtype %R: use an mlirgpu dtype name such as "
                     "\"f32\", \"i32\", \"bf16\", \"index\", or a NumPy name such as \"float32\"", text);
        return -1;
    }
    Py_DECREF(descr);
    return 0;
}

int mg_dtype_converter(PyObject *obj, mg_dtype **out)
{
    if (PyObject_TypeCheck(obj, mg_DType_type)) {
        *out = (mg_dtype *)obj;
        return 1;
    }
    if (PyUnicode_Check(obj))
        return dtype_from_string(obj, out) == 0;
    if (PyArray_DescrCheck(obj))
        return dtype_from_descr((PyArray_Descr *)obj, out) == 0;
    if (PyType_Check(obj)) {
        /* numpy.float32, float, ml_dtypes.bfloat16...: NumPy reads the type. */
        PyArray_Descr *descr = NULL;
        if (!PyArray_DescrConverter(obj, &descr))
            return 0;
        int status = dtype_from_descr(descr, out);
        Py_DECREF(descr);
        return status == 0;
    }
    PyErr_Format(PyExc_TypeError, "expected a dtype (mlirgpu.DType, numpy.dtype, a NumPy scalar type "
                 "or a name), not %.100s", Py_TYPE(obj)->tp_name);
    return 0;
}

static PyObject *dtype_repr(mg_dtype *self)
{
    return PyUnicode_FromFormat("mlirgpu.%s", self->name);
}

static PyObject *dtype_get_name(mg_dtype *self, void *closure)
{
    return PyUnicode_FromString(self->name);
}

static PyObject *dtype_get_kind(mg_dtype *self, void *closure)
{
    return PyUnicode_FromStringAndSize(&self->kind, 1);
}

static PyObject *dtype_get_numpy(mg_dtype *self, void *closure)
{
    return mg_dtype_numpy(self);
}

/* Equal to itself and to the NumPy dtype, type or name it converts from. */
static PyObject *dtype_richcompare(PyObject *self, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    if (!PyObject_TypeCheck(other, mg_DType_type) && !PyArray_DescrCheck(other) &&
        !PyType_Check(other) && !PyUnicode_Check(other))
        Py_RETURN_NOTIMPLEMENTED;
    mg_dtype *converted;
    if (!mg_dtype_converter(other, &converted)) {
        PyErr_Clear();   /* something that is no dtype of ours is simply not equal */
        converted = NULL;
    }
    int equal = (PyObject *)converted == self;
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

/* The NumPy dtype's hash where there is one, so that a dict keyed by NumPy
 * dtypes finds mlirgpu's too; otherwise the name's. */
static Py_hash_t dtype_hash(mg_dtype *self)
{
    if (self->hash != -1)
        return self->hash;
    Py_hash_t h = -1;
    PyObject *key = self->npy_type >= 0 ? mg_dtype_numpy(self) : PyUnicode_FromString(self->name);
    if (key != NULL) {
        h = PyObject_Hash(key);
        Py_DECREF(key);
    }
    self->hash = h;
    return h;
}

static PyObject *dtype_reduce(mg_dtype *self, PyObject *unused)
{
    /* Pickles as the module attribute of the same name. */
    return PyUnicode_FromString(self->name);
}

static PyGetSetDef dtype_getset[] = {
    {"name", (getter)dtype_get_name, NULL, "The mlirgpu name, also the attribute name: \"f32\", \"bool_\".", NULL},
    {"kind", (getter)dtype_get_kind, NULL, "NumPy's kind letter: b, i, u, f (V for bf16, f8e4m3, f8e5m2).", NULL},
    {"numpy", (getter)dtype_get_numpy, NULL,
     "The numpy.dtype (ml_dtypes.bfloat16 for bf16, ml_dtypes.float8_e4m3fn for f8e4m3, "
     "ml_dtypes.float8_e5m2 for f8e5m2; TypeError without ml_dtypes).", NULL},
    {NULL},
};

static PyMemberDef dtype_members[] = {
    {"itemsize", T_INT, offsetof(mg_dtype, itemsize), READONLY, "Bytes per element."},
    {"bits", T_UBYTE, offsetof(mg_dtype, bits), READONLY, "Bits per element."},
    {NULL},
};

static PyMethodDef dtype_methods[] = {
    {"__reduce__", (PyCFunction)dtype_reduce, METH_NOARGS, NULL},
    {NULL},
};

static void dtype_dealloc(mg_dtype *self)
{
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyType_Slot dtype_slots[] = {
    {Py_tp_doc, "An element type; the instances are the singletons mlirgpu.f32, mlirgpu.i32, ... "
                "They convert to and from NumPy's.\n\nFor example::\n\n"
                "    mg.f32.numpy            # dtype('float32')\n"
                "    mg.f32 == np.float32    # True\n"
                "    mg.f16.itemsize, mg.bf16.bits"},
    {Py_tp_dealloc, dtype_dealloc},
    {Py_tp_repr, dtype_repr},
    {Py_tp_richcompare, dtype_richcompare},
    {Py_tp_hash, dtype_hash},
    {Py_tp_getset, dtype_getset},
    {Py_tp_members, dtype_members},
    {Py_tp_methods, dtype_methods},
    {0, NULL},
};

static PyType_Spec dtype_spec = {
    .name = "mlirgpu.DType",
    .basicsize = sizeof(mg_dtype),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = dtype_slots,
};

static PyObject *array_dtype_function(PyObject *module, PyObject *obj)
{
    mg_dtype *out;
    if (!mg_dtype_converter(obj, &out))
        return NULL;
    return Py_NewRef((PyObject *)out);
}

/* ---------------------------------------------------------------------- */
/* Shapes and strides                                                      */
/* ---------------------------------------------------------------------- */

/* a * b, or -1 when the product does not fit (either sign). */
static int checked_mul(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out)
{
    if (a == PY_SSIZE_T_MIN || b == PY_SSIZE_T_MIN)
        return -1;
    Py_ssize_t abs_a = a < 0 ? -a : a, abs_b = b < 0 ? -b : b;
    if (abs_a != 0 && abs_b > PY_SSIZE_T_MAX / abs_a)
        return -1;
    *out = a * b;
    return 0;
}

/* A non-negative extent from an int-like object. */
static int parse_extent(PyObject *item, Py_ssize_t *out)
{
    if (!PyIndex_Check(item) || PyBool_Check(item)) {
        PyErr_Format(PyExc_TypeError, "a shape holds ints, not %.100s", Py_TYPE(item)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyNumber_AsSsize_t(item, PyExc_ValueError);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "negative dimension %zd in a shape", n);
        return -1;
    }
    *out = n;
    return 0;
}

/* shape= of empty/zeros: an int or a sequence of up to MG_MAX_NDIM ints. */
static int parse_shape(PyObject *obj, int *ndim, Py_ssize_t shape[MG_MAX_NDIM])
{
    if (PyIndex_Check(obj) && !PyBool_Check(obj)) {
        *ndim = 1;
        return parse_extent(obj, &shape[0]);
    }
    if (!PyTuple_Check(obj) && !PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "shape must be an int or a tuple of ints, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    /* A tuple of our own: an item's __index__ may change a list while it is read. */
    PyObject *items = PySequence_Tuple(obj);
    if (items == NULL)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int status = 0;
    if (n > MG_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "at most %d dimensions are supported, got %zd", MG_MAX_NDIM, n);
        status = -1;
    }
    for (Py_ssize_t i = 0; i < n && status == 0; i++)
        status = parse_extent(PyTuple_GET_ITEM(items, i), &shape[i]);
    Py_DECREF(items);
    if (status == 0)
        *ndim = (int)n;
    return status;
}

/* Fills strides for a C-contiguous layout and the element count; ValueError
 * when the byte size overflows. */
static int c_strides(int ndim, const Py_ssize_t *shape, int itemsize, Py_ssize_t *strides, Py_ssize_t *size)
{
    Py_ssize_t step = itemsize, count = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = step;
        if (checked_mul(step, shape[i] ? shape[i] : 1, &step) < 0 || checked_mul(count, shape[i], &count) < 0) {
            PyErr_SetString(PyExc_ValueError, "array is too large");
            return -1;
        }
    }
    *size = count;
    return 0;
}

/* The byte range [lo, hi) a strided layout touches, relative to its first
 * element; ValueError on overflow. Only meaningful for size > 0. */
static int byte_extent(const mg_array *a, Py_ssize_t *lo, Py_ssize_t *hi)
{
    Py_ssize_t low = 0, high = a->dtype->itemsize, step;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] == 0)
            continue;
        if (checked_mul(a->shape[i] - 1, a->strides[i], &step) < 0)
            goto error;
        if (step < 0 ? low < PY_SSIZE_T_MIN / 2 - step : high > PY_SSIZE_T_MAX / 2 - step)
            goto error;
        if (step < 0)
            low += step;
        else
            high += step;
    }
    *lo = low;
    *hi = high;
    return 0;
error:
    PyErr_SetString(PyExc_ValueError, "the array's strides reach outside the address space");
    return -1;
}

static int is_c_contiguous(const mg_array *a)
{
    if (a->size == 0)
        return 1;
    Py_ssize_t expected = a->dtype->itemsize;
    for (int i = a->ndim - 1; i >= 0; i--) {
        if (a->shape[i] != 1 && a->strides[i] != expected)
            return 0;
        expected *= a->shape[i];
    }
    return 1;
}

int mg_array_is_c_contiguous(PyObject *obj)
{
    return is_c_contiguous((mg_array *)obj);
}

/* ---------------------------------------------------------------------- */
/* DeviceArray: creation and release                                       */
/* ---------------------------------------------------------------------- */

/* A DeviceArray with no memory yet: ptr 0, the thread's device, the legacy
 * default stream. `strides` NULL means C-contiguous. */
static mg_array *array_create(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides)
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
    if (c_strides(ndim, shape, dtype->itemsize, self->strides, &self->size) < 0) {
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

static int array_traverse(mg_array *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    Py_VISIT(self->stream_obj);
    return 0;
}

static int array_clear(mg_array *self)
{
    release_memory(self);
    Py_CLEAR(self->stream_obj);
    return 0;
}

static void array_dealloc(mg_array *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    array_clear(self);
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
static mg_array *host_create(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides)
{
    mg_array *self = array_create(dtype, ndim, shape, strides);
    if (self != NULL) {
        self->host = 1;
        self->device = -1;
    }
    return self;
}

/* A fresh allocation; `zero` fills it with zero bytes on `stream`. With
 * `host`, host memory, and the stream is not used (the CPU backend runs
 * launches to completion). */
static PyObject *array_allocate(mg_dtype *dtype, int ndim, const Py_ssize_t *shape,
                                PyObject *stream_arg, int zero, int host)
{
    if (host) {
        mg_array *self = host_create(dtype, ndim, shape, NULL);
        size_t nbytes = self == NULL ? 0 : (size_t)self->size * (size_t)dtype->itemsize;
        if (self != NULL && nbytes > 0 && host_allocate(self, nbytes, zero) < 0)
            Py_CLEAR(self);
        return (PyObject *)self;
    }
    CUstream stream;
    PyObject *stream_obj;
    if (parse_stream(stream_arg, &stream, &stream_obj) < 0)
        return NULL;
    mg_array *self = array_create(dtype, ndim, shape, NULL);
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
    mg_dtype *dtype = dtypes[MG_DT_F32];
    int host = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &shape_obj,
                                     mg_dtype_converter, &dtype, &stream_obj, &host))
        return NULL;
    int ndim;
    Py_ssize_t shape[MG_MAX_NDIM];
    if (parse_shape(shape_obj, &ndim, shape) < 0)
        return NULL;
    return array_allocate(dtype, ndim, shape, stream_obj, zero, host);
}

static PyObject *array_empty(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return allocate_function(args, kwargs, "O|O&O$p:empty", 0);
}

static PyObject *array_zeros(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return allocate_function(args, kwargs, "O|O&O$p:zeros", 1);
}

static PyObject *array_to_device(PyObject *module, PyObject *args, PyObject *kwargs)
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
    if (dtype_from_descr(PyArray_DESCR(host), &dtype) < 0)
        goto error;
    if (PyArray_NDIM(host) > MG_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "at most %d dimensions are supported, got %d",
                     MG_MAX_NDIM, PyArray_NDIM(host));
        goto error;
    }
    if (host_memory) {
        self = host_create(dtype, PyArray_NDIM(host), PyArray_SHAPE(host), NULL);
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
    self = array_create(dtype, PyArray_NDIM(host), PyArray_SHAPE(host), NULL);
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
    if (is_c_contiguous(self)) {
        if (copy_to_host(self, PyArray_DATA(result), self->ptr, (size_t)PyArray_NBYTES(result), stream, 1) < 0)
            goto error;
        Py_DECREF(descr);
        return (PyObject *)result;
    }
    /* Strided (negative and zero strides included): copy the byte range the
     * view spans, then let NumPy gather it through a view with our strides. */
    Py_ssize_t lo, hi;
    if (byte_extent(self, &lo, &hi) < 0)
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
    if (dtype_from_descr(PyArray_DESCR(host), &dtype) < 0)
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
    if (!is_c_contiguous(self) || (host != NULL && !PyArray_IS_C_CONTIGUOUS(host))) {
        PyErr_Format(PyExc_ValueError, "%s(blocking=False) copies C-contiguous arrays only: a strided one "
                     "is gathered on the host after the copy", call);
        return -1;
    }
    return 0;
}

static PyObject *array_get(mg_array *self, PyObject *args, PyObject *kwargs)
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

static PyObject *array_copy_to_host(mg_array *self, PyObject *args, PyObject *kwargs)
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
    if (PyArray_IS_C_CONTIGUOUS(host) && is_c_contiguous(self)) {
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

static PyObject *array_copy_from_host(mg_array *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"src", "stream", NULL};
    PyObject *src, *stream_arg = Py_None, *stream_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:copy_from_host", keywords, &src, &stream_arg))
        return NULL;
    if (refuse_readonly(self, "copy_from_host") < 0 || check_host_peer(self, src, "src") < 0)
        return NULL;
    PyArrayObject *host = (PyArrayObject *)src;
    if (!is_c_contiguous(self) || !PyArray_IS_C_CONTIGUOUS(host))
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
static PyObject *array_to(mg_array *self, PyObject *args, PyObject *kwargs)
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
    if (!is_c_contiguous(self))
        return mg_raise(PyExc_ValueError, "to: the array must be C-contiguous");
    if (parse_stream(stream_arg, &stream, &stream_obj) < 0 || check_stream_device(stream_obj, device, "to") < 0)
        return NULL;
    mg_array *copy = array_create(self->dtype, self->ndim, self->shape, NULL);
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
static PyObject *array_copy_from(mg_array *self, PyObject *args, PyObject *kwargs)
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
    if (!is_c_contiguous(self) || !is_c_contiguous(src))
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

static PyObject *array_get_shape(mg_array *self, void *closure) { return ssize_tuple(self->ndim, self->shape); }
static PyObject *array_get_strides(mg_array *self, void *closure) { return ssize_tuple(self->ndim, self->strides); }
static PyObject *array_get_dtype(mg_array *self, void *closure) { return Py_NewRef((PyObject *)self->dtype); }
static PyObject *array_get_nbytes(mg_array *self, void *closure) { return PyLong_FromSsize_t(self->size * self->dtype->itemsize); }
static PyObject *array_get_ptr(mg_array *self, void *closure) { return PyLong_FromUnsignedLongLong(self->ptr); }
static PyObject *array_get_host(mg_array *self, void *closure) { return PyBool_FromLong(self->host); }
static PyObject *array_get_readonly(mg_array *self, void *closure) { return PyBool_FromLong(self->readonly); }
static PyObject *array_get_contiguous(mg_array *self, void *closure) { return PyBool_FromLong(is_c_contiguous(self)); }

/* __cuda_array_interface__ version 3. */
static PyObject *array_get_cai(mg_array *self, void *closure)
{
    if (self->host)
        return mg_raise(PyExc_AttributeError, "a DeviceArray of the CPU backend is host memory: it has no "
                        "__cuda_array_interface__ (use __dlpack__ or get())");
    if (self->dtype->typestr == NULL)
        return PyErr_Format(PyExc_TypeError, "%s has no __cuda_array_interface__ typestr: use __dlpack__",
                            self->dtype->name);
    PyObject *shape = NULL, *strides = NULL, *result = NULL;
    shape = ssize_tuple(self->ndim, self->shape);
    strides = is_c_contiguous(self) ? Py_NewRef(Py_None) : ssize_tuple(self->ndim, self->strides);
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

static PyObject *array_repr(mg_array *self)
{
    PyObject *shape = ssize_tuple(self->ndim, self->shape);
    if (shape == NULL)
        return NULL;
    PyObject *repr = self->host
        ? PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=mlirgpu.%s, device='cpu')", shape, self->dtype->name)
        : PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=mlirgpu.%s, device=%d)",
                               shape, self->dtype->name, self->device);
    Py_DECREF(shape);
    return repr;
}

static Py_ssize_t array_length(mg_array *self)
{
    if (self->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d DeviceArray");
        return -1;
    }
    return self->shape[0];
}

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

static PyObject *array_dlpack(mg_array *self, PyObject *args, PyObject *kwargs)
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

static PyObject *array_dlpack_device(mg_array *self, PyObject *unused)
{
    if (self->host)
        return Py_BuildValue("(ii)", kDLCPU, 0);
    return Py_BuildValue("(ii)", kDLCUDA, self->device);
}

/* ---------------------------------------------------------------------- */
/* Views: __cuda_array_interface__ and DLPack import                       */
/* ---------------------------------------------------------------------- */

static PyObject *str_cai, *str_dlpack, *str_dlpack_device, *str_array_interface, *str_array;

static PyObject *host_array_error(PyObject *obj)
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
        if (id == MG_DT_INDEX || dtype_table[id].typestr == NULL)
            continue;
        if (dtype_table[id].kind == text[1] && dtype_table[id].itemsize == size) {
            *out = dtypes[id];
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
static int cai_untyped(PyObject *obj, PyObject *cai)
{
    PyObject *typestr = PyDict_Check(cai) ? cai_item(cai, "typestr", 0) : NULL;
    const char *text = typestr != NULL && PyUnicode_Check(typestr) ? PyUnicode_AsUTF8(typestr) : NULL;
    if (text == NULL) {
        PyErr_Clear();   /* the interface's own reading says what is wrong with it */
        return 0;
    }
    return text[0] != '\0' && text[1] == 'V' && PyObject_HasAttr(obj, str_dlpack);
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

/* What a __cuda_array_interface__ dict says, checked. */
typedef struct {
    mg_dtype *dtype;          /* borrowed singleton */
    int ndim, has_strides, readonly, has_stream;
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
    unsigned long long pointer;
    CUstream stream;          /* the producer's stream, where has_stream */
} cai_fields;

/* Reads and checks a CAI dict (v0 to v3): 0, or -1 with TypeError or
 * ValueError. Nothing here runs Python code, so the dict's borrowed items
 * stay valid throughout. */
static int cai_parse(PyObject *cai, cai_fields *f)
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
 * for it now. */
static PyObject *view_from_cai(PyObject *obj, PyObject *cai)
{
    cai_fields f;
    if (cai_parse(cai, &f) < 0)
        return NULL;
    if (f.has_stream && mg_cu_stream_order(f.stream, NULL) < 0)
        return NULL;
    mg_array *view = array_create(f.dtype, f.ndim, f.shape, f.has_strides ? f.strides : NULL);
    if (view == NULL)
        return NULL;
    Py_ssize_t lo, hi;
    if (view->size > 0 && byte_extent(view, &lo, &hi) < 0) {
        Py_DECREF(view);
        return NULL;
    }
    view->ptr = (CUdeviceptr)f.pointer;
    view->readonly = f.readonly;
    view->device = view->size > 0 && f.pointer != 0 ? mg_cu_pointer_device(view->ptr) : mg_cu_current_device();
    view->owner = Py_NewRef(obj);
    return (PyObject *)view;
}

static int dtype_from_dl(DLDataType t, mg_dtype **out)
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
    *out = dtypes[id];
    return 0;
}

/* A view of a "dltensor" or "dltensor_versioned" capsule. On success the
 * capsule is renamed "used_..." and the view calls the deleter when it dies;
 * on failure the capsule is left as it was, so its own destructor frees it. */
/* A zero-copy view of a consumed DLPack capsule: of CUDA memory, or with
 * `host` of host memory (a host DeviceArray, the CPU backend's). */
static PyObject *view_from_capsule_on(PyObject *capsule, int host)
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
    if (dtype_from_dl(t->dtype, &dtype) < 0)
        return NULL;
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > PY_SSIZE_T_MAX)
            return mg_raise(PyExc_ValueError, "DLPack tensor has a bad extent %lld", (long long)t->shape[i]);
        shape[i] = (Py_ssize_t)t->shape[i];
        if (t->strides != NULL && checked_mul((Py_ssize_t)t->strides[i], dtype->itemsize, &strides[i]) < 0)
            return mg_raise(PyExc_ValueError, "DLPack tensor has a stride too large to address");
    }
    mg_array *view = (host ? host_create : array_create)(dtype, t->ndim, shape, t->strides != NULL ? strides : NULL);
    if (view == NULL)
        return NULL;
    Py_ssize_t lo, hi;
    if (view->size > 0 && byte_extent(view, &lo, &hi) < 0)
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

static PyObject *view_from_capsule(PyObject *capsule)
{
    return view_from_capsule_on(capsule, 0);
}

/* obj.__dlpack__(max_version=(1, 0), stream=1), or without max_version for
 * producers that predate it. Stream 1: order the export after the
 * producer's work as seen from the legacy default stream. */
static PyObject *call_dlpack(PyObject *obj)
{
    PyObject *method = PyObject_GetAttr(obj, str_dlpack);
    if (method == NULL)
        return NULL;
    PyObject *capsule = NULL;
    PyObject *kwargs = Py_BuildValue("{s:(ii),s:i}", "max_version", MG_DLPACK_MAJOR, MG_DLPACK_MINOR, "stream", 1);
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

static PyObject *view_from_dlpack(PyObject *obj)
{
    PyObject *device = NULL, *capsule = NULL, *view = NULL;
    int found;
    /* Ask where the data lives first: a host producer gets no stream argument. */
    found = PyObject_HasAttr(obj, str_dlpack_device);
    if (found) {
        device = PyObject_CallMethodNoArgs(obj, str_dlpack_device);
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
            host_array_error(obj);
            goto error;
        }
        if (type != kDLCUDA && type != kDLCUDAManaged) {
            PyErr_Format(PyExc_TypeError, "%.100s lives on DLPack device type %d, not CUDA",
                         Py_TYPE(obj)->tp_name, type);
            goto error;
        }
    }
    capsule = call_dlpack(obj);
    if (capsule == NULL)
        goto error;
    if (!PyCapsule_CheckExact(capsule)) {
        PyErr_Format(PyExc_TypeError, "%.100s.__dlpack__() returned %.100s, not a capsule",
                     Py_TYPE(obj)->tp_name, Py_TYPE(capsule)->tp_name);
        goto error;
    }
    view = view_from_capsule(capsule);
error:
    Py_XDECREF(device);
    Py_XDECREF(capsule);   /* a consumed capsule lives on as the view's owner */
    return view;
}

static int refuse_deleted_jax(PyObject *obj);

PyObject *mg_array_asarray(PyObject *obj)
{
    if (PyObject_TypeCheck(obj, mg_array_type))
        return Py_NewRef(obj);
    if (PyArray_Check(obj))
        return host_array_error(obj);
    if (refuse_deleted_jax(obj) < 0)
        return NULL;
    if (PyCapsule_CheckExact(obj))
        return view_from_capsule(obj);
    PyObject *cai = PyObject_GetAttr(obj, str_cai);
    if (cai != NULL) {
        int untyped = cai_untyped(obj, cai);
        PyObject *view = untyped ? NULL : view_from_cai(obj, cai);
        Py_DECREF(cai);
        return untyped ? view_from_dlpack(obj) : view;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    /* No interface, or one that cannot describe this array (torch raises for
     * its 8-bit floats, which the interface has no type string for): DLPack
     * may, and says so itself when it cannot either. */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int missing = PyErr_GivenExceptionMatches(type, PyExc_AttributeError);
    int has_dlpack = PyObject_HasAttr(obj, str_dlpack);
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
        return view_from_dlpack(obj);
    if (PyObject_HasAttr(obj, str_array_interface) || PyObject_HasAttr(obj, str_array))
        return host_array_error(obj);
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
        return view_from_capsule_on(obj, 1);
    if (!PyObject_HasAttr(obj, str_dlpack))
        return PyErr_Format(PyExc_TypeError, "cannot view %.100s as a host array: it has no __dlpack__",
                            Py_TYPE(obj)->tp_name);
    /* Versioned first: only its capsule can say the memory is read-only. */
    PyObject *capsule = NULL, *method = PyObject_GetAttr(obj, str_dlpack);
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
    PyObject *view = view_from_capsule_on(capsule, 1);
    Py_DECREF(capsule);   /* a consumed capsule lives on as the view's owner */
    return view;
}

static PyObject *array_asarray_function(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"obj", "host", NULL};
    PyObject *obj;
    int host = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$p:asarray", keywords, &obj, &host))
        return NULL;
    return host ? host_asarray(obj) : mg_array_asarray(obj);
}

/* ---------------------------------------------------------------------- */
/* Foreign arrays as launch arguments                                      */
/* ---------------------------------------------------------------------- */

static PyObject *str_is_cuda, *str_is_cpu, *str_data_ptr, *str_dtype_attr, *str_shape, *str_stride,
                *str_get_device, *str_module, *str_is_contiguous, *str_data, *str_ptr, *str_device_id,
                *str_c_contiguous, *str_strides, *str_get_current_stream, *str_export_version,
                *str_cupy_cuda, *str_cupy_util, *str_is_ready, *str_block_until_ready,
                *str_unsafe_buffer_pointer, *str_is_deleted, *str_aval, *str_ndim,
                *str_torch_function, *str_torch_dispatch, *str_torch_c, *str_disabled_torch_function,
                *str_torch_utils_dlpack, *str_to_dlpack, *str_dlpack_exchange, *str_pyx_capi,
                *str_cupy_backends_stream, *str_get_current_stream_ptr, *str_get_stream_ptr,
                *str_is_ptds_enabled, *str_memory_pointer;
/* The C signatures CuPy's stream module gives the functions behind its current stream. */
#define CUPY_STREAM_PTR_SIGNATURE "intptr_t (void)"
#define CUPY_DEVICE_STREAM_PTR_SIGNATURE "intptr_t (int)"
#define CUPY_PTDS_SIGNATURE "int (void)"
/* torch.Tensor once an instance was seen (strong): torch is never imported here. */
static PyTypeObject *torch_tensor_type;
/* {torch.dtype: DType, or None where mlirgpu has no such dtype}; filled on first sight. */
static PyObject *torch_dtypes;

static const struct {
    const char *name;   /* str(torch.float32) is "torch.float32": the part after the dot */
    mg_dtype_id id;
} torch_dtype_names[] = {
    {"bool", MG_DT_BOOL}, {"int8", MG_DT_I8}, {"int16", MG_DT_I16}, {"int32", MG_DT_I32},
    {"int64", MG_DT_I64}, {"uint8", MG_DT_U8}, {"uint16", MG_DT_U16}, {"uint32", MG_DT_U32},
    {"uint64", MG_DT_U64}, {"float16", MG_DT_F16}, {"bfloat16", MG_DT_BF16},
    {"float32", MG_DT_F32}, {"float64", MG_DT_F64},
    {"float8_e4m3fn", MG_DT_F8E4M3}, {"float8_e5m2", MG_DT_F8E5M2},
};

/* The __module__ of a type of its MRO: borrowed, from the type's dict (heap
 * types) or the dotted prefix of tp_name (extension types), in `buffer`. */
static const char *type_module(PyTypeObject *type, char *buffer, size_t size)
{
    if (type->tp_dict != NULL && (type->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        PyObject *module = PyDict_GetItemWithError(type->tp_dict, str_module);   /* borrowed */
        if (module == NULL) {
            PyErr_Clear();
            return NULL;
        }
        return PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : NULL;
    }
    const char *dot = strrchr(type->tp_name, '.');
    if (dot == NULL || (size_t)(dot - type->tp_name) >= size)
        return NULL;
    memcpy(buffer, type->tp_name, (size_t)(dot - type->tp_name));
    buffer[dot - type->tp_name] = '\0';
    return buffer;
}

static const char *type_short_name(PyTypeObject *type)
{
    const char *dot = strrchr(type->tp_name, '.');
    return dot != NULL ? dot + 1 : type->tp_name;
}

/* torch.Tensor or a subclass: some heap type of the MRO is named "Tensor"
 * and has __module__ "torch" (torch.Tensor is a Python class over the C
 * torch._C.TensorBase). Later calls compare against the type found. */
static int is_torch_tensor(PyTypeObject *type)
{
    if (torch_tensor_type != NULL)
        return type == torch_tensor_type || PyType_IsSubtype(type, torch_tensor_type);
    PyObject *mro = type->tp_mro;
    if (mro == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        char buffer[64];
        const char *module;
        if (!(base->tp_flags & Py_TPFLAGS_HEAPTYPE) || strcmp(base->tp_name, "Tensor") != 0 ||
            (module = type_module(base, buffer, sizeof buffer)) == NULL) {
            PyErr_Clear();
            continue;
        }
        if (strcmp(module, "torch") == 0) {
            torch_tensor_type = (PyTypeObject *)Py_NewRef((PyObject *)base);
            return 1;
        }
    }
    return 0;
}

/* cupy.ndarray or a subclass: a type of the MRO named "ndarray" or
 * "_ndarray_base" whose module is cupy or one of its submodules. */
static int is_cupy_ndarray(PyTypeObject *type)
{
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        const char *name = type_short_name(base), *module;
        char buffer[64];
        if (strcmp(name, "ndarray") != 0 && strcmp(name, "_ndarray_base") != 0)
            continue;
        if ((module = type_module(base, buffer, sizeof buffer)) == NULL) {
            PyErr_Clear();
            continue;
        }
        if (strcmp(module, "cupy") == 0 || strncmp(module, "cupy.", 5) == 0)
            return 1;
    }
    return 0;
}

/* jax.Array's implementation: a type of the MRO named "ArrayImpl" in jax or
 * jaxlib (a Python class in older releases, a C++ one in newer). */
static int is_jax_array(PyTypeObject *type)
{
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        const char *module;
        char buffer[64];
        if (strcmp(type_short_name(base), "ArrayImpl") != 0)
            continue;
        if ((module = type_module(base, buffer, sizeof buffer)) == NULL) {
            PyErr_Clear();
            continue;
        }
        if (strncmp(module, "jax", 3) == 0)
            return 1;
    }
    return 0;
}

/* ---- How each type's arrays are read, found once per type ----
 *
 * A launch reads its array arguments through what their library exposes
 * (READER_TORCH, READER_CUPY, READER_JAX) or through the protocols (READER_GENERIC:
 * __cuda_array_interface__, then __dlpack__). Which reader a type gets, and
 * for CuPy the functions that tell its current stream, are kept per type
 * along with the type's version tag: CPython gives a type a new tag (or 0)
 * whenever the type or one of its bases is changed, and a type whose tag
 * moved is classified again. Nothing about an object is kept: every call
 * reads pointer, dtype, shape, strides and device anew. */
enum { READER_GENERIC, READER_TORCH, READER_CUPY, READER_JAX };

/* One attribute of a plan's type, read as attribute lookup on that type
 * would read it: through the C getter or member the lookup finds, called
 * directly (without the descriptor's own type check, which the lookup
 * settled), or else looked up as usual. */
typedef struct {
    PyObject *name;            /* one of this file's interned names */
    getter get;                /* a getset descriptor's getter, with its closure */
    void *closure;
    PyMemberDef *member;       /* or a member descriptor's definition */
} plan_attr;

/* READER_TORCH's plan, see torch_plan. */
typedef struct {
    const DLPackExchangeAPI *exchange;   /* or NULL */
    PyObject *to_dlpack;                 /* or NULL */
    plan_attr is_cuda, is_cpu, dtype, shape;
} torch_reads;

/* READER_CUPY's plan, see cupy_plan. */
typedef struct {
    PyObject *current_stream;
    PyObject *settings;
    PyObject *settings_dict;             /* its dict where it is a plain module, else NULL */
    intptr_t (*stream_ptr)(void);        /* NULL where CuPy does not export them */
    intptr_t (*device_stream_ptr)(int);
    int (*ptds)(void);
    plan_attr data, dtype, ndim, shape, c_contiguous, strides;
    PyTypeObject *pointer_type;          /* cupy.cuda.MemoryPointer, and its version tag; or NULL */
    unsigned int pointer_version;
    plan_attr ptr, device_id;
} cupy_reads;

/* What a reader calls, found once per type and kept by a capsule (the
 * plan object), which releases `kept` with it. Every object the fields
 * name is borrowed from `kept`. */
#define PLAN_KEPT 16   /* CuPy's plan keeps 14 */
typedef struct {
    PyObject *kept[PLAN_KEPT];
    int nkept;
    union {
        torch_reads torch;
        cupy_reads cupy;
    };
} reader_plan;

typedef struct {
    PyTypeObject *type;        /* strong; NULL: a free slot */
    unsigned int version;      /* type->tp_version_tag when classified */
    int reader;
    PyObject *plan;            /* strong: READER_TORCH's and READER_CUPY's plan object, else NULL */
    const reader_plan *reads;  /* what `plan` keeps */
    int readonly;              /* JAX: whether its CAI exports arrays read-only; -1 until one was read */
} type_reader;

#define TYPE_READERS 16
static type_reader type_readers[TYPE_READERS];
static int type_readers_next;
static int type_readers_last;   /* the slot found last, tried first: a launch's arrays are mostly of one type */

/* The slot of `type`, or -1. */
static int type_slot(PyTypeObject *type)
{
    if (type_readers[type_readers_last].type == type)
        return type_readers_last;
    for (int i = 0; i < TYPE_READERS; i++)
        if (type_readers[i].type == type)
            return type_readers_last = i;
    return -1;
}

/* One type's reader, with a new reference to its plan (or NULL): the
 * caller releases it, as reading an array may run code that evicts the slot. */
typedef struct {
    PyTypeObject *type;        /* borrowed from the object being read */
    int reader, readonly;
    PyObject *plan;
    const reader_plan *reads;  /* what `plan` keeps, or NULL */
} reader_info;

static void reader_info_release(reader_info *info)
{
    Py_CLEAR(info->plan);
}

static unsigned int type_version(PyTypeObject *type)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyUnstable_Type_AssignVersionTag(type);
#else
    _PyType_Lookup(type, str_module);   /* assigns a tag where the type has none; runs no Python code */
#endif
    return type->tp_version_tag;
}

/* The data descriptor that attribute lookup finds for `name` on `type`,
 * where calling it is all PyObject_GetAttr would do: a C getter or member
 * (a data descriptor, which an instance's __dict__ cannot hide; not one
 * whose reads raise an audit event) on a type whose attribute lookup is the
 * usual one. Borrowed; NULL otherwise. */
static PyObject *c_descriptor(PyTypeObject *type, PyObject *name)
{
    if (type->tp_getattro == PyObject_GenericGetAttr) {
        PyObject *descr = _PyType_Lookup(type, name);   /* runs no Python code */
        if (descr != NULL && (Py_IS_TYPE(descr, &PyGetSetDescr_Type) ||
                              (Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                               !(((PyMemberDescrObject *)descr)->d_member->flags & READ_RESTRICTED))))
            return descr;
    }
    return NULL;
}

/* `attr` for `name`, whose c_descriptor on the type is `descr` (or NULL):
 * its getter or member, called without the type check the descriptor would
 * make first, which that lookup settled; looked up as usual where there is
 * none, or the getter is missing (a write-only attribute). */
static void plan_attr_set(plan_attr *attr, PyObject *descr, PyObject *name)
{
    *attr = (plan_attr){name, NULL, NULL, NULL};
    if (descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        attr->get = ((PyGetSetDescrObject *)descr)->d_getset->get;
        attr->closure = ((PyGetSetDescrObject *)descr)->d_getset->closure;
    }
    else if (descr != NULL) {
        attr->member = ((PyMemberDescrObject *)descr)->d_member;
    }
}

/* `obj`'s attribute, `obj` being of the type `attr` was found on. */
static inline PyObject *plan_attr_read(const plan_attr *attr, PyObject *obj)
{
    if (attr->get != NULL)
        return attr->get(obj, attr->closure);
    if (attr->member != NULL)
        return PyMember_GetOne((const char *)obj, attr->member);
    return PyObject_GetAttr(obj, attr->name);
}

/* obj.<name>, through its type's C getter or member where it has one: for
 * an object whose type no plan keeps (the lookup costs a little). */
static PyObject *get_attr(PyObject *obj, PyObject *name)
{
    plan_attr attr;
    plan_attr_set(&attr, c_descriptor(Py_TYPE(obj), name), name);
    return plan_attr_read(&attr, obj);
}

/* Attribute `name` of the module `module_name` if that module was imported
 * (nothing is imported here): a new reference; NULL with no error set where
 * the module is not imported, with the error set where it lacks `name`. */
static PyObject *imported_attr(PyObject *module_name, PyObject *name)
{
    PyObject *module = PyImport_GetModule(module_name);
    if (module == NULL)
        return NULL;
    PyObject *value = PyObject_GetAttr(module, name);
    Py_DECREF(module);
    return value;
}

/* Keeps only the exceptions that must propagate: 0 with any Exception
 * cleared, -1 for the rest (KeyboardInterrupt). */
static int clear_exception(void)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
    }
    return 0;
}

#define PLAN_CAPSULE "mlirgpu reader plan"

static void plan_destroy(PyObject *capsule)
{
    reader_plan *plan = PyCapsule_GetPointer(capsule, PLAN_CAPSULE);
    for (int i = 0; i < plan->nkept; i++)
        Py_DECREF(plan->kept[i]);
    PyMem_Free(plan);
}

/* An empty plan: its object (a new reference; NULL on error) and, in *out, what it keeps. */
static PyObject *plan_new(reader_plan **out)
{
    reader_plan *plan = PyMem_Calloc(1, sizeof *plan);
    if (plan == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(plan, PLAN_CAPSULE, plan_destroy);
    if (capsule == NULL)
        PyMem_Free(plan);
    *out = plan;
    return capsule;
}

/* `obj` (a new reference, stolen), kept by `plan`: borrowed, or NULL
 * where `obj` is NULL or None, or the plan is full (nothing is kept). */
static PyObject *plan_keep(reader_plan *plan, PyObject *obj)
{
    if (obj == NULL || obj == Py_None || plan->nkept == PLAN_KEPT) {
        Py_XDECREF(obj);
        return NULL;
    }
    return plan->kept[plan->nkept++] = obj;
}

/* `type`'s attribute `name` as `plan` reads it (see plan_attr). */
static void plan_attr_find(reader_plan *plan, plan_attr *attr, PyTypeObject *type, PyObject *name)
{
    PyObject *descr = c_descriptor(type, name);
    plan_attr_set(attr, descr != NULL && plan_keep(plan, Py_NewRef(descr)) != NULL ? descr : NULL, name);
}

/* Whether `type`'s tensors may be read around torch's Python layer: the
 * type leaves __torch_function__ and __torch_dispatch__ as torch.Tensor has
 * them (or, as torch.nn.Parameter does, torch functions disabled), so that
 * its attributes would read the same tensor. 1 or 0; -1 only for an
 * exception that is not an Exception. */
static int torch_plain(PyTypeObject *type)
{
    PyObject *function = _PyType_Lookup(type, str_torch_function);   /* borrowed */
    PyObject *dispatch = _PyType_Lookup(type, str_torch_dispatch);
    if (dispatch != _PyType_Lookup(torch_tensor_type, str_torch_dispatch))
        return 0;
    if (function == _PyType_Lookup(torch_tensor_type, str_torch_function))
        return 1;
    PyObject *disabled = imported_attr(str_torch_c, str_disabled_torch_function);
    int plain = disabled != NULL && function == disabled;
    Py_XDECREF(disabled);
    return clear_exception() < 0 ? -1 : plain;
}

/* `type`'s DLPack exchange table (its __dlpack_c_exchange_api__ capsule)
 * where mlirgpu can use it: DLPack major version 1, with
 * dltensor_from_py_object_no_sync. A new reference; None otherwise; NULL
 * only for an exception that is not an Exception. */
static PyObject *exchange_table(PyTypeObject *type)
{
    PyObject *capsule = PyObject_GetAttr((PyObject *)type, str_dlpack_exchange);
    if (capsule != NULL && PyCapsule_IsValid(capsule, MG_DLPACK_EXCHANGE_NAME)) {
        const DLPackExchangeAPI *api = PyCapsule_GetPointer(capsule, MG_DLPACK_EXCHANGE_NAME);
        if (api->header.version.major == MG_DLPACK_MAJOR && api->dltensor_from_py_object_no_sync != NULL)
            return capsule;
    }
    Py_XDECREF(capsule);
    return clear_exception() < 0 ? NULL : Py_NewRef(Py_None);
}

/* READER_TORCH's plan for `type`: a new reference, NULL on an error that
 * must propagate. For a type torch's Python layer leaves alone, the DLPack
 * exchange table recent torch releases give their tensors and
 * torch.utils.dlpack.to_dlpack, where torch.utils.dlpack was imported
 * (nothing is imported here); None where a reader may not use them. */
static PyObject *torch_plan(PyTypeObject *type)
{
    int plain = torch_plain(type);
    PyObject *exchange = plain > 0 ? exchange_table(type) : Py_NewRef(Py_None);
    if (plain < 0 || exchange == NULL) {
        Py_XDECREF(exchange);
        return NULL;
    }
    reader_plan *plan;
    PyObject *object = plan_new(&plan);
    if (object == NULL) {
        Py_DECREF(exchange);
        return NULL;
    }
    torch_reads *t = &plan->torch;
    if ((exchange = plan_keep(plan, exchange)) != NULL)
        t->exchange = PyCapsule_GetPointer(exchange, MG_DLPACK_EXCHANGE_NAME);
    PyObject *exporter = plain ? imported_attr(str_torch_utils_dlpack, str_to_dlpack) : NULL;
    if (exporter != NULL && !PyCallable_Check(exporter))
        Py_CLEAR(exporter);
    t->to_dlpack = plan_keep(plan, exporter);
    plan_attr_find(plan, &t->is_cuda, type, str_is_cuda);
    plan_attr_find(plan, &t->is_cpu, type, str_is_cpu);
    plan_attr_find(plan, &t->dtype, type, str_dtype_attr);
    plan_attr_find(plan, &t->shape, type, str_shape);
    if (clear_exception() < 0) {
        Py_DECREF(object);
        return NULL;
    }
    return object;
}

/* The C function Cython module `module` exports as `name` (its
 * __pyx_capi__, what CuPy's own modules cimport) as a capsule whose name,
 * the C signature, must be `signature`: a new reference, or None; NULL
 * only for an exception that is not an Exception. */
static PyObject *cython_function(PyObject *module, PyObject *name, const char *signature)
{
    PyObject *table = imported_attr(module, str_pyx_capi), *capsule = NULL;
    if (table != NULL && PyDict_Check(table) && (capsule = PyDict_GetItemWithError(table, name)) != NULL &&
        PyCapsule_IsValid(capsule, signature)) {
        Py_INCREF(capsule);
        Py_DECREF(table);
        return capsule;
    }
    Py_XDECREF(table);
    return clear_exception() < 0 ? NULL : Py_NewRef(Py_None);
}

/* The C function behind `capsule` (from cython_function, stolen), kept by `plan`; NULL where there is none. */
static void *plan_function(reader_plan *plan, PyObject *capsule, const char *signature)
{
    capsule = plan_keep(plan, capsule);
    return capsule != NULL ? PyCapsule_GetPointer(capsule, signature) : NULL;
}

/* READER_CUPY's plan for `type`: CuPy's get_current_stream and settings
 * module (cupy._util), looked up without importing anything; the C
 * functions behind get_current_stream's pointer (the current device's,
 * one device's, and whether the null stream is per thread), where CuPy
 * exports them; how the arrays' attributes are read, and those of
 * cupy.cuda.MemoryPointer, the type of their `data`. A new reference;
 * None where CuPy lacks get_current_stream (its arrays are then read
 * through their protocol); NULL on an error that must propagate. */
static PyObject *cupy_plan(PyTypeObject *type)
{
    PyObject *current_stream = imported_attr(str_cupy_cuda, str_get_current_stream);
    PyObject *settings = current_stream != NULL ? PyImport_GetModule(str_cupy_util) : NULL;
    if (current_stream == NULL || settings == NULL || !PyCallable_Check(current_stream)) {
        Py_XDECREF(current_stream);
        Py_XDECREF(settings);
        return clear_exception() < 0 ? NULL : Py_NewRef(Py_None);
    }
    reader_plan *plan;
    PyObject *object = plan_new(&plan);
    if (object == NULL) {
        Py_DECREF(current_stream);
        Py_DECREF(settings);
        return NULL;
    }
    cupy_reads *c = &plan->cupy;
    c->current_stream = plan_keep(plan, current_stream);
    c->settings = plan_keep(plan, settings);
    /* A module's dict stays the same object for the module's life */
    c->settings_dict = PyModule_CheckExact(settings) ? PyModule_GetDict(settings) : NULL;
    PyObject *stream_ptr = cython_function(str_cupy_backends_stream, str_get_current_stream_ptr, CUPY_STREAM_PTR_SIGNATURE);
    PyObject *device_stream_ptr = stream_ptr != NULL ? cython_function(str_cupy_backends_stream, str_get_stream_ptr,
                                                                       CUPY_DEVICE_STREAM_PTR_SIGNATURE) : NULL;
    PyObject *ptds = device_stream_ptr != NULL ? cython_function(str_cupy_backends_stream, str_is_ptds_enabled,
                                                                 CUPY_PTDS_SIGNATURE) : NULL;
    PyObject *pointer_type = ptds != NULL ? imported_attr(str_cupy_cuda, str_memory_pointer) : NULL;
    if (pointer_type == NULL && clear_exception() < 0) {
        Py_XDECREF(stream_ptr);
        Py_XDECREF(device_stream_ptr);
        Py_XDECREF(ptds);
        Py_DECREF(object);
        return NULL;
    }
    c->stream_ptr = plan_function(plan, stream_ptr, CUPY_STREAM_PTR_SIGNATURE);
    c->device_stream_ptr = plan_function(plan, device_stream_ptr, CUPY_DEVICE_STREAM_PTR_SIGNATURE);
    c->ptds = plan_function(plan, ptds, CUPY_PTDS_SIGNATURE);
    if (c->stream_ptr == NULL || c->ptds == NULL) {   /* both or neither: a null stream means one of two */
        c->stream_ptr = NULL;
        c->ptds = NULL;
    }
    plan_attr_find(plan, &c->data, type, str_data);
    plan_attr_find(plan, &c->dtype, type, str_dtype_attr);
    plan_attr_find(plan, &c->ndim, type, str_ndim);
    plan_attr_find(plan, &c->shape, type, str_shape);
    plan_attr_find(plan, &c->c_contiguous, type, str_c_contiguous);
    plan_attr_find(plan, &c->strides, type, str_strides);
    /* A type without a version tag could change unseen: its instances are looked up */
    if (pointer_type != NULL && PyType_Check(pointer_type) &&
        (c->pointer_version = type_version((PyTypeObject *)pointer_type)) != 0)
        pointer_type = plan_keep(plan, pointer_type);
    else
        Py_CLEAR(pointer_type);
    if ((c->pointer_type = (PyTypeObject *)pointer_type) != NULL) {
        plan_attr_find(plan, &c->ptr, c->pointer_type, str_ptr);
        plan_attr_find(plan, &c->device_id, c->pointer_type, str_device_id);
    }
    return object;
}

/* The reader of `type` where the type was classified and has not changed
 * since: 1 with `info` filled, else 0 with `info->plan` NULL. */
static inline int known_reader(PyTypeObject *type, reader_info *info)
{
    info->plan = NULL;
    info->reads = NULL;
    info->type = type;
    info->readonly = -1;
    unsigned int version = type->tp_version_tag;
    int slot = type_slot(type);
    if (slot < 0 || version == 0 || type_readers[slot].version != version)
        return 0;
    type_reader *r = &type_readers[slot];
    info->reader = r->reader;
    info->readonly = r->readonly;
    info->plan = Py_XNewRef(r->plan);
    info->reads = r->reads;
    return 1;
}

/* 0, or -1 only for an exception that is not an Exception. */
static int reader_of(PyTypeObject *type, reader_info *info)
{
    if (known_reader(type, info))
        return 0;
    int slot = type_slot(type);   /* a type that changed since is classified again in its slot */
    int reader = READER_GENERIC;
    PyObject *plan = NULL;   /* NULL: the reader has none */
    unsigned int version = type_version(type);
    if (is_torch_tensor(type)) {
        if ((plan = torch_plan(type)) == NULL)
            return -1;
        reader = READER_TORCH;
    }
    else if (is_jax_array(type)) {
        reader = READER_JAX;
    }
    else if (is_cupy_ndarray(type)) {
        if ((plan = cupy_plan(type)) == NULL)
            return -1;
        if (plan == Py_None)
            Py_CLEAR(plan);   /* a CuPy without get_current_stream: its protocol is read */
        else
            reader = READER_CUPY;
    }
    if (type->tp_version_tag != version) {
        /* The lookups ran code that changed the type: this call reads
         * through the protocols, the next classifies the type again. */
        Py_XDECREF(plan);
        info->reader = READER_GENERIC;
        return 0;
    }
    const reader_plan *reads = plan != NULL ? PyCapsule_GetPointer(plan, PLAN_CAPSULE) : NULL;
    info->reader = reader;
    info->plan = Py_XNewRef(plan);
    info->reads = reads;
    if (version == 0) {   /* CPython ran out of tags: classified on every call */
        Py_XDECREF(plan);
        return 0;
    }
    /* Looking up the plan may have run code that filled slots: look again. */
    if (slot < 0)
        slot = type_slot(type);
    if (slot < 0) {
        slot = type_readers_next;
        type_readers_next = (type_readers_next + 1) % TYPE_READERS;
    }
    type_reader old = type_readers[slot];
    type_readers[slot] = (type_reader){(PyTypeObject *)Py_NewRef((PyObject *)type), version, reader, plan, reads, -1};
    /* Released last: a type's deallocation may run code. */
    Py_XDECREF(old.type);
    Py_XDECREF(old.plan);
    return 0;
}

/* The DType of a torch.dtype: 1, 0 when mlirgpu has none, -1 on error. */
static int torch_dtype(PyObject *dtype, mg_dtype **out)
{
    PyObject *known = PyDict_GetItemWithError(torch_dtypes, dtype);   /* borrowed */
    if (known == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *text = PyObject_Str(dtype);
        if (text == NULL)
            return -1;
        const char *name = PyUnicode_AsUTF8(text);
        known = Py_None;
        if (name != NULL && strncmp(name, "torch.", 6) == 0)
            for (size_t i = 0; i < sizeof torch_dtype_names / sizeof torch_dtype_names[0]; i++)
                if (strcmp(name + 6, torch_dtype_names[i].name) == 0)
                    known = (PyObject *)dtypes[torch_dtype_names[i].id];
        Py_DECREF(text);
        if (name == NULL || PyDict_SetItem(torch_dtypes, dtype, known) < 0)
            return -1;
    }
    if (known == Py_None)
        return 0;
    *out = (mg_dtype *)known;
    return 1;
}

static int foreign_contiguous(const mg_foreign *f)
{
    Py_ssize_t expected = f->dtype->itemsize;
    for (int i = 0; i < f->ndim; i++)
        if (f->shape[i] == 0)
            return 1;
    for (int i = f->ndim - 1; i >= 0; i--) {
        if (f->shape[i] != 1 && f->strides[i] != expected)
            return 0;
        expected *= f->shape[i];
    }
    return 1;
}

/* `count` ints of a tuple (torch.Size included) into `out`: 0, or -1 on
 * anything else (no error set). */
static int read_ints(PyObject *tuple, Py_ssize_t *out, int *count)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > MG_MAX_NDIM)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyLong_Check(item))
            return -1;
        out[i] = PyLong_AsSsize_t(item);
        if (out[i] == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    *count = (int)n;
    return 0;
}

static PyObject *call_method(PyObject *obj, PyObject *name)
{
    return PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* The int `value` (a new reference, consumed; NULL passes an error on): 0,
 * or -1 on anything else with the error (if any) left for the caller's fallback. */
static inline int take_int(PyObject *value, long long *out)
{
    if (value == NULL)
        return -1;
    int ok = PyLong_Check(value);
    if (ok)
        *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return ok && (*out != -1 || !PyErr_Occurred()) ? 0 : -1;
}

/* An int attribute (or, with `call`, method result) of `obj`, as take_int. */
static int read_int(PyObject *obj, PyObject *name, int call, long long *out)
{
    return take_int(call ? call_method(obj, name) : PyObject_GetAttr(obj, name), out);
}

/* A reader's "take the slow path": 0 with the error cleared, or -1 for a
 * BaseException that must propagate; `out` is reset for the slow path. */
static int reader_fallback(mg_foreign *out)
{
    if (clear_exception() < 0)
        return -1;
    out->host = 0;
    out->dtype = NULL;
    out->ndim = 0;
    out->device = -1;
    out->wait = 0;
    out->producer = NULL;
    return 0;
}

/* What a DLTensor of CUDA or host memory tells, its dtype being `dtype`
 * (whose size its own must match): 1, or 0 where it cannot be read so. */
static int dl_read(const DLTensor *t, mg_dtype *dtype, mg_foreign *out)
{
    if (t->device.device_type == kDLCUDA)
        out->device = t->device.device_id;
    else if (t->device.device_type == kDLCPU)
        out->host = 1;
    else
        return 0;
    if (t->ndim < 0 || t->ndim > MG_MAX_NDIM || t->dtype.lanes != 1 || t->dtype.bits != 8 * dtype->itemsize)
        return 0;
    out->dtype = dtype;
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > PY_SSIZE_T_MAX)
            return 0;
        out->shape[i] = (Py_ssize_t)t->shape[i];
    }
    Py_ssize_t size;
    if (t->strides == NULL) {
        if (c_strides(out->ndim, out->shape, dtype->itemsize, out->strides, &size) < 0)
            return 0;
    }
    else {
        for (int i = 0; i < t->ndim; i++)
            if (checked_mul((Py_ssize_t)t->strides[i], dtype->itemsize, &out->strides[i]) < 0)
                return 0;
    }
    out->ptr = (CUdeviceptr)(uintptr_t)t->data + (CUdeviceptr)t->byte_offset;
    out->contiguous = foreign_contiguous(out);
    return 1;
}

/* A torch tensor through torch.utils.dlpack.to_dlpack, one call that tells
 * pointer, shape, strides and device, and its dtype attribute: DLPack's
 * codes do not tell every torch dtype apart in every torch release, so the
 * dtype is torch's own. 1 filled; 0 read the attributes instead (a tensor
 * to_dlpack refuses, or one neither on a GPU nor on the host), with any
 * error left for reader_fallback. */
static int torch_read_dlpack(PyObject *obj, const torch_reads *t, mg_foreign *out)
{
    PyObject *value = plan_attr_read(&t->dtype, obj);
    mg_dtype *dtype;
    int found = value == NULL ? -1 : torch_dtype(value, &dtype);
    Py_XDECREF(value);
    if (found <= 0)
        return 0;
    PyObject *capsule = PyObject_CallOneArg(t->to_dlpack, obj);
    if (capsule == NULL)
        return 0;
    int status = 0;
    if (PyCapsule_IsValid(capsule, MG_DLPACK_NAME)) {
        DLManagedTensor *managed = PyCapsule_GetPointer(capsule, MG_DLPACK_NAME);
        status = dl_read(&managed->dl_tensor, dtype, out);
    }
    Py_DECREF(capsule);   /* never consumed: its destructor calls the tensor's deleter */
    return status;
}

/* A torch tensor: 1 filled; 0 take the slow path (not CUDA or CPU, a dtype
 * mlirgpu lacks, or anything unexpected, with the error cleared); -1 a
 * BaseException that must propagate. Torch's __cuda_array_interface__ is
 * version 2, without a stream: there is nothing to wait for, as there is
 * nothing when torch's own protocol is read.
 * A tensor whose type keeps torch's own __torch_function__ is read in one C
 * call through torch's DLPack exchange table; where torch has none, for a
 * signature, through to_dlpack and its dtype (a call and an attribute,
 * where its attributes take five). Otherwise through its attributes:
 * is_cuda, data_ptr(), and for a signature dtype, shape, is_contiguous()
 * (stride() only when it is not) and, where the process sees more than one
 * GPU, get_device(). */
static int torch_read(PyObject *obj, const torch_reads *t, mg_foreign *out, int full)
{
    PyObject *value = NULL;
    mg_dtype *dtype = NULL;
    long long number;
    int count;
    if (t->exchange != NULL) {
        DLTensor tensor;
        /* The tensor's shape and strides are torch's own: read before any Python code runs */
        if (t->exchange->dltensor_from_py_object_no_sync(obj, &tensor) == 0 &&
            dtype_from_dl(tensor.dtype, &dtype) == 0 && dl_read(&tensor, dtype, out))
            return 1;
        if (reader_fallback(out) < 0)
            return -1;
    }
    else if (full && t->to_dlpack != NULL) {
        if (torch_read_dlpack(obj, t, out))
            return 1;
        if (reader_fallback(out) < 0)
            return -1;
    }
    if ((value = plan_attr_read(&t->is_cuda, obj)) == NULL)
        goto fallback;
    if (value != Py_True) {
        /* meta, mps, xpu...: the slow path names what they are */
        Py_SETREF(value, plan_attr_read(&t->is_cpu, obj));
        if (value != Py_True)
            goto fallback;
        out->host = 1;
        if (!full)
            goto done;
    }
    if (read_int(obj, str_data_ptr, 1, &number) < 0)
        goto fallback;
    out->ptr = (CUdeviceptr)(unsigned long long)number;
    if (!full)
        goto done;
    Py_SETREF(value, plan_attr_read(&t->dtype, obj));
    if (value == NULL || torch_dtype(value, &dtype) <= 0)
        goto fallback;
    out->dtype = dtype;
    Py_SETREF(value, plan_attr_read(&t->shape, obj));
    if (value == NULL || read_ints(value, out->shape, &out->ndim) < 0)
        goto fallback;
    Py_SETREF(value, call_method(obj, str_is_contiguous));
    if (value == Py_True) {
        Py_ssize_t size;
        if (c_strides(out->ndim, out->shape, dtype->itemsize, out->strides, &size) < 0)
            goto fallback;
    }
    else {
        Py_SETREF(value, call_method(obj, str_stride));
        if (value == NULL || read_ints(value, out->strides, &count) < 0 || count != out->ndim)
            goto fallback;
        for (int i = 0; i < count; i++)
            if (checked_mul(out->strides[i], dtype->itemsize, &out->strides[i]) < 0)
                goto fallback;
    }
    if (!out->host && (out->device = mg_cu_sole_device()) < 0) {
        if (read_int(obj, str_get_device, 1, &number) < 0 || number < 0 || number > INT32_MAX)
            goto fallback;
        out->device = (int)number;
    }
    out->contiguous = foreign_contiguous(out);
done:
    Py_XDECREF(value);
    return 1;
fallback:
    Py_XDECREF(value);
    return reader_fallback(out);
}

/* The stream CuPy's __cuda_array_interface__ names: CuPy's current stream
 * (its CAI writes the legacy default stream where that is the null stream),
 * or none when CUDA_ARRAY_INTERFACE_EXPORT_VERSION is 2. Read once per call
 * (memo): every CuPy array of a call names the same stream. 0, or -1 to
 * take the slow path. */
static int cupy_stream(const cupy_reads *c, mg_foreign_memo *memo)
{
    if (memo->cupy_stream_read)
        return 0;
    long long version, handle;
    /* A plain module's attribute is its dict's entry: read there, without the lookup around it */
    PyObject *exported = c->settings_dict != NULL ? PyDict_GetItemWithError(c->settings_dict, str_export_version) : NULL;
    if (exported == NULL && PyErr_Occurred())
        return -1;
    if (take_int(exported != NULL ? Py_NewRef(exported) : PyObject_GetAttr(c->settings, str_export_version),
                 &version) < 0)
        return -1;
    memo->cupy_wait = version == 3;
    memo->cupy_stream = NULL;
    if (version == 3 && c->stream_ptr != NULL) {
        /* With one GPU, CuPy's current device is device 0: its stream there is the current
         * one, found without asking the CUDA runtime which device is current */
        intptr_t pointer = c->device_stream_ptr != NULL && mg_cu_sole_device() == 0 ? c->device_stream_ptr(0)
                                                                                     : c->stream_ptr();
        if (PyErr_Occurred())
            return -1;
        /* CuPy's null stream is the per-thread default stream where CuPy was told to use that */
        if (pointer == 0 && c->ptds())
            pointer = (intptr_t)CU_STREAM_PER_THREAD;
        memo->cupy_stream = (CUstream)pointer;
    }
    else if (version == 3) {
        PyObject *stream = PyObject_CallNoArgs(c->current_stream);
        if (stream == NULL)
            return -1;
        int status = read_int(stream, str_ptr, 0, &handle);
        Py_DECREF(stream);
        if (status < 0)
            return -1;
        memo->cupy_stream = (CUstream)(uintptr_t)handle;   /* 0 and 1: the legacy stream; 2: per-thread */
    }
    else if (version != 2) {
        return -1;   /* CuPy's CAI raises: the slow path says why */
    }
    memo->cupy_stream_read = 1;
    return 0;
}

/* The DType of `value`, a NumPy dtype read from an array: 0, or -1 (with
 * or without an error set) where it is no dtype or one mlirgpu lacks. The
 * dtype read last is kept (a strong reference: its address names no other
 * object while kept) with its DType, as launch after launch reads the same
 * one; a NumPy dtype never changes what dtype_from_descr reads. */
static PyObject *last_descr;
static mg_dtype *last_descr_dtype;

static int numpy_dtype(PyObject *value, mg_dtype **out)
{
    if (value == last_descr) {
        *out = last_descr_dtype;
        return 0;
    }
    if (!PyArray_DescrCheck(value) || dtype_from_descr((PyArray_Descr *)value, out) < 0)
        return -1;
    Py_XSETREF(last_descr, Py_NewRef(value));
    last_descr_dtype = *out;
    return 0;
}

/* A CuPy array: data.ptr and the stream, and for a signature dtype, shape
 * (a 1-D array's from len(), which makes no object, where the shape is a
 * tuple built on each read), _c_contiguous (strides only when not) and,
 * with more than one GPU, data.device_id, as the slow path would read them
 * from its __cuda_array_interface__. */
static int cupy_read(PyObject *obj, const cupy_reads *c, mg_foreign *out, int full, mg_foreign_memo *memo)
{
    PyObject *data, *value = NULL;
    long long number;
    int count;
    if ((data = plan_attr_read(&c->data, obj)) == NULL)
        goto fallback;
    /* A MemoryPointer, as CuPy's arrays have, is read as the plan found; anything else is looked up */
    const plan_attr *ptr = Py_IS_TYPE(data, c->pointer_type) && c->pointer_type->tp_version_tag == c->pointer_version
                         ? &c->ptr : NULL;
    if (take_int(ptr != NULL ? plan_attr_read(ptr, data) : get_attr(data, str_ptr), &number) < 0)
        goto fallback;
    out->ptr = (CUdeviceptr)(unsigned long long)number;
    if (full) {
        if ((out->device = mg_cu_sole_device()) < 0) {
            if (take_int(ptr != NULL ? plan_attr_read(&c->device_id, data) : get_attr(data, str_device_id),
                         &number) < 0 || number < 0 || number > INT32_MAX)
                goto fallback;
            out->device = (int)number;
        }
        if ((value = plan_attr_read(&c->dtype, obj)) == NULL || numpy_dtype(value, &out->dtype) < 0)
            goto fallback;
        if (take_int(plan_attr_read(&c->ndim, obj), &number) < 0)
            goto fallback;
        if (number == 1) {
            if ((out->shape[0] = PyObject_Length(obj)) < 0)
                goto fallback;
            out->ndim = 1;
        }
        else {
            Py_SETREF(value, plan_attr_read(&c->shape, obj));
            if (value == NULL || read_ints(value, out->shape, &out->ndim) < 0)
                goto fallback;
        }
        Py_SETREF(value, plan_attr_read(&c->c_contiguous, obj));
        if (value == Py_True) {
            Py_ssize_t size;
            if (out->ndim == 1)
                out->strides[0] = out->dtype->itemsize;
            else if (c_strides(out->ndim, out->shape, out->dtype->itemsize, out->strides, &size) < 0)
                goto fallback;
        }
        else {
            Py_SETREF(value, plan_attr_read(&c->strides, obj));
            if (value == NULL || read_ints(value, out->strides, &count) < 0 || count != out->ndim)
                goto fallback;
        }
        /* C strides are contiguous by construction */
        out->contiguous = value == Py_True || foreign_contiguous(out);
    }
    if (cupy_stream(c, memo) < 0)
        goto fallback;
    out->wait = memo->cupy_wait;
    out->producer = memo->cupy_stream;
    Py_DECREF(data);
    Py_XDECREF(value);
    return 1;
fallback:
    Py_XDECREF(data);
    Py_XDECREF(value);
    return reader_fallback(out);
}

/* Whether JAX exports its arrays read-only, which does not change within a
 * JAX version: read from the first array's __cuda_array_interface__ and
 * kept with the type (when the type is still in the table after that code
 * ran). 0 or 1; -1 to take the slow path. */
static int jax_readonly(PyObject *obj, reader_info *info)
{
    if (info->readonly >= 0)
        return info->readonly;
    PyObject *cai = PyObject_GetAttr(obj, str_cai);
    cai_fields f;
    int status = cai == NULL ? -1 : cai_parse(cai, &f);
    Py_XDECREF(cai);
    if (status < 0)
        return -1;
    info->readonly = f.readonly;
    for (int i = 0; i < TYPE_READERS; i++)
        if (type_readers[i].type == info->type && type_readers[i].version == info->type->tp_version_tag)
            type_readers[i].readonly = f.readonly;
    return f.readonly;
}

/* A JAX array never changes: once ready, its buffer, dtype, shape and
 * device stay what they are until it is deleted (delete(), or donating it
 * to a jitted function), which frees the buffer. What was read of the
 * arrays seen last is kept here, each entry with a weak reference to its
 * array, so that another object at the same address is never taken for it;
 * every launch still asks is_deleted(). */
typedef struct {
    PyObject *ref;             /* strong reference to a weak reference to the array; NULL: a free slot */
    unsigned int version;      /* the array type's tp_version_tag: a changed type is read anew */
    CUdeviceptr ptr;
    mg_dtype *dtype;           /* borrowed singleton */
    int ndim, device, readonly;
    Py_ssize_t shape[MG_MAX_NDIM];
} jax_memo;

#define JAX_MEMOS 64
static jax_memo jax_memos[JAX_MEMOS];

/* The first of the two entries where `obj` may be kept (the second is its
 * neighbour): a multiplicative hash of the address, as objects allocated
 * together lie at regular distances. */
static jax_memo *jax_memo_pair(PyObject *obj)
{
    uint64_t h = (uint64_t)(uintptr_t)obj * UINT64_C(0x9E3779B97F4A7C15);
    return &jax_memos[(h >> 58) & ~(uint64_t)1];
}

/* What `ref` refers to, NULL once that died: only compared, never used.
 * Runs no Python code. */
static PyObject *weak_target(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return NULL;
    }
    Py_XDECREF(target);   /* alive elsewhere: frees nothing */
    return target;
#else
    PyObject *target = PyWeakref_GET_OBJECT(ref);
    return target == Py_None ? NULL : target;
#endif
}

/* The entry that holds `obj`, or NULL. Runs no Python code. */
static const jax_memo *jax_memo_of(PyObject *obj)
{
    jax_memo *pair = jax_memo_pair(obj);
    for (int i = 0; i < 2; i++)
        if (pair[i].ref != NULL && pair[i].version != 0 && pair[i].version == Py_TYPE(obj)->tp_version_tag &&
            weak_target(pair[i].ref) == obj)
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
    jax_memo *pair = jax_memo_pair(obj), *m = &pair[0];
    for (int i = 1; i >= 0; i--)
        if (pair[i].ref == NULL || weak_target(pair[i].ref) == obj || weak_target(pair[i].ref) == NULL)
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
    PyObject *deleted = call_method(obj, str_is_deleted);
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
    if (reader_of(Py_TYPE(obj), &info) < 0)
        return -1;
    int jax = info.reader == READER_JAX;
    reader_info_release(&info);
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
        return c_strides(out->ndim, out->shape, out->dtype->itemsize, out->strides, &size) < 0 ? -1 : 1;
    }
    value = call_method(obj, str_is_ready);
    if (value == Py_False)
        Py_SETREF(value, call_method(obj, str_block_until_ready));
    else if (value != Py_True)
        goto fallback;
    if (value == NULL)
        goto fallback;
    /* (2, ordinal): kDLCUDA; the host (kDLCPU) and the rest take the protocol. */
    Py_SETREF(value, call_method(obj, str_dlpack_device));
    if (value == NULL || !PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 2 ||
        PyLong_AsLong(PyTuple_GET_ITEM(value, 0)) != 2)
        goto fallback;
    out->device = PyLong_AsLong(PyTuple_GET_ITEM(value, 1));
    if (out->device < 0 || PyErr_Occurred() || read_int(obj, str_unsafe_buffer_pointer, 1, &number) < 0)
        goto fallback;
    out->ptr = (CUdeviceptr)(unsigned long long)number;
    if ((out->readonly = jax_readonly(obj, info)) < 0 || (aval = PyObject_GetAttr(obj, str_aval)) == NULL)
        goto fallback;
    Py_SETREF(value, PyObject_GetAttr(aval, str_dtype_attr));
    if (value == NULL || numpy_dtype(value, &out->dtype) < 0)
        goto fallback;
    Py_SETREF(value, PyObject_GetAttr(aval, str_shape));
    if (value == NULL || read_ints(value, out->shape, &out->ndim) < 0 ||
        c_strides(out->ndim, out->shape, out->dtype->itemsize, out->strides, &size) < 0)
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
    return reader_fallback(out);
}

/* Any other __cuda_array_interface__, read from its dict
 * without building a view: the caller holds the object, which keeps the
 * memory alive, for as long as the pointer is used. 1, or -1. */
static int cai_read(PyObject *cai, mg_foreign *out, int full)
{
    cai_fields f;
    if (cai_parse(cai, &f) < 0)
        return -1;
    Py_ssize_t size;
    out->ptr = (CUdeviceptr)f.pointer;
    out->dtype = f.dtype;
    out->ndim = f.ndim;
    out->readonly = f.readonly;
    memcpy(out->shape, f.shape, (size_t)f.ndim * sizeof f.shape[0]);
    if (c_strides(f.ndim, f.shape, f.dtype->itemsize, out->strides, &size) < 0)
        return -1;
    if (f.has_strides)
        memcpy(out->strides, f.strides, (size_t)f.ndim * sizeof f.strides[0]);
    out->contiguous = foreign_contiguous(out);
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
    out->contiguous = is_c_contiguous(a);
}

static void fill_from_numpy(PyArrayObject *a, mg_foreign *out)
{
    out->host = 1;
    out->readonly = !PyArray_ISWRITEABLE(a);
    out->ptr = (CUdeviceptr)(uintptr_t)PyArray_DATA(a);
    out->contiguous = PyArray_IS_C_CONTIGUOUS(a);
    if (PyArray_NDIM(a) > MG_MAX_NDIM || dtype_from_descr(PyArray_DESCR(a), &out->dtype) < 0) {
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
    int known = known_reader(Py_TYPE(obj), &info) && info.reader != READER_GENERIC;
    if (library && !known) {
        reader_info_release(&info);
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
        reader_info_release(&info);
        if (PyObject_TypeCheck(obj, mg_array_type)) {
            fill_from_array((mg_array *)obj, out);
            return 1;
        }
        if (PyArray_Check(obj)) {
            fill_from_numpy((PyArrayObject *)obj, out);
            return 1;
        }
        if (reader_of(Py_TYPE(obj), &info) < 0)
            return -1;
    }
    int status = 0;
    if (info.reader == READER_TORCH)
        status = torch_read(obj, &info.reads->torch, out, full);
    else if (info.reader == READER_CUPY)
        status = cupy_read(obj, &info.reads->cupy, out, full, memo);
    else if (info.reader == READER_JAX)
        status = jax_read(obj, &info, out);
    reader_info_release(&info);
    if (status != 0)
        return status;
    /* The protocols, without asking for __cuda_array_interface__ twice:
     * producers such as torch build the dict anew on every access. */
    PyObject *cai = PyObject_GetAttr(obj, str_cai);
    if (cai != NULL && !cai_untyped(obj, cai)) {
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
        if (!PyObject_HasAttr(obj, str_dlpack))
            return 0;
    }
    PyObject *view = view_from_dlpack(obj);
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
    int found = descr != NULL && dtype_from_descr(descr, out) == 0;
    Py_XDECREF(descr);
    if (!found)
        PyErr_Clear();   /* complex, str, datetime...: not a scalar a kernel takes */
    return found;
}

/* ---------------------------------------------------------------------- */
/* Pinned host memory                                                      */
/* ---------------------------------------------------------------------- */

/* The base object of the NumPy arrays pinned_empty returns: NumPy frees it
 * with the last array (view) on the memory, and it frees the memory. */
typedef struct {
    PyObject_HEAD
    void *ptr;          /* from cuMemHostAlloc (portable: every context may use it) */
    Py_ssize_t nbytes;
    int device;         /* the device whose context allocated it, and frees it */
} mg_pinned;

static PyTypeObject *pinned_type;

static void pinned_dealloc(mg_pinned *self)
{
    PyTypeObject *type = Py_TYPE(self);
    mg_cu_free_host_quietly(self->ptr, self->device);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *pinned_get_ptr(mg_pinned *self, void *closure)
{
    return PyLong_FromVoidPtr(self->ptr);
}

static PyObject *pinned_repr(mg_pinned *self)
{
    return PyUnicode_FromFormat("<mlirgpu.PinnedMemory %zd bytes at %p>", self->nbytes, self->ptr);
}

static PyGetSetDef pinned_getset[] = {
    {"ptr", (getter)pinned_get_ptr, NULL, "The host address.", NULL},
    {NULL},
};

static PyMemberDef pinned_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(mg_pinned, nbytes), READONLY, NULL},
    {"device", T_INT, offsetof(mg_pinned, device), READONLY, "The device whose context allocated it."},
    {NULL},
};

static PyType_Slot pinned_slots[] = {
    {Py_tp_doc, "Page-locked host memory (cuMemHostAlloc): the base of an array from mlirgpu.pinned_empty; "
                "freed with cuMemFreeHost when the last array on it dies."},
    {Py_tp_dealloc, pinned_dealloc},
    {Py_tp_repr, pinned_repr},
    {Py_tp_getset, pinned_getset},
    {Py_tp_members, pinned_members},
    {0, NULL},
};

static PyType_Spec pinned_spec = {
    .name = "mlirgpu.PinnedMemory",
    .basicsize = sizeof(mg_pinned),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = pinned_slots,
};

/* pinned_empty/pinned_zeros: a NumPy array in page-locked memory. With
 * `host` (the CPU backend's), and for zero bytes, ordinary NumPy memory. */
static PyObject *pinned_allocate(PyObject *args, PyObject *kwargs, const char *format, int zero)
{
    static char *keywords[] = {"shape", "dtype", "host", NULL};
    PyObject *shape_obj;
    mg_dtype *dtype = dtypes[MG_DT_F32];
    int host = 0, ndim;
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM], size;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &shape_obj, mg_dtype_converter, &dtype, &host))
        return NULL;
    if (parse_shape(shape_obj, &ndim, shape) < 0 || c_strides(ndim, shape, dtype->itemsize, strides, &size) < 0)
        return NULL;
    PyArray_Descr *descr = (PyArray_Descr *)mg_dtype_numpy(dtype);
    if (descr == NULL)
        return NULL;
    size_t nbytes = (size_t)size * (size_t)dtype->itemsize;
    if (host || nbytes == 0)
        return zero ? PyArray_Zeros(ndim, shape, descr, 0) : PyArray_Empty(ndim, shape, descr, 0);   /* steal */
    mg_pinned *owner = NULL;
    void *memory = NULL;
    if (mg_cu_ensure_context() < 0 ||
        mg_cu_check(mg_cu.cuMemHostAlloc(&memory, nbytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc") < 0)
        goto error;
    owner = (mg_pinned *)pinned_type->tp_alloc(pinned_type, 0);
    if (owner == NULL) {
        mg_cu_free_host_quietly(memory, mg_cu_current_device());
        goto error;
    }
    owner->ptr = memory;
    owner->nbytes = (Py_ssize_t)nbytes;
    owner->device = mg_cu_current_device();
    if (zero)
        memset(memory, 0, nbytes);
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, shape, NULL, memory,
                                           NPY_ARRAY_CARRAY, NULL);   /* steals descr */
    descr = NULL;
    if (array == NULL) {
        Py_DECREF(owner);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)array, (PyObject *)owner) < 0) {   /* steals owner, even on failure */
        Py_DECREF(array);
        return NULL;
    }
    return array;
error:
    Py_XDECREF(descr);
    return NULL;
}

static PyObject *array_pinned_empty(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return pinned_allocate(args, kwargs, "O|O&$p:pinned_empty", 0);
}

static PyObject *array_pinned_zeros(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return pinned_allocate(args, kwargs, "O|O&$p:pinned_zeros", 1);
}

/* ---------------------------------------------------------------------- */
/* Views, copies and NumPy's habits: d[...], d.T, reshape, copy, fill      */
/* ---------------------------------------------------------------------- */

/* A view of `base`'s memory (same device, host flag and last-used stream),
 * keeping `base` alive. `strides` NULL: C-contiguous. */
static PyObject *array_view(mg_array *base, Py_ssize_t offset, int ndim, const Py_ssize_t *shape,
                            const Py_ssize_t *strides)
{
    mg_array *view = array_create(base->dtype, ndim, shape, strides);
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

/* d[i], d[a:b:c], d[i, ..., a:b]: basic indexing, as NumPy's, gives a view
 * (a 0-d one for as many ints as dimensions). */
static PyObject *array_subscript(mg_array *self, PyObject *key)
{
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
        else if (checked_mul(known, shape[i], &known) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    if (unknown >= 0)
        shape[unknown] = known == 0 ? 0 : self->size / known;
    Py_ssize_t size = 1;
    for (Py_ssize_t i = 0; i < n; i++)
        size *= shape[i];
    if (size != self->size)
        return mg_raise(PyExc_ValueError, "cannot reshape a DeviceArray of %zd elements into %zd elements",
                        self->size, size);
    if (!is_c_contiguous(self))
        return mg_raise(PyExc_ValueError, "reshape needs a C-contiguous DeviceArray: copy() the view first");
    return array_view(self, 0, (int)n, shape, NULL);
}

/* A new C-contiguous array with the same contents, in the same kind of memory. */
static PyObject *array_copy(mg_array *self, PyObject *unused)
{
    PyObject *copy = array_allocate(self->dtype, self->ndim, self->shape, Py_None, 0, self->host);
    if (copy == NULL || self->size == 0)
        return copy;
    PyObject *done;
    if (is_c_contiguous(self)) {
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
    if (!is_c_contiguous(self))
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
    {"get", (PyCFunction)(void (*)(void))array_get, METH_VARARGS | METH_KEYWORDS,
     "get(stream=None, blocking=True): a new numpy.ndarray with the contents. By default the copy "
     "is ordered on the stream that last used the array; blocking=False does not wait for it."},
    {"copy_to_host", (PyCFunction)(void (*)(void))array_copy_to_host, METH_VARARGS | METH_KEYWORDS,
     "copy_to_host(out, stream=None, blocking=True): copies into the numpy.ndarray `out` (same shape and "
     "dtype); returns out. blocking=False does not wait (C-contiguous arrays; truly asynchronous into "
     "pinned memory)."},
    {"copy_from_host", (PyCFunction)(void (*)(void))array_copy_from_host, METH_VARARGS | METH_KEYWORDS,
     "copy_from_host(src, stream=None): copies the numpy.ndarray `src` (same shape and dtype, both "
     "C-contiguous) into this array on `stream` (default: the array's last-used stream), not waited for."},
    {"to", (PyCFunction)(void (*)(void))array_to, METH_VARARGS | METH_KEYWORDS,
     "to(device, stream=None): the array on `device` (an ordinal or mlirgpu.cuda.Device): itself if it is "
     "there, else a copy made on `stream` (a stream of that device), peer to peer where the devices allow."},
    {"copy_from", (PyCFunction)(void (*)(void))array_copy_from, METH_VARARGS | METH_KEYWORDS,
     "copy_from(src, stream=None): copies the DeviceArray `src` (same shape and dtype, both C-contiguous, "
     "both in device or both in host memory) into this one; device to device on `stream`, not waited for."},
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None): a DLPack capsule."},
    {"copy", (PyCFunction)array_copy, METH_NOARGS,
     "copy(): a new C-contiguous DeviceArray with the same contents (a strided view is gathered)."},
    {"fill", (PyCFunction)array_fill, METH_O,
     "fill(value): sets every element of a C-contiguous array to `value`."},
    {"reshape", (PyCFunction)array_reshape, METH_VARARGS,
     "reshape(*shape): a view of a C-contiguous array with another shape; one extent may be -1."},
    {"__array__", (PyCFunction)(void (*)(void))array_array, METH_VARARGS | METH_KEYWORDS,
     "Refused: np.asarray(d) does not copy device memory; call d.get()."},
    {"__dlpack_device__", (PyCFunction)array_dlpack_device, METH_NOARGS,
     "(2, ordinal): kDLCUDA; (1, 0): kDLCPU for a host array (the CPU backend's)."},
    {NULL},
};

static PyGetSetDef array_getset[] = {
    {"shape", (getter)array_get_shape, NULL, NULL, NULL},
    {"strides", (getter)array_get_strides, NULL, "Strides in bytes, like NumPy.", NULL},
    {"dtype", (getter)array_get_dtype, NULL, NULL, NULL},
    {"nbytes", (getter)array_get_nbytes, NULL, NULL, NULL},
    {"ptr", (getter)array_get_ptr, NULL, "The address of the first element (a host address for a host array).", NULL},
    {"is_c_contiguous", (getter)array_get_contiguous, NULL, NULL, NULL},
    {"__cuda_array_interface__", (getter)array_get_cai, NULL,
     "Version 3; TypeError for bf16; AttributeError for a host array.", NULL},
    {"is_host", (getter)array_get_host, NULL, "True for host memory (a DeviceArray of the CPU backend).", NULL},
    {"readonly", (getter)array_get_readonly, NULL, "True for memory its producer exported read-only "
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
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_traverse, array_traverse},
    {Py_tp_clear, array_clear},
    {Py_tp_repr, array_repr},
    {Py_sq_length, array_length},
    {Py_mp_length, array_length},
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
    {"dtype", array_dtype_function, METH_O,
     "dtype(x): the mlirgpu dtype of a DType, numpy dtype, NumPy scalar type or name.\n\nFor example::\n\n"
     "    mg.dtype(np.float32)     # mlirgpu.f32\n"
     "    mg.dtype(\"float64\")      # mlirgpu.f64\n"
     "    mg.dtype(\"i8\")           # mlirgpu.i8 (mlirgpu's names give bits, not bytes)"},
    {"empty", (PyCFunction)(void (*)(void))array_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype=f32, stream=None, *, host=False): an uninitialized DeviceArray (host memory with "
     "host=True: the CPU backend's)."},
    {"zeros", (PyCFunction)(void (*)(void))array_zeros, METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype=f32, stream=None, *, host=False): a DeviceArray of zeros (set on `stream`)."},
    {"to_device", (PyCFunction)(void (*)(void))array_to_device, METH_VARARGS | METH_KEYWORDS,
     "to_device(array, stream=None, *, host=False): a DeviceArray copy of a NumPy array or array-like."},
    {"pinned_empty", (PyCFunction)(void (*)(void))array_pinned_empty, METH_VARARGS | METH_KEYWORDS,
     "pinned_empty(shape, dtype=f32, *, host=False): an uninitialized numpy.ndarray in page-locked host "
     "memory (cuMemHostAlloc, portable), freed when the last array on it dies; ordinary memory with "
     "host=True (the CPU backend's) or for zero bytes."},
    {"pinned_zeros", (PyCFunction)(void (*)(void))array_pinned_zeros, METH_VARARGS | METH_KEYWORDS,
     "pinned_zeros(shape, dtype=f32, *, host=False): pinned_empty filled with zeros."},
    {"asarray", (PyCFunction)(void (*)(void))array_asarray_function, METH_VARARGS | METH_KEYWORDS,
     "asarray(obj, *, host=False): obj itself if a DeviceArray, else a zero-copy view of a "
     "__cuda_array_interface__ or CUDA __dlpack__ object; with host=True, of a host __dlpack__ object."},
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
    if (intern(&str_cai, "__cuda_array_interface__") < 0 || intern(&str_dlpack, "__dlpack__") < 0 ||
        intern(&str_dlpack_device, "__dlpack_device__") < 0 ||
        intern(&str_array_interface, "__array_interface__") < 0 || intern(&str_array, "__array__") < 0 ||
        intern(&str_is_cuda, "is_cuda") < 0 || intern(&str_is_cpu, "is_cpu") < 0 ||
        intern(&str_data_ptr, "data_ptr") < 0 || intern(&str_dtype_attr, "dtype") < 0 ||
        intern(&str_shape, "shape") < 0 || intern(&str_stride, "stride") < 0 ||
        intern(&str_get_device, "get_device") < 0 || intern(&str_module, "__module__") < 0 ||
        intern(&str_is_contiguous, "is_contiguous") < 0 || intern(&str_data, "data") < 0 ||
        intern(&str_ptr, "ptr") < 0 || intern(&str_device_id, "device_id") < 0 ||
        intern(&str_c_contiguous, "_c_contiguous") < 0 || intern(&str_strides, "strides") < 0 ||
        intern(&str_get_current_stream, "get_current_stream") < 0 ||
        intern(&str_export_version, "CUDA_ARRAY_INTERFACE_EXPORT_VERSION") < 0 ||
        intern(&str_cupy_cuda, "cupy.cuda") < 0 || intern(&str_cupy_util, "cupy._util") < 0 ||
        intern(&str_is_ready, "is_ready") < 0 || intern(&str_block_until_ready, "block_until_ready") < 0 ||
        intern(&str_unsafe_buffer_pointer, "unsafe_buffer_pointer") < 0 ||
        intern(&str_is_deleted, "is_deleted") < 0 || intern(&str_aval, "aval") < 0 ||
        intern(&str_ndim, "ndim") < 0 ||
        intern(&str_torch_function, "__torch_function__") < 0 ||
        intern(&str_torch_dispatch, "__torch_dispatch__") < 0 || intern(&str_torch_c, "torch._C") < 0 ||
        intern(&str_disabled_torch_function, "_disabled_torch_function_impl") < 0 ||
        intern(&str_torch_utils_dlpack, "torch.utils.dlpack") < 0 || intern(&str_to_dlpack, "to_dlpack") < 0 ||
        intern(&str_dlpack_exchange, "__dlpack_c_exchange_api__") < 0 ||
        intern(&str_pyx_capi, "__pyx_capi__") < 0 || intern(&str_cupy_backends_stream, "cupy_backends.cuda.stream") < 0 ||
        intern(&str_get_current_stream_ptr, "get_current_stream_ptr") < 0 ||
        intern(&str_get_stream_ptr, "get_stream_ptr") < 0 ||
        intern(&str_is_ptds_enabled, "is_ptds_enabled") < 0 || intern(&str_memory_pointer, "MemoryPointer") < 0)
        return -1;
    if ((torch_dtypes = PyDict_New()) == NULL)
        return -1;
    if ((mg_DType_type = mg_add_type(module, &dtype_spec, NULL)) == NULL ||
        (mg_array_type = mg_add_type(module, &array_spec, NULL)) == NULL ||
        (pinned_type = mg_add_type(module, &pinned_spec, NULL)) == NULL)
        return -1;
    for (int id = 0; id < MG_DT_COUNT; id++) {
        mg_dtype *dt = (mg_dtype *)mg_DType_type->tp_alloc(mg_DType_type, 0);
        if (dt == NULL)
            return -1;
        dt->id = (mg_dtype_id)id;
        dt->name = dtype_table[id].name;
        dt->itemsize = dtype_table[id].itemsize;
        dt->kind = dtype_table[id].kind;
        dt->dlpack_code = dtype_table[id].dlpack_code;
        dt->bits = (uint8_t)(8 * dtype_table[id].itemsize);
        dt->typestr = dtype_table[id].typestr;
        dt->npy_type = dtype_table[id].npy_type;
        dt->hash = -1;
        dtypes[id] = dt;
        if (PyModule_AddObjectRef(module, dt->name, (PyObject *)dt) < 0)
            return -1;
    }
    return PyModule_AddFunctions(module, array_functions);
}
