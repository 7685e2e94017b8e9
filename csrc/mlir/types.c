/* mlirgpu.ir.Location and mlirgpu.ir.Type: uniqued values that hold their
 * Context. */
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
/* ===================================================================== */
/* Location, Type, Attribute: uniqued values that hold their Context      */
/* ===================================================================== */


PyObject *mg_ir_uniqued_new(PyTypeObject *type, mg_ir_Context *ctx, const void *ptr)
{
    mg_ir_Value_like *self = PyObject_New(mg_ir_Value_like, type);
    if (self == NULL)
        return NULL;
    self->h.ptr = ptr;
    self->context = (mg_ir_Context *)Py_NewRef(ctx);
    return (PyObject *)self;
}


void mg_ir_uniqued_dealloc(mg_ir_Value_like *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(self->context);
    PyObject_Free(self);
    Py_DECREF(type);
}

Py_hash_t mg_ir_uniqued_hash(mg_ir_Value_like *self) { return _Py_HashPointer(self->h.ptr); }

PyObject *mg_ir_uniqued_richcompare(mg_ir_Value_like *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
        Py_RETURN_NOTIMPLEMENTED;
    /* Uniqued in their context: equal handles mean equal values. */
    int eq = self->h.ptr == ((mg_ir_Value_like *)other)->h.ptr;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

PyObject *mg_ir_uniqued_get_context(mg_ir_Value_like *self, void *c) { return Py_NewRef(self->context); }

/* Type(f32), Attribute(3 : i32), Location(loc("a.py":3:0)) */
PyObject *mg_ir_uniqued_repr(PyObject *self)
{
    PyObject *text = PyObject_Str(self);
    if (text == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("%s(%U)", strrchr(Py_TYPE(self)->tp_name, '.') + 1, text);
    Py_DECREF(text);
    return r;
}

/* Checks that `obj` is of `type` and belongs to `ctx`; borrowed. */
mg_ir_Value_like *mg_ir_uniqued_arg(PyObject *obj, PyTypeObject *type, mg_ir_Context *ctx, const char *what)
{
    if (!PyObject_TypeCheck(obj, type)) {
        PyErr_Format(PyExc_TypeError, "%s must be an mlirgpu.ir.%s, not %.100s", what,
                     strrchr(type->tp_name, '.') + 1, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    mg_ir_Value_like *v = (mg_ir_Value_like *)obj;
    if (ctx != NULL && v->context != ctx) {
        PyErr_Format(PyExc_ValueError, "%s belongs to a different Context", what);
        return NULL;
    }
    return v;
}


/* The location for new IR: the argument, else the innermost `with loc:`,
 * else unknown. */
int mg_ir_location_arg(PyObject *arg, mg_ir_Context *ctx, MlirLocation *out)
{
    if (arg == NULL || arg == Py_None) {
        arg = mg_ir_stack_top(mg_ir_str_location_stack);
        if (arg == NULL) {
            if (PyErr_Occurred())
                return -1;
            *out = mlirLocationUnknownGet(ctx->context);
            return 0;
        }
    }
    mg_ir_Value_like *loc = mg_ir_uniqued_arg(arg, mg_ir_LocationType, ctx, "location");
    if (loc == NULL)
        return -1;
    *out = loc->h.loc;
    return 0;
}

/* ---- Location ---- */

static PyObject *Location_file(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"filename", "line", "col", "context", NULL};
    PyObject *filename, *ctxarg = NULL;
    long long line, col = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UL|L$O:Location.file", kwlist, &filename, &line,
                                     &col, &ctxarg))
        return NULL;
    if (line < 0 || line > UINT32_MAX || col < 0 || col > UINT32_MAX)
        return mg_raise(PyExc_OverflowError, "line and col must be in 0..%u, got %lld and %lld",
                        UINT32_MAX, line, col);
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL)
        return NULL;
    MlirStringRef name = mg_ir_string_ref(filename, "filename");
    if (name.data == NULL)
        return NULL;
    return wrap_location(ctx, mlirLocationFileLineColGet(ctx->context, name, (unsigned)line, (unsigned)col));
}

static PyObject *Location_name(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "child", "context", NULL};
    PyObject *name, *child = NULL, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|O$O:Location.name", kwlist, &name, &child, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL)
        return NULL;
    MlirLocation childloc = mlirLocationUnknownGet(ctx->context);
    if (child != NULL && child != Py_None) {
        mg_ir_Value_like *c = mg_ir_uniqued_arg(child, mg_ir_LocationType, ctx, "child");
        if (c == NULL)
            return NULL;
        childloc = c->h.loc;
    }
    MlirStringRef ref = mg_ir_string_ref(name, "name");
    if (ref.data == NULL)
        return NULL;
    return wrap_location(ctx, mlirLocationNameGet(ctx->context, ref, childloc));
}

static PyObject *Location_unknown(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"context", NULL};
    PyObject *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$O:Location.unknown", kwlist, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    return ctx ? wrap_location(ctx, mlirLocationUnknownGet(ctx->context)) : NULL;
}

static PyObject *Location_fused(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"locations", "context", NULL};
    PyObject *seq, *ctxarg = NULL;
    const void **locs;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Location.fused", kwlist, &seq, &ctxarg) ||
        mg_ir_own_items(&seq, "expected a sequence") < 0)
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    PyObject *result = NULL;
    if (ctx != NULL && mg_ir_uniqued_seq(seq, mg_ir_LocationType, ctx, "location", &locs, &n) == 0) {
        result = wrap_location(ctx, mlirLocationFusedGet(ctx->context, n, (MlirLocation *)locs,
                                                         mlirAttributeGetNull()));
        PyMem_Free(locs);
    }
    Py_DECREF(seq);
    return result;
}

static PyObject *Location_str(mg_ir_Value_like *self)
{
    mg_buf buf = {0};
    mlirLocationPrint(self->h.loc, mg_buf_callback, &buf);
    return mg_buf_finish(&buf);
}

static PyObject *Location_get_filename(mg_ir_Value_like *self, void *c)
{
    if (!mlirLocationIsAFileLineColRange(self->h.loc))
        Py_RETURN_NONE;
    return mg_ir_str(mlirIdentifierStr(mlirLocationFileLineColRangeGetFilename(self->h.loc)));
}

static PyObject *Location_get_line(mg_ir_Value_like *self, void *c)
{
    if (!mlirLocationIsAFileLineColRange(self->h.loc))
        Py_RETURN_NONE;
    return PyLong_FromLong(mlirLocationFileLineColRangeGetStartLine(self->h.loc));
}

static PyObject *Location_get_col(mg_ir_Value_like *self, void *c)
{
    if (!mlirLocationIsAFileLineColRange(self->h.loc))
        Py_RETURN_NONE;
    return PyLong_FromLong(mlirLocationFileLineColRangeGetStartColumn(self->h.loc));
}

static PyObject *Location_enter(PyObject *self, PyObject *unused) { return mg_ir_stack_push(mg_ir_str_location_stack, self); }
static PyObject *Location_exit(PyObject *self, PyObject *args) { return mg_ir_stack_pop(mg_ir_str_location_stack, self); }

static PyMethodDef Location_methods[] = {
    {"file", (PyCFunction)(void (*)(void))Location_file, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Location.file(filename, line, col=0, *, context=None)"},
    {"name", (PyCFunction)(void (*)(void))Location_name, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Location.name(name, child=None, *, context=None)"},
    {"unknown", (PyCFunction)(void (*)(void))Location_unknown, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Location.unknown(*, context=None)"},
    {"fused", (PyCFunction)(void (*)(void))Location_fused, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Location.fused(locations, *, context=None)"},
    {"__enter__", Location_enter, METH_NOARGS, NULL},
    {"__exit__", Location_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef Location_getset[] = {
    {"context", (getter)mg_ir_uniqued_get_context, NULL, NULL, NULL},
    {"filename", (getter)Location_get_filename, NULL, "File of a file:line:col location, else None.", NULL},
    {"line", (getter)Location_get_line, NULL, NULL, NULL},
    {"col", (getter)Location_get_col, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Location_slots[] = {
    {Py_tp_doc, "A source location; `with loc:` makes it the default for new operations."},
    {Py_tp_dealloc, mg_ir_uniqued_dealloc},
    {Py_tp_hash, mg_ir_uniqued_hash},
    {Py_tp_richcompare, mg_ir_uniqued_richcompare},
    {Py_tp_str, Location_str},
    {Py_tp_repr, mg_ir_uniqued_repr},
    {Py_tp_methods, Location_methods},
    {Py_tp_getset, Location_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Location_spec = {"mlirgpu.ir.Location", sizeof(mg_ir_Value_like), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                    Location_slots};

/* ---- Type ---- */

/* Parses `text` as a type; raises MLIRError with MLIR's diagnostics on failure. */
static PyObject *Type_parse(PyObject *cls, PyObject *args, PyObject *kwds)
{
    mg_ir_Context *ctx;
    MlirStringRef ref;
    if (mg_ir_parse_args(args, kwds, "U|$O:Type.parse", &ctx, &ref) < 0)
        return NULL;
    MlirType t = mlirTypeParseGet(ctx->context, ref);
    if (mg_ir_diag_check(ctx, mlirTypeIsNull(t), "cannot parse type") < 0)
        return NULL;
    return wrap_type(ctx, t);
}

static PyObject *Type_integer(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"width", "signed", "context", NULL};
    long long width;
    PyObject *sign = Py_None, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L|O$O:Type.integer", kwlist, &width, &sign, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL)
        return NULL;
    /* IntegerType's limit (2^24 - 1 bits); past it MLIR asserts. */
    if (width < 1 || width > 16777215)
        return mg_raise(PyExc_ValueError, "integer width must be in 1..16777215, got %lld", width);
    MlirType t;
    if (sign == Py_None)
        t = mlirIntegerTypeGet(ctx->context, (unsigned)width);
    else if (PyBool_Check(sign))
        t = sign == Py_True ? mlirIntegerTypeSignedGet(ctx->context, (unsigned)width)
                            : mlirIntegerTypeUnsignedGet(ctx->context, (unsigned)width);
    else
        return mg_raise(PyExc_TypeError, "signed must be None, True or False, not %.100s", Py_TYPE(sign)->tp_name);
    return wrap_type(ctx, t);
}

#define SIMPLE_TYPE(pyname, getter)                                                         \
    static PyObject *Type_##pyname(PyObject *cls, PyObject *args, PyObject *kwds)           \
    {                                                                                       \
        static char *kwlist[] = {"context", NULL};                                          \
        PyObject *ctxarg = NULL;                                                            \
        if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$O:Type." #pyname, kwlist, &ctxarg)) \
            return NULL;                                                                    \
        mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);                                           \
        return ctx ? wrap_type(ctx, getter(ctx->context)) : NULL;                           \
    }
SIMPLE_TYPE(index, mlirIndexTypeGet)
SIMPLE_TYPE(f16, mlirF16TypeGet)
SIMPLE_TYPE(bf16, mlirBF16TypeGet)
SIMPLE_TYPE(f32, mlirF32TypeGet)
SIMPLE_TYPE(f64, mlirF64TypeGet)
SIMPLE_TYPE(none, mlirNoneTypeGet)

/* A shape: a sequence of sizes, None (or ir.DYNAMIC) for a dynamic one. */
static int shape_arg(PyObject *seq, int64_t **out, intptr_t *rank, int allow_dynamic)
{
    PyObject *fast = PySequence_Fast(seq, "shape must be a sequence of ints");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *dims = PyMem_Calloc((size_t)n + 1, sizeof *dims);
    if (dims == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (item == Py_None && allow_dynamic) {
            dims[i] = mlirShapedTypeGetDynamicSize();
            continue;
        }
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "shape entries must be ints%s, not %.100s",
                         allow_dynamic ? " or None" : "", Py_TYPE(item)->tp_name);
            goto error;
        }
        long long v = PyLong_AsLongLong(item);
        if (v == -1 && PyErr_Occurred())
            goto error;
        if (allow_dynamic && v == mlirShapedTypeGetDynamicSize()) {
            dims[i] = v;
            continue;
        }
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "shape entries must be >= 0, got %lld", v);
            goto error;
        }
        dims[i] = v;
    }
    Py_DECREF(fast);
    *out = dims;
    *rank = n;
    return 0;
error:
    Py_DECREF(fast);
    PyMem_Free(dims);
    return -1;
}

static PyObject *Type_memref(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"shape", "element_type", "memory_space", "layout", "location", NULL};
    PyObject *shape, *elem, *space = Py_None, *layoutarg = Py_None, *locarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O$OO:Type.memref", kwlist, &shape, &elem, &space, &layoutarg,
                                     &locarg))
        return NULL;
    mg_ir_Value_like *et = mg_ir_uniqued_arg(elem, mg_ir_TypeType, NULL, "element_type");
    if (et == NULL)
        return NULL;
    mg_ir_Context *ctx = et->context;
    MlirLocation loc;
    if (mg_ir_location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    MlirAttribute space_attr = mlirAttributeGetNull();
    if (PyBool_Check(space))
        return mg_raise(PyExc_TypeError, "memory_space must be an int or an Attribute, not bool");
    if (PyLong_Check(space)) {
        long long s = PyLong_AsLongLong(space);
        if (s == -1 && PyErr_Occurred())
            return NULL;
        if (s < 0)
            return mg_raise(PyExc_ValueError, "memory_space must be >= 0, got %lld", s);
        /* 0 is the default space, which MLIR spells as no attribute. */
        if (s != 0)
            space_attr = mlirIntegerAttrGet(mlirIntegerTypeGet(ctx->context, 64), s);
    } else if (space != Py_None) {
        mg_ir_Value_like *a = mg_ir_uniqued_arg(space, mg_ir_AttributeType, ctx, "memory_space");
        if (a == NULL)
            return NULL;
        space_attr = a->h.attr;
    }
    MlirAttribute layout = mlirAttributeGetNull();
    if (layoutarg != Py_None) {
        mg_ir_Value_like *a = mg_ir_uniqued_arg(layoutarg, mg_ir_AttributeType, ctx, "layout");
        if (a == NULL)
            return NULL;
        layout = a->h.attr;
    }
    int64_t *dims;
    intptr_t rank;
    if (shape_arg(shape, &dims, &rank, 1) < 0)
        return NULL;
    mg_ir_diag_clear(ctx);
    MlirType t = mlirMemRefTypeGetChecked(loc, et->h.type, rank, dims, layout, space_attr);
    PyMem_Free(dims);
    if (mg_ir_diag_check(ctx, mlirTypeIsNull(t), "invalid memref type") < 0)
        return NULL;
    return wrap_type(ctx, t);
}

static PyObject *Type_vector(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"shape", "element_type", "location", NULL};
    PyObject *shape, *elem, *locarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|$O:Type.vector", kwlist, &shape, &elem, &locarg))
        return NULL;
    mg_ir_Value_like *et = mg_ir_uniqued_arg(elem, mg_ir_TypeType, NULL, "element_type");
    if (et == NULL)
        return NULL;
    MlirLocation loc;
    if (mg_ir_location_arg(locarg, et->context, &loc) < 0)
        return NULL;
    int64_t *dims;
    intptr_t rank;
    if (shape_arg(shape, &dims, &rank, 0) < 0)
        return NULL;
    mg_ir_diag_clear(et->context);
    MlirType t = mlirVectorTypeGetChecked(loc, rank, dims, et->h.type);
    PyMem_Free(dims);
    if (mg_ir_diag_check(et->context, mlirTypeIsNull(t), "invalid vector type") < 0)
        return NULL;
    return wrap_type(et->context, t);
}

/* Fills `out` with the handles of a sequence of Types (or Attributes, or
 * Locations: anything of the uniqued layout) from `ctx`. */
int mg_ir_uniqued_seq(PyObject *seq, PyTypeObject *type, mg_ir_Context *ctx, const char *what,
                       const void ***out, Py_ssize_t *n)
{
    PyObject *fast = PySequence_Fast(seq, "expected a sequence");
    if (fast == NULL)
        return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    const void **items = PyMem_Calloc((size_t)*n + 1, sizeof *items);
    if (items == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        mg_ir_Value_like *v = mg_ir_uniqued_arg(PySequence_Fast_GET_ITEM(fast, i), type, ctx, what);
        if (v == NULL) {
            PyMem_Free(items);
            Py_DECREF(fast);
            return -1;
        }
        items[i] = v->h.ptr;
    }
    Py_DECREF(fast);
    *out = items;
    return 0;
}

static PyObject *Type_function(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"inputs", "results", "context", NULL};
    PyObject *inputs, *results, *ctxarg = NULL, *r = NULL;
    const void **in = NULL, **out = NULL;
    Py_ssize_t nin, nout;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|$O:Type.function", kwlist, &inputs, &results, &ctxarg))
        return NULL;
    if (mg_ir_own_items(&inputs, "expected a sequence") < 0)
        return NULL;
    if (mg_ir_own_items(&results, "expected a sequence") < 0) {
        Py_DECREF(inputs);
        return NULL;
    }
    mg_ir_Context *ctx = mg_ir_context_arg(ctxarg);
    if (ctx == NULL || mg_ir_uniqued_seq(inputs, mg_ir_TypeType, ctx, "input type", &in, &nin) < 0 ||
        mg_ir_uniqued_seq(results, mg_ir_TypeType, ctx, "result type", &out, &nout) < 0)
        goto error;
    r = wrap_type(ctx, mlirFunctionTypeGet(ctx->context, nin, (MlirType *)in, nout, (MlirType *)out));
error:
    PyMem_Free(in);
    PyMem_Free(out);
    Py_DECREF(inputs);
    Py_DECREF(results);
    return r;
}

static PyObject *Type_str(mg_ir_Value_like *self)
{
    mg_buf buf = {0};
    mlirTypePrint(self->h.type, mg_buf_callback, &buf);
    return mg_buf_finish(&buf);
}

#define TYPE_PREDICATE(pyname, test)                                       \
    static PyObject *Type_get_##pyname(mg_ir_Value_like *self, void *c)    \
    {                                                                      \
        return PyBool_FromLong(test(self->h.type));                        \
    }
TYPE_PREDICATE(is_integer, mlirTypeIsAInteger)
TYPE_PREDICATE(is_index, mlirTypeIsAIndex)
TYPE_PREDICATE(is_float, mlirTypeIsAFloat)
TYPE_PREDICATE(is_memref, mlirTypeIsAMemRef)
TYPE_PREDICATE(is_vector, mlirTypeIsAVector)
TYPE_PREDICATE(is_function, mlirTypeIsAFunction)

static PyObject *Type_get_width(mg_ir_Value_like *self, void *c)
{
    if (mlirTypeIsAInteger(self->h.type))
        return PyLong_FromUnsignedLong(mlirIntegerTypeGetWidth(self->h.type));
    if (mlirTypeIsAFloat(self->h.type))
        return PyLong_FromUnsignedLong(mlirFloatTypeGetWidth(self->h.type));
    return mg_raise(PyExc_TypeError, "only integer and float types have a width");
}

static PyObject *Type_get_signed(mg_ir_Value_like *self, void *c)
{
    if (!mlirTypeIsAInteger(self->h.type))
        return mg_raise(PyExc_TypeError, "only integer types have signedness");
    if (mlirIntegerTypeIsSignless(self->h.type))
        Py_RETURN_NONE;
    return PyBool_FromLong(mlirIntegerTypeIsSigned(self->h.type));
}

static PyObject *Type_get_shape(mg_ir_Value_like *self, void *c)
{
    MlirType t = self->h.type;
    if (!mlirTypeIsAShaped(t) || !mlirShapedTypeHasRank(t))
        return mg_raise(PyExc_TypeError, "only ranked shaped types (memref, vector, tensor) have a shape");
    intptr_t rank = mlirShapedTypeGetRank(t);
    PyObject *shape = PyTuple_New(rank);
    for (intptr_t i = 0; shape != NULL && i < rank; i++) {
        PyObject *d = mlirShapedTypeIsDynamicDim(t, i) ? Py_NewRef(Py_None)
                                                      : PyLong_FromLongLong(mlirShapedTypeGetDimSize(t, i));
        if (d == NULL)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, i, d);
    }
    return shape;
}

static PyObject *Type_get_element_type(mg_ir_Value_like *self, void *c)
{
    if (!mlirTypeIsAShaped(self->h.type))
        return mg_raise(PyExc_TypeError, "only shaped types (memref, vector, tensor) have an element type");
    return wrap_type(self->context, mlirShapedTypeGetElementType(self->h.type));
}

static PyObject *Type_get_memory_space(mg_ir_Value_like *self, void *c)
{
    if (!mlirTypeIsAMemRef(self->h.type))
        return mg_raise(PyExc_TypeError, "only memref types have a memory space");
    MlirAttribute a = mlirMemRefTypeGetMemorySpace(self->h.type);
    if (mlirAttributeIsNull(a))
        Py_RETURN_NONE;
    return wrap_attribute(self->context, a);
}

static PyObject *function_input(void *self, intptr_t i)
{
    mg_ir_Value_like *t = self;
    return wrap_type(t->context, mlirFunctionTypeGetInput(t->h.type, i));
}

static PyObject *function_result(void *self, intptr_t i)
{
    mg_ir_Value_like *t = self;
    return wrap_type(t->context, mlirFunctionTypeGetResult(t->h.type, i));
}

static PyObject *Type_get_inputs_results(mg_ir_Value_like *self, void *results)
{
    MlirType t = self->h.type;
    if (!mlirTypeIsAFunction(t))
        return mg_raise(PyExc_TypeError, "only function types have inputs and results");
    if (results)
        return mg_ir_list_of(mlirFunctionTypeGetNumResults(t), function_result, self);
    return mg_ir_list_of(mlirFunctionTypeGetNumInputs(t), function_input, self);
}

static PyMethodDef Type_methods[] = {
    {"parse", (PyCFunction)(void (*)(void))Type_parse, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Type.parse(text, *, context=None): MLIRError with the diagnostics on bad text."},
    {"integer", (PyCFunction)(void (*)(void))Type_integer, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Type.integer(width, signed=None, *, context=None): signless when signed is None."},
    {"index", (PyCFunction)(void (*)(void))Type_index, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"f16", (PyCFunction)(void (*)(void))Type_f16, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"bf16", (PyCFunction)(void (*)(void))Type_bf16, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"f32", (PyCFunction)(void (*)(void))Type_f32, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"f64", (PyCFunction)(void (*)(void))Type_f64, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"none", (PyCFunction)(void (*)(void))Type_none, METH_VARARGS | METH_KEYWORDS | METH_CLASS, NULL},
    {"memref", (PyCFunction)(void (*)(void))Type_memref, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Type.memref(shape, element_type, memory_space=None, *, layout=None, location=None): layout is an "
     "Attribute such as Attribute.strided_layout(...); None in shape is "
     "a dynamic size; memory_space an int (3 = GPU shared memory) or an Attribute."},
    {"vector", (PyCFunction)(void (*)(void))Type_vector, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Type.vector(shape, element_type, *, location=None)"},
    {"function", (PyCFunction)(void (*)(void))Type_function, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Type.function(inputs, results, *, context=None)"},
    {NULL},
};

static PyGetSetDef Type_getset[] = {
    {"context", (getter)mg_ir_uniqued_get_context, NULL, NULL, NULL},
    {"is_integer", (getter)Type_get_is_integer, NULL, NULL, NULL},
    {"is_index", (getter)Type_get_is_index, NULL, NULL, NULL},
    {"is_float", (getter)Type_get_is_float, NULL, NULL, NULL},
    {"is_memref", (getter)Type_get_is_memref, NULL, NULL, NULL},
    {"is_vector", (getter)Type_get_is_vector, NULL, NULL, NULL},
    {"is_function", (getter)Type_get_is_function, NULL, NULL, NULL},
    {"width", (getter)Type_get_width, NULL, "Bit width of an integer or float type.", NULL},
    {"signed", (getter)Type_get_signed, NULL, "None (signless), True or False.", NULL},
    {"shape", (getter)Type_get_shape, NULL, "Sizes, None where dynamic.", NULL},
    {"element_type", (getter)Type_get_element_type, NULL, NULL, NULL},
    {"memory_space", (getter)Type_get_memory_space, NULL, NULL, NULL},
    {"inputs", (getter)Type_get_inputs_results, NULL, NULL, NULL},
    {"results", (getter)Type_get_inputs_results, NULL, NULL, (void *)1},
    {NULL},
};

static PyType_Slot Type_slots[] = {
    {Py_tp_doc, "An MLIR type, uniqued in its Context."},
    {Py_tp_dealloc, mg_ir_uniqued_dealloc},
    {Py_tp_hash, mg_ir_uniqued_hash},
    {Py_tp_richcompare, mg_ir_uniqued_richcompare},
    {Py_tp_str, Type_str},
    {Py_tp_repr, mg_ir_uniqued_repr},
    {Py_tp_methods, Type_methods},
    {Py_tp_getset, Type_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Type_spec = {"mlirgpu.ir.Type", sizeof(mg_ir_Value_like), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Type_slots};

/* ---- Attribute ---- */

PyObject *mg_ir_Attribute_parse(PyObject *cls, PyObject *args, PyObject *kwds)
{
    mg_ir_Context *ctx;
    MlirStringRef ref;
    if (mg_ir_parse_args(args, kwds, "U|$O:Attribute.parse", &ctx, &ref) < 0)
        return NULL;
    MlirAttribute a = mlirAttributeParseGet(ctx->context, ref);
    if (mg_ir_diag_check(ctx, mlirAttributeIsNull(a), "cannot parse attribute") < 0)
        return NULL;
    return wrap_attribute(ctx, a);
}

