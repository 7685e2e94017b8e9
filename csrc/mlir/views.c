/* Blocks, regions and values as views into an operation, and
 * mlirgpu.ir.InsertionPoint. */
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
/* Operation, Block, Region, Value                                       */
/* ===================================================================== */




int mg_ir_op_check(mg_ir_Operation *op)
{
    if (!op->valid) {
        PyErr_SetString(mg_st->InvalidObjectError,
                        "the operation was erased, or rewritten by a pass that ran over it");
        return -1;
    }
    return 0;
}

int mg_ir_anchor_check(mg_ir_Operation *anchor, const char *what)
{
    if (!anchor->valid) {
        PyErr_Format(mg_st->InvalidObjectError,
                     "the %s belongs to an operation that was erased or rewritten by a pass", what);
        return -1;
    }
    return 0;
}

static PyObject *live_key(MlirOperation op) { return PyLong_FromVoidPtr(op.ptr); }

mg_ir_Operation *mg_ir_op_new(mg_ir_Context *ctx, MlirOperation op, PyObject *parent, int owned)
{
    PyObject *key = live_key(op), *addr = NULL;
    mg_ir_Operation *self = PyObject_New(mg_ir_Operation, mg_ir_OperationType);
    if (key == NULL || self == NULL)
        goto error;
    self->op = op;
    self->context = (mg_ir_Context *)Py_NewRef(ctx);
    self->parent = Py_XNewRef(parent);
    self->keepalive = NULL;
    self->owned = owned;
    self->valid = 1;
    addr = PyLong_FromVoidPtr(self);
    if (addr == NULL || PyDict_SetItem(ctx->live_ops, key, addr) < 0) {
        self->valid = 0; /* not registered: dealloc must not unregister */
        self->owned = 0;
        Py_CLEAR(self);
        goto error;
    }
    Py_DECREF(addr);
    Py_DECREF(key);
    return self;
error:
    if (self == NULL && owned)
        mlirOperationDestroy(op);
    Py_XDECREF(addr);
    Py_XDECREF(key);
    return NULL;
}

PyObject *mg_ir_operation_wrap(mg_ir_Context *ctx, MlirOperation op)
{
    PyObject *key = live_key(op);
    if (key == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(ctx->live_ops, key);
    Py_DECREF(key);
    if (found != NULL)
        return Py_NewRef((PyObject *)PyLong_AsVoidPtr(found));
    if (PyErr_Occurred())
        return NULL;
    MlirOperation parent_op = mlirOperationGetParentOperation(op);
    PyObject *parent = NULL;
    if (!mlirOperationIsNull(parent_op) && (parent = mg_ir_operation_wrap(ctx, parent_op)) == NULL)
        return NULL;
    /* A top-level operation reached this way is owned by whoever made it
     * (every root that Python sees was wrapped when it was made). */
    mg_ir_Operation *self = mg_ir_op_new(ctx, op, parent, 0);
    Py_XDECREF(parent);
    return (PyObject *)self;
}

/* Marks every live wrapper strictly under `root` (found through the wrappers'
 * own parent chains: the IR they point into may already be freed) invalid. */
int mg_ir_invalidate_under(mg_ir_Operation *root, int include_root)
{
    mg_ir_Context *ctx = root->context;
    PyObject *doomed = PyList_New(0);
    if (doomed == NULL)
        return -1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(ctx->live_ops, &pos, &key, &value)) {
        mg_ir_Operation *w = PyLong_AsVoidPtr(value);
        if (w == root && !include_root)
            continue;
        for (mg_ir_Operation *p = w; p != NULL; p = (mg_ir_Operation *)p->parent) {
            if (p == root) {
                if (PyList_Append(doomed, key) < 0) {
                    Py_DECREF(doomed);
                    return -1;
                }
                break;
            }
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(doomed); i++) {
        key = PyList_GET_ITEM(doomed, i);
        value = PyDict_GetItem(ctx->live_ops, key);
        mg_ir_Operation *w = PyLong_AsVoidPtr(value);
        w->valid = 0;
        w->owned = 0;
        PyDict_DelItem(ctx->live_ops, key);
    }
    Py_DECREF(doomed);
    return 0;
}

void mg_ir_invalidate_nested(mg_ir_Operation *root)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (mg_ir_invalidate_under(root, 0) < 0)
        PyErr_WriteUnraisable((PyObject *)root);
    PyErr_Restore(type, value, tb);
}

void mg_ir_Operation_dealloc(mg_ir_Operation *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (self->valid) {
        PyObject *key = live_key(self->op);
        if (key == NULL || PyDict_DelItem(self->context->live_ops, key) < 0)
            PyErr_Clear();
        Py_XDECREF(key);
        /* A root: nothing else refers into it, or it would still be alive. */
        if (self->owned)
            mlirOperationDestroy(self->op);
    }
    Py_XDECREF(self->parent);
    Py_XDECREF(self->keepalive);
    Py_DECREF(self->context);
    PyObject_Free(self);
    Py_DECREF(type);
}

PyObject *mg_ir_block_wrap(mg_ir_Operation *anchor, MlirBlock block)
{
    mg_ir_Block *self = PyObject_New(mg_ir_Block, mg_ir_BlockType);
    if (self == NULL)
        return NULL;
    self->block = block;
    self->anchor = (mg_ir_Operation *)Py_NewRef(anchor);
    return (PyObject *)self;
}

/* The wrapper of the operation owning `block`, new ref. */
mg_ir_Operation *mg_ir_block_owner(mg_ir_Context *ctx, MlirBlock block)
{
    return (mg_ir_Operation *)mg_ir_operation_wrap(ctx, mlirBlockGetParentOperation(block));
}

PyObject *mg_ir_region_wrap(mg_ir_Operation *anchor, MlirRegion region)
{
    mg_ir_Region *self = PyObject_New(mg_ir_Region, mg_ir_RegionType);
    if (self == NULL)
        return NULL;
    self->region = region;
    self->anchor = (mg_ir_Operation *)Py_NewRef(anchor);
    return (PyObject *)self;
}

PyObject *mg_ir_value_wrap(mg_ir_Operation *anchor, MlirValue value)
{
    mg_ir_ValueObject *self = PyObject_New(mg_ir_ValueObject, mg_ir_ValueType);
    if (self == NULL)
        return NULL;
    self->value = value;
    self->anchor = (mg_ir_Operation *)Py_NewRef(anchor);
    return (PyObject *)self;
}

void mg_ir_view_dealloc(mg_ir_Block *self) /* Block, Region and Value share the layout's tail */
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(self->anchor);
    PyObject_Free(self);
    Py_DECREF(type);
}

Py_hash_t mg_ir_view_hash(mg_ir_Block *self) { return _Py_HashPointer(self->block.ptr); }

PyObject *mg_ir_view_richcompare(mg_ir_Block *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
        Py_RETURN_NOTIMPLEMENTED;
    int eq = self->block.ptr == ((mg_ir_Block *)other)->block.ptr;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

/* ---- insertion ---- */


MlirWalkResult mg_ir_collect_op(MlirOperation op, void *userdata)
{
    op_list *list = userdata;
    if (list->n == list->cap) {
        size_t cap = list->cap ? 2 * list->cap : 64;
        MlirOperation *grown = realloc(list->ops, cap * sizeof *grown);
        if (grown == NULL) {
            list->failed = 1;
            return MlirWalkResultInterrupt;
        }
        list->ops = grown;
        list->cap = cap;
    }
    list->ops[list->n++] = op;
    return MlirWalkResultAdvance;
}


MlirOperation mg_ir_ir_root(MlirOperation op)
{
    for (MlirOperation p = op; !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p))
        op = p;
    return op;
}

/* The operation defining a value, or owning the block of a block argument. */
MlirOperation mg_ir_value_owner_op(MlirValue v)
{
    if (mlirValueIsAOpResult(v))
        return mlirOpResultGetOwner(v);
    return mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
}

/* Whether `outer` holds `op` in one of its regions, at any depth. */
static int op_encloses(MlirOperation outer, MlirOperation op)
{
    for (MlirOperation p = mlirOperationGetParentOperation(op); !mlirOperationIsNull(p);
         p = mlirOperationGetParentOperation(p))
        if (mlirOperationEqual(p, outer))
            return 1;
    return 0;
}

/* Whether `value` is a result of `user` or of an operation that holds it (or would
 * hold it once `user`'s root is inserted under `under`, when not null). Such
 * a use never dominates, and MLIR's verifier, which the printer runs first,
 * dereferences a null block checking it where that operation is a detached
 * root: refused wherever a use is made, so no IR holds one. */
int mg_ir_result_of_enclosing(MlirValue value, MlirOperation user, MlirOperation under)
{
    if (!mlirValueIsAOpResult(value))
        return 0;
    MlirOperation owner = mlirOpResultGetOwner(value);
    if (mlirOperationEqual(owner, user) || op_encloses(owner, user))
        return 1;
    return !mlirOperationIsNull(under) && (mlirOperationEqual(owner, under) || op_encloses(owner, under));
}

/* Moves the detached operation `op` into `block` before `before` (or at the
 * end when before is NULL). */
int mg_ir_insert_operation(mg_ir_Block *block, mg_ir_Operation *before, PyObject *opobj)
{
    if (!PyObject_TypeCheck(opobj, mg_ir_OperationType)) {
        PyErr_Format(PyExc_TypeError, "expected an mlirgpu.ir.Operation, not %.100s", Py_TYPE(opobj)->tp_name);
        return -1;
    }
    mg_ir_Operation *op = (mg_ir_Operation *)opobj;
    if (mg_ir_op_check(op) < 0 || mg_ir_anchor_check(block->anchor, "block") < 0)
        return -1;
    if (op->context != block->anchor->context) {
        PyErr_SetString(PyExc_ValueError, "the operation and the block belong to different Contexts");
        return -1;
    }
    if (!op->owned || op->parent != NULL) {
        PyErr_SetString(PyExc_ValueError, "the operation is already in a block; only a detached operation can be inserted");
        return -1;
    }
    size_t depth = 0; /* the operations around the block */
    for (MlirOperation p = block->anchor->op; !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p)) {
        if (mlirOperationEqual(p, op->op)) {
            PyErr_SetString(PyExc_ValueError, "cannot insert an operation into its own region");
            return -1;
        }
        depth++;
    }
    /* Uses across two roots would dangle once either root is freed: every
     * operand of the operation and of the operations nested in it (a clone's
     * body may use values of the module it was cloned from) must be defined
     * in the block's tree or inside the operation itself. */
    MlirOperation root = mg_ir_ir_root(block->anchor->op);
    op_list nested = {0};
    mlirOperationWalk(op->op, mg_ir_collect_op, &nested, MlirWalkPreOrder);
    if (nested.failed) {
        free(nested.ops);
        PyErr_NoMemory();
        return -1;
    }
    /* MLIR prints, clones, verifies and frees IR recursively: no tree nests
     * deeper than text may (MG_IR_MAX_NESTING), so none overflows the stack. */
    size_t height = 0;
    for (size_t k = 0; k < nested.n; k++) {
        size_t h = 1;
        for (MlirOperation p = mlirOperationGetParentOperation(nested.ops[k]); !mlirOperationIsNull(p);
             p = mlirOperationGetParentOperation(p))
            h++;
        height = h > height ? h : height;
    }
    if (depth + height > MG_IR_MAX_NESTING) {
        free(nested.ops);
        PyErr_Format(PyExc_ValueError, "inserting the operation would nest operations %zu deep: IR nests at most "
                     MG_IR_MAX_NESTING_TEXT " deep (see docs/ir.md)", depth + height);
        return -1;
    }
    for (size_t k = 0; k < nested.n; k++) {
        MlirOperation user = nested.ops[k];
        for (intptr_t i = 0; i < mlirOperationGetNumOperands(user); i++) {
            MlirValue operand = mlirOperationGetOperand(user, i);
            if (mg_ir_result_of_enclosing(operand, user, block->anchor->op)) {
                PyObject *name = mg_ir_str(mlirIdentifierStr(mlirOperationGetName(user)));
                if (name != NULL)
                    PyErr_Format(PyExc_ValueError, "operand #%zd of '%U' is a result of an operation that would "
                                 "hold it: a value cannot be used inside the operation that defines it",
                                 (Py_ssize_t)i, name);
                Py_XDECREF(name);
                free(nested.ops);
                return -1;
            }
            MlirOperation owner_root = mg_ir_ir_root(mg_ir_value_owner_op(operand));
            if (mlirOperationEqual(owner_root, root) || mlirOperationEqual(owner_root, op->op))
                continue;
            if (k == 0)
                PyErr_Format(PyExc_ValueError, "operand #%zd is defined outside the IR tree of the block "
                             "(another module or detached operation)", (Py_ssize_t)i);
            else {
                PyObject *name = mg_ir_str(mlirIdentifierStr(mlirOperationGetName(user)));
                if (name != NULL)
                    PyErr_Format(PyExc_ValueError, "operand #%zd of the nested operation '%U' is defined outside "
                                 "the IR tree of the block (another module or detached operation)", (Py_ssize_t)i,
                                 name);
                Py_XDECREF(name);
            }
            free(nested.ops);
            return -1;
        }
    }
    free(nested.ops);
    if (before != NULL) {
        if (mg_ir_op_check(before) < 0)
            return -1;
        if (!mlirBlockEqual(mlirOperationGetBlock(before->op), block->block)) {
            PyErr_SetString(PyExc_ValueError, "the insertion point's operation is no longer in its block");
            return -1;
        }
        mlirBlockInsertOwnedOperationBefore(block->block, before->op, op->op);
    } else {
        mlirBlockAppendOwnedOperation(block->block, op->op);
    }
    op->owned = 0;
    op->parent = Py_NewRef((PyObject *)block->anchor);
    return 0;
}


static PyObject *ip_new(mg_ir_Block *block, mg_ir_Operation *before)
{
    mg_ir_InsertionPoint *self = PyObject_New(mg_ir_InsertionPoint, mg_ir_InsertionPointType);
    if (self == NULL)
        return NULL;
    self->block = (mg_ir_Block *)Py_NewRef(block);
    self->before = (mg_ir_Operation *)Py_XNewRef(before);
    return (PyObject *)self;
}

mg_ir_Block *mg_ir_block_arg(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, mg_ir_BlockType)) {
        PyErr_Format(PyExc_TypeError, "expected an mlirgpu.ir.Block, not %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    mg_ir_Block *b = (mg_ir_Block *)obj;
    return mg_ir_anchor_check(b->anchor, "block") < 0 ? NULL : b;
}

static PyObject *InsertionPoint_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"block", NULL};
    PyObject *blockobj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:InsertionPoint", kwlist, &blockobj))
        return NULL;
    mg_ir_Block *block = mg_ir_block_arg(blockobj);
    return block ? ip_new(block, NULL) : NULL;
}

static PyObject *InsertionPoint_at_block_begin(PyObject *cls, PyObject *blockobj)
{
    mg_ir_Block *block = mg_ir_block_arg(blockobj);
    if (block == NULL)
        return NULL;
    MlirOperation first = mlirBlockGetFirstOperation(block->block);
    if (mlirOperationIsNull(first))
        return ip_new(block, NULL);
    mg_ir_Operation *before = (mg_ir_Operation *)mg_ir_operation_wrap(block->anchor->context, first);
    if (before == NULL)
        return NULL;
    PyObject *r = ip_new(block, before);
    Py_DECREF(before);
    return r;
}

static PyObject *InsertionPoint_at_block_terminator(PyObject *cls, PyObject *blockobj)
{
    mg_ir_Block *block = mg_ir_block_arg(blockobj);
    if (block == NULL)
        return NULL;
    MlirOperation term = mlirBlockGetTerminator(block->block);
    if (mlirOperationIsNull(term))
        return mg_raise(PyExc_ValueError, "the block has no terminator");
    mg_ir_Operation *before = (mg_ir_Operation *)mg_ir_operation_wrap(block->anchor->context, term);
    if (before == NULL)
        return NULL;
    PyObject *r = ip_new(block, before);
    Py_DECREF(before);
    return r;
}

static PyObject *InsertionPoint_before(PyObject *cls, PyObject *opobj)
{
    if (!PyObject_TypeCheck(opobj, mg_ir_OperationType))
        return mg_raise(PyExc_TypeError, "expected an mlirgpu.ir.Operation, not %.100s", Py_TYPE(opobj)->tp_name);
    mg_ir_Operation *op = (mg_ir_Operation *)opobj;
    if (mg_ir_op_check(op) < 0)
        return NULL;
    MlirBlock b = mlirOperationGetBlock(op->op);
    if (mlirBlockIsNull(b) || mlirOperationIsNull(mlirBlockGetParentOperation(b)))
        return mg_raise(PyExc_ValueError, "the operation is not in a block of another operation");
    PyObject *block = mg_ir_block_wrap((mg_ir_Operation *)op->parent, b);
    if (block == NULL)
        return NULL;
    PyObject *r = ip_new((mg_ir_Block *)block, op);
    Py_DECREF(block);
    return r;
}

static void InsertionPoint_dealloc(mg_ir_InsertionPoint *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(self->block);
    Py_XDECREF(self->before);
    PyObject_Free(self);
    Py_DECREF(type);
}

static PyObject *InsertionPoint_insert(mg_ir_InsertionPoint *self, PyObject *op)
{
    if (mg_ir_insert_operation(self->block, self->before, op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *InsertionPoint_get_block(mg_ir_InsertionPoint *self, void *c) { return Py_NewRef(self->block); }
static PyObject *InsertionPoint_enter(PyObject *self, PyObject *unused) { return mg_ir_stack_push(mg_ir_str_ip_stack, self); }
static PyObject *InsertionPoint_exit(PyObject *self, PyObject *args) { return mg_ir_stack_pop(mg_ir_str_ip_stack, self); }

static PyObject *InsertionPoint_current(PyObject *cls, PyObject *unused)
{
    PyObject *top = mg_ir_stack_top(mg_ir_str_ip_stack);
    if (top == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return Py_XNewRef(top);
}

static PyMethodDef InsertionPoint_methods[] = {
    {"at_block_begin", InsertionPoint_at_block_begin, METH_O | METH_CLASS, NULL},
    {"at_block_terminator", InsertionPoint_at_block_terminator, METH_O | METH_CLASS,
     "Before the block's terminator."},
    {"before", InsertionPoint_before, METH_O | METH_CLASS, "Before an operation in a block."},
    {"current", InsertionPoint_current, METH_NOARGS | METH_CLASS,
     "The innermost `with` insertion point on this thread, or None."},
    {"insert", (PyCFunction)InsertionPoint_insert, METH_O, "Moves a detached operation here."},
    {"__enter__", InsertionPoint_enter, METH_NOARGS, NULL},
    {"__exit__", InsertionPoint_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef InsertionPoint_getset[] = {
    {"block", (getter)InsertionPoint_get_block, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot InsertionPoint_slots[] = {
    {Py_tp_doc, "InsertionPoint(block): the end of a block. `with ip:` makes Operation.create "
                "insert there."},
    {Py_tp_new, InsertionPoint_new},
    {Py_tp_dealloc, InsertionPoint_dealloc},
    {Py_tp_methods, InsertionPoint_methods},
    {Py_tp_getset, InsertionPoint_getset},
    {0, NULL},
};

PyType_Spec mg_ir_InsertionPoint_spec = {"mlirgpu.ir.InsertionPoint", sizeof(mg_ir_InsertionPoint), 0,
                                          Py_TPFLAGS_DEFAULT, InsertionPoint_slots};

