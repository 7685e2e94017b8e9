/* mlirgpu.ir.Attribute: its constructors, the typed ones and the affine
 * maps and layouts. */
#include "mlir/ir.h"
#include "mlir/ir_shared.h"

#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Support.h>
#include <llvm-c/ErrorHandling.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
/* The `type=` of a typed attribute constructor, or `fallback` in ctx. */
static mg_ir_Value_like *attr_type_arg(PyObject *arg, mg_ir_Context **ctx, PyObject *ctxarg)
{
    *ctx = NULL;
    if (arg != NULL && arg != Py_None) {
        mg_ir_Value_like *t = mg_ir_uniqued_arg(arg, mg_ir_TypeType, NULL, "type");
        if (t != NULL)
            *ctx = t->context;
        return t;
    }
    *ctx = mg_ir_context_arg(ctxarg);
    return NULL;
}

/* Whether `value` is representable in `type`: signed and unsigned types by
 * their range, signless ones by either reading of their bits. */
static int integer_fits(PyObject *value, MlirType type)
{
    unsigned width = mlirTypeIsAIndex(type) ? 64 : mlirIntegerTypeGetWidth(type);
    if (width > 64) /* MLIR's C API takes a 64-bit value: any that fits is fine */
        width = 64;
    int is_signed = mlirTypeIsAInteger(type) && mlirIntegerTypeIsSigned(type);
    int is_unsigned = mlirTypeIsAInteger(type) && mlirIntegerTypeIsUnsigned(type);
    PyObject *lo = NULL, *hi = NULL, *one = PyLong_FromLong(1), *shift = PyLong_FromLong(width - 1);
    int rc = -1;
    if (one == NULL || shift == NULL)
        goto done;
    PyObject *half = PyNumber_Lshift(one, shift); /* 2**(width-1) */
    if (half == NULL)
        goto done;
    lo = is_unsigned ? PyLong_FromLong(0) : PyNumber_Negative(half);
    PyObject *full = PyNumber_Add(half, half);    /* 2**width */
    hi = full ? PyNumber_Subtract(is_signed ? half : full, one) : NULL;
    Py_XDECREF(full);
    Py_DECREF(half);
    if (lo == NULL || hi == NULL)
        goto done;
    int below = PyObject_RichCompareBool(value, lo, Py_LT), above = PyObject_RichCompareBool(value, hi, Py_GT);
    if (below < 0 || above < 0)
        goto done;
    if (below || above) {
        mg_buf name = {0};
        mlirTypePrint(type, mg_buf_callback, &name);
        PyObject *typename = mg_buf_finish(&name);
        if (typename != NULL) {
            PyErr_Format(PyExc_OverflowError, "%R does not fit in %U (range %R..%R)", value, typename, lo, hi);
            Py_DECREF(typename);
        }
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    Py_XDECREF(one);
    Py_XDECREF(shift);
    return rc;
}

static PyObject *Attribute_integer(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"value", "type", "context", NULL};
    PyObject *value, *typearg = NULL, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|O$O:Attribute.integer", kwlist, &PyLong_Type, &value,
                                     &typearg, &ctxarg))
        return NULL;
    mg_ir_Context *ctx;
    mg_ir_Value_like *t = attr_type_arg(typearg, &ctx, ctxarg);
    if (ctx == NULL || PyErr_Occurred())
        return NULL;
    MlirType type = t ? t->h.type : mlirIntegerTypeGet(ctx->context, 64);
    /* IntegerAttr of a non-integer type is undefined behaviour in MLIR. */
    if (!mlirTypeIsAInteger(type) && !mlirTypeIsAIndex(type))
        return mg_raise(PyExc_TypeError, "an integer attribute needs an integer or index type");
    if (integer_fits(value, type) < 0)
        return NULL;
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        v = (long long)PyLong_AsUnsignedLongLong(value); /* checked to fit above */
    }
    return wrap_attribute(ctx, mlirIntegerAttrGet(type, v));
}

static PyObject *Attribute_float(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"value", "type", "context", NULL};
    double value;
    PyObject *typearg = NULL, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d|O$O:Attribute.float", kwlist, &value, &typearg, &ctxarg))
        return NULL;
    mg_ir_Context *ctx;
    mg_ir_Value_like *t = attr_type_arg(typearg, &ctx, ctxarg);
    if (ctx == NULL || PyErr_Occurred())
        return NULL;
    MlirType type = t ? t->h.type : mlirF64TypeGet(ctx->context);
    mg_ir_diag_clear(ctx);
    MlirAttribute a = mlirFloatAttrDoubleGetChecked(mlirLocationUnknownGet(ctx->context), type, value);
    if (mg_ir_diag_check(ctx, mlirAttributeIsNull(a), "invalid float attribute") < 0)
        return NULL;
    return wrap_attribute(ctx, a);
}

static PyObject *Attribute_string(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"value", "context", NULL};
    PyObject *value, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$O:Attribute.string", kwlist, &value, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    MlirStringRef ref = mg_ir_string_ref(value, "value");
    if (ctx == NULL || ref.data == NULL)
        return NULL;
    return wrap_attribute(ctx, mlirStringAttrGet(ctx->context, ref));
}

static PyObject *Attribute_symbol_ref(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "context", NULL};
    PyObject *value, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$O:Attribute.symbol_ref", kwlist, &value, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    MlirStringRef ref = mg_ir_string_ref(value, "name");
    if (ctx == NULL || ref.data == NULL)
        return NULL;
    return wrap_attribute(ctx, mlirFlatSymbolRefAttrGet(ctx->context, ref));
}

static PyObject *Attribute_bool(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"value", "context", NULL};
    int value;
    PyObject *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "p|$O:Attribute.bool", kwlist, &value, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    return ctx ? wrap_attribute(ctx, mlirBoolAttrGet(ctx->context, value)) : NULL;
}

static PyObject *Attribute_unit(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"context", NULL};
    PyObject *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$O:Attribute.unit", kwlist, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    return ctx ? wrap_attribute(ctx, mlirUnitAttrGet(ctx->context)) : NULL;
}

static PyObject *Attribute_type_attr(PyObject *cls, PyObject *arg)
{
    mg_ir_Value_like *t = mg_ir_uniqued_arg(arg, mg_ir_TypeType, NULL, "type");
    return t ? wrap_attribute(t->context, mlirTypeAttrGet(t->h.type)) : NULL;
}

static PyObject *Attribute_array(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"elements", "context", NULL};
    PyObject *seq, *ctxarg = NULL;
    const void **items;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Attribute.array", kwlist, &seq, &ctxarg) ||
        mg_ir_own_items(&seq, "expected a sequence") < 0)
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    PyObject *r = NULL;
    if (ctx != NULL && mg_ir_uniqued_seq(seq, mg_ir_AttributeType, ctx, "array element", &items, &n) == 0) {
        r = wrap_attribute(ctx, mlirArrayAttrGet(ctx->context, n, (MlirAttribute *)items));
        PyMem_Free(items);
    }
    Py_DECREF(seq);
    return r;
}

/* Named attributes from a {str: Attribute} mapping; *out freed by caller. */
int mg_ir_named_attributes(PyObject *mapping, mg_ir_Context *ctx, MlirNamedAttribute **out, Py_ssize_t *n)
{
    *out = NULL;
    *n = 0;
    if (mapping == NULL || mapping == Py_None)
        return 0;
    if (!PyDict_Check(mapping)) {
        PyErr_Format(PyExc_TypeError, "attributes must be a dict of str to Attribute, not %.100s",
                     Py_TYPE(mapping)->tp_name);
        return -1;
    }
    MlirNamedAttribute *named = PyMem_Calloc((size_t)PyDict_GET_SIZE(mapping) + 1, sizeof *named);
    if (named == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(mapping, &pos, &key, &value)) {
        MlirStringRef name = mg_ir_string_ref(key, "attribute name");
        mg_ir_Value_like *a = name.data ? mg_ir_uniqued_arg(value, mg_ir_AttributeType, ctx, "attribute value") : NULL;
        if (a == NULL) {
            PyMem_Free(named);
            return -1;
        }
        named[i++] = mlirNamedAttributeGet(mlirIdentifierGet(ctx->context, name), a->h.attr);
    }
    *out = named;
    *n = i;
    return 0;
}

static PyObject *Attribute_dictionary(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"elements", "context", NULL};
    PyObject *mapping, *ctxarg = NULL;
    MlirNamedAttribute *named;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Attribute.dictionary", kwlist, &mapping, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL || mg_ir_named_attributes(mapping, ctx, &named, &n) < 0)
        return NULL;
    PyObject *r = wrap_attribute(ctx, mlirDictionaryAttrGet(ctx->context, n, named));
    PyMem_Free(named);
    return r;
}

static PyObject *dense_array(PyObject *args, PyObject *kwds, int bits)
{
    static char *kwlist[] = {"values", "context", NULL};
    PyObject *seq, *ctxarg = NULL, *r = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Attribute.dense_array", kwlist, &seq, &ctxarg))
        return NULL;
    /* The items first: iterating runs Python code, which may free the current Context. */
    PyObject *fast = PySequence_Fast(seq, "values must be a sequence of ints");
    if (fast == NULL)
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *vals = PyMem_Calloc((size_t)n + 1, sizeof *vals);
    int32_t *vals32 = PyMem_Calloc((size_t)n + 1, sizeof *vals32);
    if (vals == NULL || vals32 == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyLong_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "values must be ints");
            goto error;
        }
        vals[i] = PyLong_AsLongLong(item);
        if (vals[i] == -1 && PyErr_Occurred())
            goto error;
        if (bits == 32 && (vals[i] < INT32_MIN || vals[i] > INT32_MAX)) {
            PyErr_SetString(PyExc_OverflowError, "value does not fit in 32 bits");
            goto error;
        }
        vals32[i] = (int32_t)vals[i];
    }
    r = wrap_attribute(ctx, bits == 32 ? mlirDenseI32ArrayGet(ctx->context, n, vals32)
                                       : mlirDenseI64ArrayGet(ctx->context, n, vals));
error:
    PyMem_Free(vals);
    PyMem_Free(vals32);
    Py_DECREF(fast);
    return r;
}

static PyObject *Attribute_dense_i32_array(PyObject *cls, PyObject *args, PyObject *kwds)
{
    return dense_array(args, kwds, 32);
}

static PyObject *Attribute_dense_i64_array(PyObject *cls, PyObject *args, PyObject *kwds)
{
    return dense_array(args, kwds, 64);
}

/* Attribute.strided_layout(offset, strides): #strided<[...], offset: ...>, None for a dynamic entry. */
static PyObject *Attribute_strided_layout(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offset", "strides", "context", NULL};
    PyObject *offsetarg, *seq, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|$O:Attribute.strided_layout", kwlist, &offsetarg, &seq, &ctxarg))
        return NULL;
    int64_t dynamic = mlirShapedTypeGetDynamicStrideOrOffset(), offset = dynamic;
    if (offsetarg != Py_None) {
        if (!PyLong_Check(offsetarg))
            return mg_raise(PyExc_TypeError, "offset must be an int or None, not %.100s", Py_TYPE(offsetarg)->tp_name);
        if ((offset = PyLong_AsLongLong(offsetarg)) == -1 && PyErr_Occurred())
            return NULL;
    }
    /* The items first: iterating runs Python code, which may free the current Context. */
    PyObject *fast = PySequence_Fast(seq, "strides must be a sequence of ints or None");
    if (fast == NULL)
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *strides = PyMem_Calloc((size_t)n + 1, sizeof *strides);
    PyObject *r = NULL;
    if (strides == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (item == Py_None) {
            strides[i] = dynamic;
        } else if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "strides must be ints or None, not %.100s", Py_TYPE(item)->tp_name);
            goto done;
        } else if ((strides[i] = PyLong_AsLongLong(item)) == -1 && PyErr_Occurred()) {
            goto done;
        }
    }
    r = wrap_attribute(ctx, mlirStridedLayoutAttrGet(ctx->context, offset, n, strides));
done:
    PyMem_Free(strides);
    Py_DECREF(fast);
    return r;
}

/* Attribute.identity_map(rank): affine_map<(d0, ..., dn) -> (d0, ..., dn)>. */
static PyObject *Attribute_identity_map(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rank", "context", NULL};
    Py_ssize_t rank;
    PyObject *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|$O:Attribute.identity_map", kwlist, &rank, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL)
        return NULL;
    if (rank < 0)
        return mg_raise(PyExc_ValueError, "rank must be >= 0, got %zd", rank);
    return wrap_attribute(ctx, mlirAffineMapAttrGet(mlirAffineMapMultiDimIdentityGet(ctx->context, rank)));
}

/* Attribute.permutation_map(permutation): affine_map<(d0, ..., dn) -> (d_p0, ..., d_pn)>. */
static PyObject *Attribute_permutation_map(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"permutation", "context", NULL};
    PyObject *seq, *ctxarg = NULL, *r = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Attribute.permutation_map", kwlist, &seq, &ctxarg))
        return NULL;
    /* The items first: iterating runs Python code, which may free the current Context. */
    PyObject *fast = PySequence_Fast(seq, "permutation must be a sequence of ints");
    if (fast == NULL)
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    unsigned *permutation = PyMem_Calloc((size_t)n + 1, sizeof *permutation);
    char *seen = PyMem_Calloc((size_t)n + 1, 1);
    if (permutation == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "permutation entries must be ints, not %.100s", Py_TYPE(item)->tp_name);
            goto done;
        }
        Py_ssize_t v = PyLong_AsSsize_t(item);
        if (v == -1 && PyErr_Occurred())
            goto done;
        if (v < 0 || v >= n || seen[v]) {
            PyErr_SetString(PyExc_ValueError, "permutation must hold each of 0 .. len - 1 once");
            goto done;
        }
        seen[v] = 1;
        permutation[i] = (unsigned)v;
    }
    r = wrap_attribute(ctx, mlirAffineMapAttrGet(mlirAffineMapPermutationGet(ctx->context, n, permutation)));
done:
    PyMem_Free(permutation);
    PyMem_Free(seen);
    Py_DECREF(fast);
    return r;
}

static PyObject *Attribute_str(mg_ir_Value_like *self)
{
    mg_buf buf = {0};
    mlirAttributePrint(self->h.attr, mg_buf_callback, &buf);
    return mg_buf_finish(&buf);
}

static PyObject *Attribute_get_type(mg_ir_Value_like *self, void *c)
{
    MlirType t = mlirAttributeGetType(self->h.attr);
    if (mlirTypeIsNull(t) || mlirTypeIsANone(t))
        Py_RETURN_NONE;
    return wrap_type(self->context, t);
}

static PyObject *array_element(void *self, intptr_t i)
{
    mg_ir_Value_like *a = self;
    return wrap_attribute(a->context, mlirArrayAttrGetElement(a->h.attr, i));
}

static PyObject *dense_element(void *self, intptr_t i)
{
    MlirAttribute a = ((mg_ir_Value_like *)self)->h.attr;
    return PyLong_FromLongLong(mlirAttributeIsADenseI32Array(a) ? mlirDenseI32ArrayGetElement(a, i)
                                                                : mlirDenseI64ArrayGetElement(a, i));
}

static PyObject *Attribute_get_value(mg_ir_Value_like *self, void *c)
{
    MlirAttribute a = self->h.attr;
    if (mlirAttributeIsABool(a))
        return PyBool_FromLong(mlirBoolAttrGetValue(a));
    if (mlirAttributeIsAInteger(a)) {
        MlirType t = mlirAttributeGetType(a);
        if (mlirTypeIsAInteger(t) && mlirIntegerTypeGetWidth(t) > 64)
            return mg_raise(PyExc_TypeError, "integer attributes wider than 64 bits have no Python value here");
        if (mlirTypeIsAInteger(t) && mlirIntegerTypeIsUnsigned(t))
            return PyLong_FromUnsignedLongLong(mlirIntegerAttrGetValueUInt(a));
        if (mlirTypeIsAInteger(t) && mlirIntegerTypeIsSigned(t))
            return PyLong_FromLongLong(mlirIntegerAttrGetValueSInt(a));
        return PyLong_FromLongLong(mlirIntegerAttrGetValueInt(a));
    }
    if (mlirAttributeIsAFloat(a))
        return PyFloat_FromDouble(mlirFloatAttrGetValueDouble(a));
    if (mlirAttributeIsAString(a))
        return mg_ir_str(mlirStringAttrGetValue(a));
    if (mlirAttributeIsAFlatSymbolRef(a))
        return mg_ir_str(mlirFlatSymbolRefAttrGetValue(a));
    if (mlirAttributeIsAType(a))
        return wrap_type(self->context, mlirTypeAttrGetValue(a));
    if (mlirAttributeIsAUnit(a))
        Py_RETURN_TRUE;
    if (mlirAttributeIsAArray(a))
        return mg_ir_list_of(mlirArrayAttrGetNumElements(a), array_element, self);
    if (mlirAttributeIsADictionary(a)) {
        PyObject *dict = PyDict_New();
        intptr_t n = mlirDictionaryAttrGetNumElements(a);
        for (intptr_t i = 0; dict != NULL && i < n; i++) {
            MlirNamedAttribute na = mlirDictionaryAttrGetElement(a, i);
            PyObject *key = mg_ir_str(mlirIdentifierStr(na.name));
            PyObject *val = key ? wrap_attribute(self->context, na.attribute) : NULL;
            if (val == NULL || PyDict_SetItem(dict, key, val) < 0)
                Py_CLEAR(dict);
            Py_XDECREF(key);
            Py_XDECREF(val);
        }
        return dict;
    }
    if (mlirAttributeIsADenseI32Array(a) || mlirAttributeIsADenseI64Array(a))
        return mg_ir_list_of(mlirDenseArrayGetNumElements(a), dense_element, self);
    return mg_raise(PyExc_TypeError, "this kind of attribute has no Python value; use str()");
}

static PyMethodDef Attribute_methods[] = {
    {"parse", (PyCFunction)(void (*)(void))mg_ir_Attribute_parse, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.parse(text, *, context=None): MLIRError with the diagnostics on bad text."},
    {"integer", (PyCFunction)(void (*)(void))Attribute_integer, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.integer(value, type=i64, *, context=None)"},
    {"float", (PyCFunction)(void (*)(void))Attribute_float, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.float(value, type=f64, *, context=None)"},
    {"string", (PyCFunction)(void (*)(void))Attribute_string, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"symbol_ref", (PyCFunction)(void (*)(void))Attribute_symbol_ref, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.symbol_ref(name): a flat symbol reference @name."},
    {"bool", (PyCFunction)(void (*)(void))Attribute_bool, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"unit", (PyCFunction)(void (*)(void))Attribute_unit, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"type_attr", (PyCFunction)Attribute_type_attr, METH_O | METH_CLASS, "Attribute.type_attr(t): a TypeAttr."},
    {"array", (PyCFunction)(void (*)(void))Attribute_array, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"dictionary", (PyCFunction)(void (*)(void))Attribute_dictionary, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     NULL},
    {"dense_i32_array", (PyCFunction)(void (*)(void))Attribute_dense_i32_array,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS, "e.g. operandSegmentSizes"},
    {"dense_i64_array", (PyCFunction)(void (*)(void))Attribute_dense_i64_array,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"strided_layout", (PyCFunction)(void (*)(void))Attribute_strided_layout, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.strided_layout(offset, strides, *, context=None): a memref layout #strided<[strides], "
     "offset: offset>; None is a dynamic stride or offset (?)."},
    {"identity_map", (PyCFunction)(void (*)(void))Attribute_identity_map, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.identity_map(rank, *, context=None): affine_map<(d0, ..., dn) -> (d0, ..., dn)>."},
    {"permutation_map", (PyCFunction)(void (*)(void))Attribute_permutation_map,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Attribute.permutation_map(permutation, *, context=None): affine_map<(d0, ..., dn) -> (d_p0, ..., d_pn)>."},
    {NULL},
};

static PyGetSetDef Attribute_getset[] = {
    {"context", (getter)mg_ir_uniqued_get_context, NULL, NULL, NULL},
    {"type", (getter)Attribute_get_type, NULL, "The type of a typed attribute, else None.", NULL},
    {"value", (getter)Attribute_get_value, NULL,
     "The Python value of an integer, float, bool, string, symbol, type, unit, array, "
     "dictionary or dense array attribute.", NULL},
    {NULL},
};

static PyType_Slot Attribute_slots[] = {
    {Py_tp_doc, "An MLIR attribute, uniqued in its Context."},
    {Py_tp_dealloc, mg_ir_uniqued_dealloc},
    {Py_tp_hash, mg_ir_uniqued_hash},
    {Py_tp_richcompare, mg_ir_uniqued_richcompare},
    {Py_tp_str, Attribute_str},
    {Py_tp_repr, mg_ir_uniqued_repr},
    {Py_tp_methods, Attribute_methods},
    {Py_tp_getset, Attribute_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Attribute_spec = {"mlirgpu.ir.Attribute", sizeof(mg_ir_Value_like), 0,
                                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                     Attribute_slots};

