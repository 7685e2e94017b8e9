/* The IR layer (mlirgpu.ir): mlirgpu.ir.Module and mg_ir_init, the top of
 * the IR files. Its other types are in diagnostics.c, context.c, types.c,
 * attributes.c, views.c, operation.c and blocks.c; ownership rules are in
 * ir.h. */
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
/* Module                                                                */
/* ===================================================================== */

PyObject *mg_ir_module_adopt(mg_ir_Context *ctx, MlirOperation op)
{
    mg_ir_Operation *wrapped = mg_ir_op_new(ctx, op, NULL, 1);
    if (wrapped == NULL)
        return NULL;
    mg_ir_Module *self = PyObject_New(mg_ir_Module, mg_ir_ModuleType);
    if (self == NULL) {
        Py_DECREF(wrapped);
        return NULL;
    }
    self->operation = wrapped;
    return (PyObject *)self;
}

mg_ir_Operation *mg_ir_module_operation(PyObject *module)
{
    if (!PyObject_TypeCheck(module, mg_ir_ModuleType)) {
        PyErr_Format(PyExc_TypeError, "expected an mlirgpu.ir.Module, not %.100s", Py_TYPE(module)->tp_name);
        return NULL;
    }
    mg_ir_Operation *op = ((mg_ir_Module *)module)->operation;
    return mg_ir_op_check(op) < 0 ? NULL : op;
}

static PyObject *Module_create(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"location", "context", NULL};
    PyObject *locarg = NULL, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OO:Module.create", kwlist, &locarg, &ctxarg))
        return NULL;
    mg_ir_Context *ctx;
    if ((ctxarg == NULL || ctxarg == Py_None) && locarg != NULL && PyObject_TypeCheck(locarg, mg_ir_LocationType))
        ctx = ((mg_ir_Value_like *)locarg)->context;
    else
        ctx = mg_ir_context_arg(ctxarg);
    MlirLocation loc;
    if (ctx == NULL || mg_ir_location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    return mg_ir_module_adopt(ctx, mlirModuleGetOperation(mlirModuleCreateEmpty(loc)));
}

static PyObject *Module_parse(PyObject *cls, PyObject *args, PyObject *kwds)
{
    mg_ir_Context *ctx;
    MlirStringRef ref;
    if (mg_ir_parse_args(args, kwds, "U|$O:Module.parse", &ctx, &ref) < 0)
        return NULL;
    MlirModule m = mlirModuleCreateParse(ctx->context, ref);
    if (mg_ir_diag_check(ctx, mlirModuleIsNull(m), "cannot parse the module") < 0) {
        if (!mlirModuleIsNull(m))
            mlirModuleDestroy(m);
        return NULL;
    }
    return mg_ir_module_adopt(ctx, mlirModuleGetOperation(m));
}

static void Module_dealloc(mg_ir_Module *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(self->operation);
    PyObject_Free(self);
    Py_DECREF(type);
}

static PyObject *Module_get_operation(mg_ir_Module *self, void *c) { return Py_NewRef(self->operation); }
static PyObject *Module_get_context(mg_ir_Module *self, void *c) { return Py_NewRef(self->operation->context); }

static PyObject *Module_get_body(mg_ir_Module *self, void *c)
{
    OP_CHECKED(self->operation);
    return mg_ir_block_wrap(self->operation, mlirModuleGetBody(mlirModuleFromOperation(self->operation->op)));
}

static PyObject *Module_str(mg_ir_Module *self) { return mg_ir_Operation_str(self->operation); }

static PyObject *Module_verify(mg_ir_Module *self, PyObject *unused) { return mg_ir_Operation_verify(self->operation, NULL); }

static PyObject *Module_walk(mg_ir_Module *self, PyObject *args, PyObject *kwds)
{
    return mg_ir_Operation_walk(self->operation, args, kwds);
}

static PyObject *Module_print(mg_ir_Module *self, PyObject *args, PyObject *kwds)
{
    return mg_ir_Operation_print(self->operation, args, kwds);
}

static PyObject *Module_clone(mg_ir_Module *self, PyObject *unused)
{
    OP_CHECKED(self->operation);
    return mg_ir_module_adopt(self->operation->context, mlirOperationClone(self->operation->op));
}

static PyMethodDef Module_methods[] = {
    {"create", (PyCFunction)(void (*)(void))Module_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Module.create(*, location=None, context=None): an empty module."},
    {"parse", (PyCFunction)(void (*)(void))Module_parse, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Module.parse(text, *, context=None): MLIRError with the diagnostics on bad IR."},
    {"verify", (PyCFunction)Module_verify, METH_NOARGS, "True, or MLIRError with the diagnostics."},
    {"walk", (PyCFunction)(void (*)(void))Module_walk, METH_VARARGS | METH_KEYWORDS,
     "walk(*, post_order=False) -> every operation, as a list."},
    {"print", (PyCFunction)(void (*)(void))Module_print, METH_VARARGS | METH_KEYWORDS,
     "print(*, generic=False, debug_info=False) -> str"},
    {"clone", (PyCFunction)Module_clone, METH_NOARGS, NULL},
    {NULL},
};

static PyGetSetDef Module_getset[] = {
    {"operation", (getter)Module_get_operation, NULL, "The builtin.module operation.", NULL},
    {"body", (getter)Module_get_body, NULL, "The module's only block.", NULL},
    {"context", (getter)Module_get_context, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Module_slots[] = {
    {Py_tp_doc, "A builtin.module: Module.create() or Module.parse(text)."},
    {Py_tp_dealloc, Module_dealloc},
    {Py_tp_str, Module_str},
    {Py_tp_methods, Module_methods},
    {Py_tp_getset, Module_getset},
    {0, NULL},
};

static PyType_Spec Module_spec = {"mlirgpu.ir.Module", sizeof(mg_ir_Module), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Module_slots};

/* ===================================================================== */
/* Init                                                                  */
/* ===================================================================== */

int mg_ir_init(PyObject *module)
{
    mg_ir_str_context_stack = PyUnicode_InternFromString("mlirgpu.ir.context_stack");
    mg_ir_str_location_stack = PyUnicode_InternFromString("mlirgpu.ir.location_stack");
    mg_ir_str_ip_stack = PyUnicode_InternFromString("mlirgpu.ir.insertion_point_stack");
    if (!mg_ir_str_context_stack || !mg_ir_str_location_stack || !mg_ir_str_ip_stack)
        return -1;
    if (!(mg_ir_ContextType = mg_add_type(module, &mg_ir_Context_spec, NULL)) ||
        !(mg_ir_LocationType = mg_add_type(module, &mg_ir_Location_spec, NULL)) ||
        !(mg_ir_TypeType = mg_add_type(module, &mg_ir_Type_spec, NULL)) ||
        !(mg_ir_AttributeType = mg_add_type(module, &mg_ir_Attribute_spec, NULL)) ||
        !(mg_ir_OperationType = mg_add_type(module, &mg_ir_Operation_spec, NULL)) ||
        !(mg_ir_BlockType = mg_add_type(module, &mg_ir_Block_spec, NULL)) ||
        !(mg_ir_RegionType = mg_add_type(module, &mg_ir_Region_spec, NULL)) ||
        !(mg_ir_ValueType = mg_add_type(module, &mg_ir_Value_spec, NULL)) ||
        !(mg_ir_InsertionPointType = mg_add_type(module, &mg_ir_InsertionPoint_spec, NULL)) ||
        !(mg_ir_ModuleType = mg_add_type(module, &Module_spec, NULL)))
        return -1;
    if (PyModule_AddIntConstant(module, "DYNAMIC", (long)mlirShapedTypeGetDynamicSize()) < 0)
        return -1;
    LLVMInstallFatalErrorHandler(mg_ir_fatal_error_handler);
    return 0;
}
