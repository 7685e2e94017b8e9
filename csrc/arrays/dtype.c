/* mlirgpu.DType: the element types' singletons, dtype(), the converter
 * every area uses, and the shape and stride arithmetic of arrays. */
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
/* DType                                                                   */
/* ---------------------------------------------------------------------- */

PyTypeObject *mg_DType_type;
PyTypeObject *mg_array_type;

/* The singletons; the attribute name doubles as DType.name. Typestrs
 * assume a little-endian host, as every CUDA host is. */
const mg_arrays_dtype_table_entry mg_arrays_dtype_table[MG_DT_COUNT] = {
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

mg_dtype *mg_arrays_dtypes[MG_DT_COUNT];   /* strong refs, for the life of the process */
static PyObject *ml_dtypes_descrs[MG_DT_COUNT];   /* ml_dtypes' NumPy dtypes, once imported */

mg_dtype *mg_dtype_get(mg_dtype_id id)
{
    return mg_arrays_dtypes[id];
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
        PyObject *type = PyObject_GetAttrString(ml_dtypes, mg_arrays_dtype_table[dt->id].ml_dtypes_name);
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
int mg_arrays_dtype_from_descr(PyArray_Descr *descr, mg_dtype **out)
{
    Py_ssize_t size = PyDataType_ELSIZE(descr);
    int id = -1;
    /* ml_dtypes' types (registered with NumPy as user types) are named after
     * the type (bfloat16, float8_e4m3fn...); their kind is V, or f for some
     * (float8_e5m2). */
    for (int i = 0; i < MG_DT_COUNT && descr->type_num >= NPY_USERDEF && PyArray_ISNBO(descr->byteorder); i++)
        if (mg_arrays_dtype_table[i].ml_dtypes_name != NULL && size == mg_arrays_dtype_table[i].itemsize &&
            ends_with(descr->typeobj->tp_name, mg_arrays_dtype_table[i].ml_dtypes_name))
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
    *out = mg_arrays_dtypes[id];
    return 0;
}

static int dtype_from_string(PyObject *text, mg_dtype **out)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (PyUnicode_CompareWithASCIIString(text, dtype_names[i].name) == 0) {
            *out = mg_arrays_dtypes[dtype_names[i].id];
            return 0;
        }
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(text, &descr) || mg_arrays_dtype_from_descr(descr, out) < 0) {
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
        return mg_arrays_dtype_from_descr((PyArray_Descr *)obj, out) == 0;
    if (PyType_Check(obj)) {
        /* numpy.float32, float, ml_dtypes.bfloat16...: NumPy reads the type. */
        PyArray_Descr *descr = NULL;
        if (!PyArray_DescrConverter(obj, &descr))
            return 0;
        int status = mg_arrays_dtype_from_descr(descr, out);
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

PyType_Spec mg_arrays_dtype_spec = {
    .name = "mlirgpu.DType",
    .basicsize = sizeof(mg_dtype),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = dtype_slots,
};

PyObject *mg_arrays_array_dtype_function(PyObject *module, PyObject *obj)
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
int mg_arrays_checked_mul(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out)
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
int mg_arrays_parse_shape(PyObject *obj, int *ndim, Py_ssize_t shape[MG_MAX_NDIM])
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
int mg_arrays_c_strides(int ndim, const Py_ssize_t *shape, int itemsize, Py_ssize_t *strides, Py_ssize_t *size)
{
    Py_ssize_t step = itemsize, count = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = step;
        if (mg_arrays_checked_mul(step, shape[i] ? shape[i] : 1, &step) < 0 || mg_arrays_checked_mul(count, shape[i], &count) < 0) {
            PyErr_SetString(PyExc_ValueError, "array is too large");
            return -1;
        }
    }
    *size = count;
    return 0;
}

/* The byte range [lo, hi) a strided layout touches, relative to its first
 * element; ValueError on overflow. Only meaningful for size > 0. */
int mg_arrays_byte_extent(const mg_array *a, Py_ssize_t *lo, Py_ssize_t *hi)
{
    Py_ssize_t low = 0, high = a->dtype->itemsize, step;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] == 0)
            continue;
        if (mg_arrays_checked_mul(a->shape[i] - 1, a->strides[i], &step) < 0)
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

int mg_arrays_is_c_contiguous(const mg_array *a)
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
    return mg_arrays_is_c_contiguous((mg_array *)obj);
}

