/* mlirgpu.ir.Block, Region and Value. */
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
/* ---- Block ---- */

#define VIEW_CHECKED(self, what) \
    if (mg_ir_anchor_check((self)->anchor, what) < 0) \
        return NULL;

static PyObject *argument_item(void *self, intptr_t i)
{
    mg_ir_Block *block = self;
    return mg_ir_value_wrap(block->anchor, mlirBlockGetArgument(block->block, i));
}

static PyObject *Block_get_arguments(mg_ir_Block *self, void *c)
{
    VIEW_CHECKED(self, "block");
    return mg_ir_list_of(mlirBlockGetNumArguments(self->block), argument_item, self);
}

static PyObject *Block_get_operations(mg_ir_Block *self, void *c)
{
    VIEW_CHECKED(self, "block");
    PyObject *list = PyList_New(0);
    for (MlirOperation op = mlirBlockGetFirstOperation(self->block); list != NULL && !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op)) {
        PyObject *item = mg_ir_operation_wrap(self->anchor->context, op);
        if (item == NULL || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *Block_get_owner(mg_ir_Block *self, void *c)
{
    VIEW_CHECKED(self, "block");
    return Py_NewRef((PyObject *)self->anchor);
}

static PyObject *Block_get_region(mg_ir_Block *self, void *c)
{
    VIEW_CHECKED(self, "block");
    return mg_ir_region_wrap(self->anchor, mlirBlockGetParentRegion(self->block));
}

static PyObject *Block_add_argument(mg_ir_Block *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"type", "location", NULL};
    PyObject *typeobj, *locarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:add_argument", kwlist, &typeobj, &locarg))
        return NULL;
    VIEW_CHECKED(self, "block");
    mg_ir_Context *ctx = self->anchor->context;
    mg_ir_Value_like *t = mg_ir_uniqued_arg(typeobj, mg_ir_TypeType, ctx, "type");
    MlirLocation loc;
    if (t == NULL || mg_ir_location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    return mg_ir_value_wrap(self->anchor, mlirBlockAddArgument(self->block, t->h.type, loc));
}

static PyObject *Block_append(mg_ir_Block *self, PyObject *op)
{
    if (mg_ir_insert_operation(self, NULL, op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Block_str(mg_ir_Block *self)
{
    VIEW_CHECKED(self, "block");
    mg_buf buf = {0};
    mlirBlockPrint(self->block, mg_buf_callback, &buf);
    mg_ir_diag_clear(self->anchor->context);
    return mg_buf_finish(&buf);
}

static PyMethodDef Block_methods[] = {
    {"add_argument", (PyCFunction)(void (*)(void))Block_add_argument, METH_VARARGS | METH_KEYWORDS,
     "add_argument(type, location=None) -> Value"},
    {"append", (PyCFunction)Block_append, METH_O, "Moves a detached operation to the end of the block."},
    {NULL},
};

static PyGetSetDef Block_getset[] = {
    {"arguments", (getter)Block_get_arguments, NULL, NULL, NULL},
    {"operations", (getter)Block_get_operations, NULL, NULL, NULL},
    {"owner", (getter)Block_get_owner, NULL, "The operation whose region holds the block.", NULL},
    {"region", (getter)Block_get_region, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Block_slots[] = {
    {Py_tp_doc, "A block of a region; make one with Region.append_block."},
    {Py_tp_dealloc, mg_ir_view_dealloc},
    {Py_tp_hash, mg_ir_view_hash},
    {Py_tp_richcompare, mg_ir_view_richcompare},
    {Py_tp_str, Block_str},
    {Py_tp_methods, Block_methods},
    {Py_tp_getset, Block_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Block_spec = {"mlirgpu.ir.Block", sizeof(mg_ir_Block), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Block_slots};

/* ---- Region ---- */

static PyObject *Region_get_blocks(mg_ir_Region *self, void *c)
{
    VIEW_CHECKED(self, "region");
    PyObject *list = PyList_New(0);
    for (MlirBlock b = mlirRegionGetFirstBlock(self->region); list != NULL && !mlirBlockIsNull(b);
         b = mlirBlockGetNextInRegion(b)) {
        PyObject *item = mg_ir_block_wrap(self->anchor, b);
        if (item == NULL || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *Region_get_owner(mg_ir_Region *self, void *c)
{
    VIEW_CHECKED(self, "region");
    return Py_NewRef((PyObject *)self->anchor);
}

static PyObject *Region_append_block(mg_ir_Region *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"arg_types", "arg_locations", NULL};
    PyObject *types = NULL, *locs = NULL, *result = NULL;
    const void **t = NULL, **l = NULL;
    Py_ssize_t nt = 0, nl = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:append_block", kwlist, &types, &locs))
        return NULL;
    VIEW_CHECKED(self, "region");
    mg_ir_Context *ctx = self->anchor->context;
    if (types && mg_ir_uniqued_seq(types, mg_ir_TypeType, ctx, "argument type", &t, &nt) < 0)
        goto error;
    if (locs && locs != Py_None) {
        if (mg_ir_uniqued_seq(locs, mg_ir_LocationType, ctx, "argument location", &l, &nl) < 0)
            goto error;
        if (nl != nt) {
            PyErr_Format(PyExc_ValueError, "%zd argument types but %zd locations", nt, nl);
            goto error;
        }
    } else {
        MlirLocation loc;
        l = PyMem_Calloc((size_t)nt + 1, sizeof *l);
        if (l == NULL || mg_ir_location_arg(NULL, ctx, &loc) < 0)
            goto error;
        for (Py_ssize_t i = 0; i < nt; i++)
            l[i] = loc.ptr;
    }
    /* Reading the sequences ran Python code, which may have erased the region's operation. */
    if (mg_ir_anchor_check(self->anchor, "region") < 0)
        goto error;
    MlirBlock block = mlirBlockCreate(nt, (MlirType *)t, (MlirLocation *)l);
    mlirRegionAppendOwnedBlock(self->region, block);
    result = mg_ir_block_wrap(self->anchor, block);
error:
    PyMem_Free(t);
    PyMem_Free(l);
    return result;
}

static PyMethodDef Region_methods[] = {
    {"append_block", (PyCFunction)(void (*)(void))Region_append_block, METH_VARARGS | METH_KEYWORDS,
     "append_block(arg_types=(), arg_locations=None) -> Block"},
    {NULL},
};

static PyGetSetDef Region_getset[] = {
    {"blocks", (getter)Region_get_blocks, NULL, NULL, NULL},
    {"owner", (getter)Region_get_owner, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Region_slots[] = {
    {Py_tp_doc, "A region of an operation."},
    {Py_tp_dealloc, mg_ir_view_dealloc},
    {Py_tp_hash, mg_ir_view_hash},
    {Py_tp_richcompare, mg_ir_view_richcompare},
    {Py_tp_methods, Region_methods},
    {Py_tp_getset, Region_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Region_spec = {"mlirgpu.ir.Region", sizeof(mg_ir_Region), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Region_slots};

/* ---- Value ---- */

static PyObject *Value_get_type(mg_ir_ValueObject *self, void *c)
{
    VIEW_CHECKED(self, "value");
    return wrap_type(self->anchor->context, mlirValueGetType(self->value));
}

static PyObject *Value_get_owner(mg_ir_ValueObject *self, void *c)
{
    VIEW_CHECKED(self, "value");
    if (mlirValueIsAOpResult(self->value))
        return Py_NewRef((PyObject *)self->anchor);
    return mg_ir_block_wrap(self->anchor, mlirBlockArgumentGetOwner(self->value));
}

static PyObject *Value_get_is_block_argument(mg_ir_ValueObject *self, void *c)
{
    VIEW_CHECKED(self, "value");
    return PyBool_FromLong(mlirValueIsABlockArgument(self->value));
}

static PyObject *Value_get_index(mg_ir_ValueObject *self, void *c)
{
    VIEW_CHECKED(self, "value");
    if (mlirValueIsAOpResult(self->value))
        return PyLong_FromSsize_t(mlirOpResultGetResultNumber(self->value));
    return PyLong_FromSsize_t(mlirBlockArgumentGetArgNumber(self->value));
}

static PyObject *Value_get_num_uses(mg_ir_ValueObject *self, void *c)
{
    VIEW_CHECKED(self, "value");
    Py_ssize_t n = 0;
    for (MlirOpOperand u = mlirValueGetFirstUse(self->value); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
        n++;
    return PyLong_FromSsize_t(n);
}

static PyObject *Value_replace_all_uses_with(mg_ir_ValueObject *self, PyObject *other)
{
    VIEW_CHECKED(self, "value");
    if (!PyObject_TypeCheck(other, mg_ir_ValueType))
        return mg_raise(PyExc_TypeError, "expected an mlirgpu.ir.Value, not %.100s", Py_TYPE(other)->tp_name);
    mg_ir_ValueObject *o = (mg_ir_ValueObject *)other;
    VIEW_CHECKED(o, "value");
    if (!mlirOperationEqual(mg_ir_ir_root(self->anchor->op), mg_ir_ir_root(o->anchor->op)))
        return mg_raise(PyExc_ValueError, "the two values are in different IR trees");
    /* MLIR's loop would set each use to the value it already has, forever. */
    if (mlirValueEqual(self->value, o->value))
        Py_RETURN_NONE;
    for (MlirOpOperand u = mlirValueGetFirstUse(self->value); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
        if (mg_ir_result_of_enclosing(o->value, mlirOpOperandGetOwner(u), (MlirOperation){NULL}))
            return mg_raise(PyExc_ValueError, "a use of this value is in (or inside) the operation that defines the "
                            "replacement: a value cannot be used inside the operation that defines it");
    mlirValueReplaceAllUsesOfWith(self->value, o->value);
    Py_RETURN_NONE;
}

static PyObject *Value_str(mg_ir_ValueObject *self)
{
    VIEW_CHECKED(self, "value");
    mg_buf buf = {0};
    mlirValuePrint(self->value, mg_buf_callback, &buf);
    mg_ir_diag_clear(self->anchor->context);
    return mg_buf_finish(&buf);
}

static PyMethodDef Value_methods[] = {
    {"replace_all_uses_with", (PyCFunction)Value_replace_all_uses_with, METH_O, NULL},
    {NULL},
};

static PyGetSetDef Value_getset[] = {
    {"type", (getter)Value_get_type, NULL, NULL, NULL},
    {"owner", (getter)Value_get_owner, NULL, "The defining Operation, or the Block of an argument.", NULL},
    {"is_block_argument", (getter)Value_get_is_block_argument, NULL, NULL, NULL},
    {"index", (getter)Value_get_index, NULL, "Result number or argument number.", NULL},
    {"num_uses", (getter)Value_get_num_uses, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Value_slots[] = {
    {Py_tp_doc, "An SSA value: an operation result or a block argument."},
    {Py_tp_dealloc, mg_ir_view_dealloc},
    {Py_tp_hash, mg_ir_view_hash},
    {Py_tp_richcompare, mg_ir_view_richcompare},
    {Py_tp_str, Value_str},
    {Py_tp_methods, Value_methods},
    {Py_tp_getset, Value_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Value_spec = {"mlirgpu.ir.Value", sizeof(mg_ir_ValueObject), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Value_slots};

