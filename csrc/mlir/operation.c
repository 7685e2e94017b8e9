/* mlirgpu.ir.Operation: creation, attributes, operands and results,
 * walking, cloning and erasing. */
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
/* ---- Operation ---- */

/* The Context of a new operation: the `context=` argument, else that of the
 * `location=` argument, of the current insertion point, of the current
 * `with loc:`, else the current Context. */
static mg_ir_Context *implied_context(PyObject *ctxarg, PyObject *locarg)
{
    if (ctxarg != NULL && ctxarg != Py_None)
        return mg_ir_context_arg(ctxarg);
    if (locarg != NULL && PyObject_TypeCheck(locarg, mg_ir_LocationType))
        return ((mg_ir_Value_like *)locarg)->context;
    PyObject *ip = mg_ir_stack_top(mg_ir_str_ip_stack);
    if (ip != NULL)
        return ((mg_ir_InsertionPoint *)ip)->block->anchor->context;
    PyObject *loc = PyErr_Occurred() ? NULL : mg_ir_stack_top(mg_ir_str_location_stack);
    if (loc != NULL)
        return ((mg_ir_Value_like *)loc)->context;
    return PyErr_Occurred() ? NULL : mg_ir_context_current();
}

static int values_arg(PyObject *seq, mg_ir_Context *ctx, MlirValue **out, Py_ssize_t *n, PyObject **anchors)
{
    PyObject *fast = PySequence_Fast(seq, "operands must be a sequence of Values");
    if (fast == NULL)
        return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    MlirValue *vals = PyMem_Calloc((size_t)*n + 1, sizeof *vals);
    PyObject *keep = PyTuple_New(*n);
    if (vals == NULL || keep == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyObject_TypeCheck(item, mg_ir_ValueType)) {
            PyErr_Format(PyExc_TypeError, "operand #%zd must be an mlirgpu.ir.Value, not %.100s", i,
                         Py_TYPE(item)->tp_name);
            goto error;
        }
        mg_ir_ValueObject *v = (mg_ir_ValueObject *)item;
        if (mg_ir_anchor_check(v->anchor, "value") < 0)
            goto error;
        if (v->anchor->context != ctx) {
            PyErr_Format(PyExc_ValueError, "operand #%zd belongs to a different Context", i);
            goto error;
        }
        vals[i] = v->value;
        PyTuple_SET_ITEM(keep, i, Py_NewRef((PyObject *)v->anchor));
    }
    Py_DECREF(fast);
    *out = vals;
    *anchors = keep;
    return 0;
error:
    Py_DECREF(fast);
    PyMem_Free(vals);
    Py_XDECREF(keep);
    return -1;
}

static int blocks_arg(PyObject *seq, mg_ir_Context *ctx, MlirBlock **out, Py_ssize_t *n)
{
    PyObject *fast = PySequence_Fast(seq, "successors must be a sequence of Blocks");
    if (fast == NULL)
        return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    MlirBlock *blocks = PyMem_Calloc((size_t)*n + 1, sizeof *blocks);
    if (blocks == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        mg_ir_Block *b = mg_ir_block_arg(PySequence_Fast_GET_ITEM(fast, i));
        if (b == NULL || (b->anchor->context != ctx && !PyErr_Format(PyExc_ValueError,
                                                                     "successor belongs to a different Context"))) {
            Py_DECREF(fast);
            PyMem_Free(blocks);
            return -1;
        }
        blocks[i] = b->block;
    }
    Py_DECREF(fast);
    *out = blocks;
    return 0;
}

static PyObject *operation_create(PyObject *name, PyObject *operands, PyObject *results, PyObject *attributes,
                                  int nregions, PyObject *successors, PyObject *locarg, int detached,
                                  PyObject *ctxarg);

static PyObject *Operation_create(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "operands", "results", "attributes", "regions", "successors",
                             "location", "detached", "context", NULL};
    PyObject *name, *operands = NULL, *results = NULL, *attributes = NULL, *successors = NULL;
    PyObject *locarg = NULL, *ctxarg = NULL, *result;
    int nregions = 0, detached = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|OOOiO$OpO:Operation.create", kwlist, &name, &operands,
                                     &results, &attributes, &nregions, &successors, &locarg, &detached, &ctxarg))
        return NULL;
    if (mg_ir_own_items(&operands, "operands must be a sequence of Values") < 0)
        return NULL;
    if (mg_ir_own_items(&results, "expected a sequence") < 0 ||
        mg_ir_own_items(&successors, "successors must be a sequence of Blocks") < 0) {
        Py_XDECREF(operands);
        Py_XDECREF(results);
        return NULL;
    }
    result = operation_create(name, operands, results, attributes, nregions, successors, locarg, detached, ctxarg);
    Py_XDECREF(operands);
    Py_XDECREF(results);
    Py_XDECREF(successors);
    return result;
}

/* Operation.create, with its sequences already tuples of its own. */
static PyObject *operation_create(PyObject *name, PyObject *operands, PyObject *results, PyObject *attributes,
                                  int nregions, PyObject *successors, PyObject *locarg, int detached,
                                  PyObject *ctxarg)
{
    PyObject *anchors = NULL, *result = NULL;
    MlirValue *vals = NULL;
    const void **types = NULL;
    MlirNamedAttribute *named = NULL;
    MlirBlock *succ = NULL;
    MlirRegion *regions = NULL;
    Py_ssize_t nvals = 0, ntypes = 0, nnamed = 0, nsucc = 0;
    mg_ir_Context *ctx = implied_context(ctxarg, locarg);
    if (ctx == NULL)
        return NULL;
    MlirStringRef nameref = mg_ir_string_ref(name, "name");
    if (nameref.data == NULL)
        return NULL;
    const char *dot = memchr(nameref.data, '.', nameref.length);
    if (dot == NULL || dot == nameref.data || dot == nameref.data + nameref.length - 1)
        return mg_raise(PyExc_ValueError, "operation name must be 'dialect.op', got '%U'", name);
    if (!mlirContextGetAllowUnregisteredDialects(ctx->context)) {
        mlirContextGetOrLoadDialect(ctx->context, mlirStringRefCreate(nameref.data, (size_t)(dot - nameref.data)));
        if (!mlirContextIsRegisteredOperation(ctx->context, nameref))
            return mg_raise(PyExc_ValueError, "unknown operation '%U' (not registered in this Context)", name);
    }
    if (nregions < 0 || nregions > 64)
        return mg_raise(PyExc_ValueError, "regions must be a count in 0..64, got %d", nregions);
    MlirLocation loc;
    if (mg_ir_location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    mg_ir_InsertionPoint *ip = NULL;
    if (!detached) {
        ip = (mg_ir_InsertionPoint *)mg_ir_stack_top(mg_ir_str_ip_stack);
        if (ip == NULL && PyErr_Occurred())
            return NULL;
        if (ip != NULL && (mg_ir_anchor_check(ip->block->anchor, "block") < 0 ||
                           (ip->before != NULL && mg_ir_op_check(ip->before) < 0)))
            return NULL;
        if (ip != NULL && ip->block->anchor->context != ctx)
            return mg_raise(PyExc_ValueError, "the current InsertionPoint belongs to a different Context");
    }
    if ((operands && operands != Py_None && values_arg(operands, ctx, &vals, &nvals, &anchors) < 0) ||
        (results && results != Py_None && mg_ir_uniqued_seq(results, mg_ir_TypeType, ctx, "result type", &types, &ntypes) < 0) ||
        mg_ir_named_attributes(attributes, ctx, &named, &nnamed) < 0 ||
        (successors && successors != Py_None && blocks_arg(successors, ctx, &succ, &nsucc) < 0))
        goto error;
    if (nsucc > 0 && ip == NULL) {
        PyErr_SetString(PyExc_ValueError, "an operation with successors must be created at an InsertionPoint");
        goto error;
    }
    for (Py_ssize_t i = 0; i < nsucc; i++) {
        if (!mlirOperationEqual(mg_ir_ir_root(mlirBlockGetParentOperation(succ[i])), mg_ir_ir_root(ip->block->anchor->op))) {
            PyErr_Format(PyExc_ValueError, "successor #%zd is outside the IR tree of the insertion point", i);
            goto error;
        }
    }
    regions = PyMem_Calloc((size_t)nregions + 1, sizeof *regions);
    if (regions == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    MlirOperationState state = mlirOperationStateGet(nameref, loc);
    mlirOperationStateAddOperands(&state, nvals, vals);
    mlirOperationStateAddResults(&state, ntypes, (MlirType *)types);
    mlirOperationStateAddAttributes(&state, nnamed, named);
    mlirOperationStateAddSuccessors(&state, nsucc, succ);
    for (int i = 0; i < nregions; i++)
        regions[i] = mlirRegionCreate();
    mlirOperationStateAddOwnedRegions(&state, nregions, regions);
    mg_ir_diag_clear(ctx);
    MlirOperation op = mlirOperationCreate(&state);
    if (mg_ir_diag_check(ctx, mlirOperationIsNull(op), "cannot create the operation") < 0) {
        if (!mlirOperationIsNull(op))
            mlirOperationDestroy(op);
        goto error;
    }
    mg_ir_Operation *self = mg_ir_op_new(ctx, op, NULL, 1);
    if (self == NULL)
        goto error;
    self->keepalive = anchors;
    anchors = NULL;
    if (ip != NULL && mg_ir_insert_operation(ip->block, ip->before, (PyObject *)self) < 0) {
        Py_DECREF(self);
        goto error;
    }
    result = (PyObject *)self;
error:
    Py_XDECREF(anchors);
    PyMem_Free(vals);
    PyMem_Free(types);
    PyMem_Free(named);
    PyMem_Free(succ);
    PyMem_Free(regions);
    return result;
}


static PyObject *Operation_get_name(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return mg_ir_str(mlirIdentifierStr(mlirOperationGetName(self->op)));
}

static PyObject *Operation_get_context(mg_ir_Operation *self, void *c) { return Py_NewRef(self->context); }
static PyObject *Operation_get_is_valid(mg_ir_Operation *self, void *c) { return PyBool_FromLong(self->valid); }

static PyObject *Operation_get_location(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return wrap_location(self->context, mlirOperationGetLocation(self->op));
}

static PyObject *operand_item(void *self, intptr_t i)
{
    mg_ir_Operation *op = self;
    MlirValue v = mlirOperationGetOperand(op->op, i);
    mg_ir_Operation *owner = (mg_ir_Operation *)mg_ir_operation_wrap(op->context, mg_ir_value_owner_op(v));
    PyObject *item = owner ? mg_ir_value_wrap(owner, v) : NULL;
    Py_XDECREF(owner);
    return item;
}

static PyObject *result_item(void *self, intptr_t i)
{
    return mg_ir_value_wrap(self, mlirOperationGetResult(((mg_ir_Operation *)self)->op, i));
}

static PyObject *region_item(void *self, intptr_t i)
{
    return mg_ir_region_wrap(self, mlirOperationGetRegion(((mg_ir_Operation *)self)->op, i));
}

static PyObject *successor_item(void *self, intptr_t i)
{
    mg_ir_Operation *op = self;
    MlirBlock b = mlirOperationGetSuccessor(op->op, i);
    mg_ir_Operation *owner = mg_ir_block_owner(op->context, b);
    PyObject *item = owner ? mg_ir_block_wrap(owner, b) : NULL;
    Py_XDECREF(owner);
    return item;
}

static PyObject *Operation_get_operands(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return mg_ir_list_of(mlirOperationGetNumOperands(self->op), operand_item, self);
}

static PyObject *Operation_get_results(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return mg_ir_list_of(mlirOperationGetNumResults(self->op), result_item, self);
}

static PyObject *Operation_get_result(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    if (mlirOperationGetNumResults(self->op) != 1)
        return mg_raise(PyExc_ValueError, "the operation has %zd results, not exactly one",
                        (Py_ssize_t)mlirOperationGetNumResults(self->op));
    return mg_ir_value_wrap(self, mlirOperationGetResult(self->op, 0));
}

static PyObject *Operation_get_regions(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return mg_ir_list_of(mlirOperationGetNumRegions(self->op), region_item, self);
}

static PyObject *Operation_get_successors(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return mg_ir_list_of(mlirOperationGetNumSuccessors(self->op), successor_item, self);
}

static PyObject *Operation_get_parent(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return Py_NewRef(self->parent ? self->parent : Py_None);
}

static PyObject *Operation_get_block(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    if (self->parent == NULL)
        Py_RETURN_NONE;
    return mg_ir_block_wrap((mg_ir_Operation *)self->parent, mlirOperationGetBlock(self->op));
}

static PyObject *Operation_get_attributes(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    PyObject *dict = PyDict_New();
    intptr_t n = mlirOperationGetNumAttributes(self->op);
    for (intptr_t i = 0; dict != NULL && i < n; i++) {
        MlirNamedAttribute na = mlirOperationGetAttribute(self->op, i);
        PyObject *key = mg_ir_str(mlirIdentifierStr(na.name));
        PyObject *val = key ? wrap_attribute(self->context, na.attribute) : NULL;
        if (val == NULL || PyDict_SetItem(dict, key, val) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(key);
        Py_XDECREF(val);
    }
    return dict;
}

static PyObject *Operation_get_attribute(mg_ir_Operation *self, PyObject *name)
{
    OP_CHECKED(self);
    MlirStringRef ref = mg_ir_string_ref(name, "name");
    if (ref.data == NULL)
        return NULL;
    MlirAttribute a = mlirOperationGetAttributeByName(self->op, ref);
    if (mlirAttributeIsNull(a)) {
        PyErr_SetObject(PyExc_KeyError, name);
        return NULL;
    }
    return wrap_attribute(self->context, a);
}

static PyObject *Operation_set_attribute(mg_ir_Operation *self, PyObject *const *args, Py_ssize_t nargs)
{
    OP_CHECKED(self);
    if (nargs != 2)
        return mg_raise(PyExc_TypeError, "set_attribute(name, attribute) takes 2 arguments");
    MlirStringRef ref = mg_ir_string_ref(args[0], "name");
    mg_ir_Value_like *a = ref.data ? mg_ir_uniqued_arg(args[1], mg_ir_AttributeType, self->context, "attribute") : NULL;
    if (a == NULL)
        return NULL;
    mlirOperationSetAttributeByName(self->op, ref, a->h.attr);
    Py_RETURN_NONE;
}

static PyObject *Operation_remove_attribute(mg_ir_Operation *self, PyObject *name)
{
    OP_CHECKED(self);
    MlirStringRef ref = mg_ir_string_ref(name, "name");
    if (ref.data == NULL)
        return NULL;
    if (!mlirOperationRemoveAttributeByName(self->op, ref)) {
        PyErr_SetObject(PyExc_KeyError, name);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *mg_ir_Operation_verify(mg_ir_Operation *self, PyObject *unused)
{
    OP_CHECKED(self);
    mg_ir_diag_clear(self->context);
    int ok = mlirOperationVerify(self->op);
    if (mg_ir_diag_check(self->context, !ok, "verification failed") < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *op_print(mg_ir_Operation *self, int generic, int debug_info)
{
    OP_CHECKED(self);
    MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
    if (generic)
        mlirOpPrintingFlagsPrintGenericOpForm(flags);
    if (debug_info)
        mlirOpPrintingFlagsEnableDebugInfo(flags, true, false);
    mg_buf buf = {0};
    /* The printer verifies first and falls back to the generic form on
     * invalid IR; what the verifier says there is not an error of printing. */
    mlirOperationPrintWithFlags(self->op, flags, mg_buf_callback, &buf);
    mlirOpPrintingFlagsDestroy(flags);
    mg_ir_diag_clear(self->context);
    return mg_buf_finish(&buf);
}

PyObject *mg_ir_Operation_str(mg_ir_Operation *self) { return op_print(self, 0, 0); }

PyObject *mg_ir_Operation_print(mg_ir_Operation *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"generic", "debug_info", NULL};
    int generic = 0, debug_info = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$pp:print", kwlist, &generic, &debug_info))
        return NULL;
    return op_print(self, generic, debug_info);
}

static PyObject *Operation_repr(mg_ir_Operation *self)
{
    if (!self->valid)
        return PyUnicode_FromString("<mlirgpu.ir.Operation (invalid)>");
    PyObject *name = Operation_get_name(self, NULL);
    if (name == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("<mlirgpu.ir.Operation %U>", name);
    Py_DECREF(name);
    return r;
}

PyObject *mg_ir_Operation_walk(mg_ir_Operation *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"post_order", NULL};
    int post = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:walk", kwlist, &post))
        return NULL;
    OP_CHECKED(self);
    op_list list = {0};
    mlirOperationWalk(self->op, mg_ir_collect_op, &list, post ? MlirWalkPostOrder : MlirWalkPreOrder);
    PyObject *result = list.failed ? PyErr_NoMemory() : PyList_New((Py_ssize_t)list.n);
    for (size_t i = 0; result != NULL && i < list.n; i++) {
        PyObject *item = mg_ir_operation_wrap(self->context, list.ops[i]);
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, (Py_ssize_t)i, item);
    }
    free(list.ops);
    return result;
}

/* Whether `op` is `ancestor` or nested in it. */
static int is_inside(MlirOperation op, MlirOperation ancestor)
{
    for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
        if (mlirOperationEqual(op, ancestor))
            return 1;
    return 0;
}

static int value_used_outside(MlirValue v, MlirOperation root)
{
    for (MlirOpOperand mg_ir_use = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(mg_ir_use); mg_ir_use = mlirOpOperandGetNextUse(mg_ir_use))
        if (!is_inside(mlirOpOperandGetOwner(mg_ir_use), root))
            return 1;
    return 0;
}

/* Whether an operation outside `root` (in the same tree) branches to a
 * block inside it: the C API has no block-use list, so look at successors. */
static int has_outside_branches_in(MlirOperation root)
{
    op_list list = {0};
    int found = 0;
    mlirOperationWalk(mg_ir_ir_root(root), mg_ir_collect_op, &list, MlirWalkPreOrder);
    for (size_t i = 0; i < list.n && !found; i++) {
        if (is_inside(list.ops[i], root))
            continue;
        for (intptr_t s = 0; s < mlirOperationGetNumSuccessors(list.ops[i]) && !found; s++)
            found = is_inside(mlirBlockGetParentOperation(mlirOperationGetSuccessor(list.ops[i], s)), root);
    }
    free(list.ops);
    return found;
}

/* Whether erasing `root` would leave a use of a value it defines. */
static int has_outside_uses(MlirOperation root)
{
    op_list list = {0};
    int found = 0;
    mlirOperationWalk(root, mg_ir_collect_op, &list, MlirWalkPreOrder);
    for (size_t i = 0; i < list.n && !found; i++) {
        MlirOperation op = list.ops[i];
        for (intptr_t r = 0; r < mlirOperationGetNumResults(op) && !found; r++)
            found = value_used_outside(mlirOperationGetResult(op, r), root);
        for (intptr_t g = 0; g < mlirOperationGetNumRegions(op) && !found; g++) {
            MlirRegion region = mlirOperationGetRegion(op, g);
            for (MlirBlock b = mlirRegionGetFirstBlock(region); !mlirBlockIsNull(b) && !found;
                 b = mlirBlockGetNextInRegion(b))
                for (intptr_t a = 0; a < mlirBlockGetNumArguments(b) && !found; a++)
                    found = value_used_outside(mlirBlockGetArgument(b, a), root);
        }
    }
    free(list.ops);
    return found;
}

int mg_ir_check_self_contained(mg_ir_Operation *root)
{
    op_list list = {0};
    int found = 0;
    mlirOperationWalk(root->op, mg_ir_collect_op, &list, MlirWalkPreOrder);
    for (size_t i = 0; i < list.n && !found; i++) {
        MlirOperation op = list.ops[i];
        for (intptr_t r = 0; r < mlirOperationGetNumResults(op) && !found; r++)
            found = value_used_outside(mlirOperationGetResult(op, r), root->op);
        for (intptr_t g = 0; g < mlirOperationGetNumRegions(op) && !found; g++)
            for (MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, g)); !mlirBlockIsNull(b) && !found;
                 b = mlirBlockGetNextInRegion(b))
                for (intptr_t a = 0; a < mlirBlockGetNumArguments(b) && !found; a++)
                    found = value_used_outside(mlirBlockGetArgument(b, a), root->op);
    }
    free(list.ops);
    if (found) {
        PyErr_SetString(PyExc_ValueError, "a value of this module is used by an operation outside it (a detached "
                        "operation or clone); a pass could free what it uses: insert or drop that operation first");
        return -1;
    }
    return 0;
}

static PyObject *Operation_erase(mg_ir_Operation *self, PyObject *unused)
{
    OP_CHECKED(self);
    if (has_outside_uses(self->op))
        return mg_raise(PyExc_ValueError, "cannot erase an operation whose results (or nested values) still have uses");
    if (has_outside_branches_in(self->op))
        return mg_raise(PyExc_ValueError, "cannot erase an operation holding a block that is a branch target outside it");
    if (mg_ir_invalidate_under(self, 1) < 0)
        return NULL;
    mlirOperationDestroy(self->op);
    Py_CLEAR(self->parent);
    Py_RETURN_NONE;
}

static PyObject *Operation_clone(mg_ir_Operation *self, PyObject *unused)
{
    OP_CHECKED(self);
    MlirOperation copy = mlirOperationClone(self->op);
    mg_ir_Operation *clone = mg_ir_op_new(self->context, copy, NULL, 1);
    if (clone == NULL)
        return NULL;
    /* The copy may use values defined around the original. */
    mg_ir_Operation *root = self;
    while (root->parent != NULL)
        root = (mg_ir_Operation *)root->parent;
    clone->keepalive = Py_NewRef((PyObject *)root);
    return (PyObject *)clone;
}

static Py_hash_t Operation_hash(mg_ir_Operation *self) { return _Py_HashPointer(self->op.ptr); }

static PyObject *Operation_richcompare(mg_ir_Operation *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
        Py_RETURN_NOTIMPLEMENTED;
    mg_ir_Operation *o = (mg_ir_Operation *)other;
    int eq = self == o || (self->valid && o->valid && self->op.ptr == o->op.ptr);
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyMethodDef Operation_methods[] = {
    {"create", (PyCFunction)(void (*)(void))Operation_create, METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "Operation.create(name, operands=(), results=(), attributes=None, regions=0, successors=(), *, "
     "location=None, detached=False, context=None): a new operation of a registered dialect, "
     "inserted at the current InsertionPoint unless detached (or there is none)."},
    {"get_attribute", (PyCFunction)Operation_get_attribute, METH_O, "KeyError if absent."},
    {"set_attribute", (PyCFunction)(void (*)(void))Operation_set_attribute, METH_FASTCALL, NULL},
    {"remove_attribute", (PyCFunction)Operation_remove_attribute, METH_O, NULL},
    {"verify", (PyCFunction)mg_ir_Operation_verify, METH_NOARGS, "True, or MLIRError with the diagnostics."},
    {"print", (PyCFunction)(void (*)(void))mg_ir_Operation_print, METH_VARARGS | METH_KEYWORDS,
     "print(*, generic=False, debug_info=False) -> str"},
    {"walk", (PyCFunction)(void (*)(void))mg_ir_Operation_walk, METH_VARARGS | METH_KEYWORDS,
     "walk(*, post_order=False) -> this operation and every nested one, as a list."},
    {"erase", (PyCFunction)Operation_erase, METH_NOARGS,
     "Erases the operation and what it holds; their wrappers become invalid."},
    {"clone", (PyCFunction)Operation_clone, METH_NOARGS, "A detached deep copy."},
    {NULL},
};

static PyGetSetDef Operation_getset[] = {
    {"name", (getter)Operation_get_name, NULL, NULL, NULL},
    {"context", (getter)Operation_get_context, NULL, NULL, NULL},
    {"location", (getter)Operation_get_location, NULL, NULL, NULL},
    {"operands", (getter)Operation_get_operands, NULL, NULL, NULL},
    {"results", (getter)Operation_get_results, NULL, NULL, NULL},
    {"result", (getter)Operation_get_result, NULL, "The only result.", NULL},
    {"regions", (getter)Operation_get_regions, NULL, NULL, NULL},
    {"successors", (getter)Operation_get_successors, NULL, NULL, NULL},
    {"parent", (getter)Operation_get_parent, NULL, "The enclosing operation, or None.", NULL},
    {"block", (getter)Operation_get_block, NULL, "The block holding it, or None.", NULL},
    {"attributes", (getter)Operation_get_attributes, NULL, "A dict snapshot of the attributes.", NULL},
    {"is_valid", (getter)Operation_get_is_valid, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Operation_slots[] = {
    {Py_tp_doc, "An MLIR operation; see Operation.create."},
    {Py_tp_dealloc, mg_ir_Operation_dealloc},
    {Py_tp_hash, Operation_hash},
    {Py_tp_richcompare, Operation_richcompare},
    {Py_tp_str, mg_ir_Operation_str},
    {Py_tp_repr, Operation_repr},
    {Py_tp_methods, Operation_methods},
    {Py_tp_getset, Operation_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Operation_spec = {"mlirgpu.ir.Operation", sizeof(mg_ir_Operation), 0,
                                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Operation_slots};

