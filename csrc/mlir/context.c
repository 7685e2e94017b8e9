/* mlirgpu.ir.Context, the per-thread stacks of `with` blocks, and the pool
 * of private contexts that the pipeline, the engines and the CPU backend
 * borrow. */
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
PyTypeObject *mg_ir_ContextType, *mg_ir_LocationType, *mg_ir_TypeType, *mg_ir_AttributeType, *mg_ir_OperationType,
    *mg_ir_BlockType, *mg_ir_RegionType, *mg_ir_ValueType, *mg_ir_InsertionPointType;
PyTypeObject *mg_ir_ModuleType;
/* ===================================================================== */
/* Per-thread stacks for `with` (contexts, locations, insertion points)   */
/* ===================================================================== */

static PyObject *stack_get(PyObject *key) /* borrowed */
{
    PyObject *dict = PyThreadState_GetDict();
    if (dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no thread state");
        return NULL;
    }
    PyObject *stack = PyDict_GetItemWithError(dict, key);
    if (stack == NULL && !PyErr_Occurred()) {
        stack = PyList_New(0);
        if (stack == NULL || PyDict_SetItem(dict, key, stack) < 0) {
            Py_XDECREF(stack);
            return NULL;
        }
        Py_DECREF(stack);
    }
    return stack;
}

PyObject *mg_ir_stack_top(PyObject *key) /* borrowed, NULL without error if empty */
{
    PyObject *stack = stack_get(key);
    if (stack == NULL || PyList_GET_SIZE(stack) == 0)
        return NULL;
    return PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
}

PyObject *mg_ir_stack_push(PyObject *key, PyObject *self)
{
    PyObject *stack = stack_get(key);
    if (stack == NULL || PyList_Append(stack, self) < 0)
        return NULL;
    return Py_NewRef(self);
}

PyObject *mg_ir_stack_pop(PyObject *key, PyObject *self)
{
    PyObject *stack = stack_get(key);
    if (stack == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0 || PyList_GET_ITEM(stack, n - 1) != self)
        return mg_raise(PyExc_RuntimeError, "%s exited out of order", Py_TYPE(self)->tp_name);
    if (PyList_SetSlice(stack, n - 1, n, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ===================================================================== */
/* Context                                                               */
/* ===================================================================== */

void mg_ir_fatal_error_handler(const char *reason)
{
    if (mg_fatal_target != NULL) {
        PyOS_snprintf(mg_fatal_reason, sizeof mg_fatal_reason, "%s", reason);
        siglongjmp(*mg_fatal_target, 1);
    }
    /* Outside a guard LLVM goes on to exit, as it would without us. */
}

static MlirContext context_new(int allow_unregistered)
{
    /* Kernels are small; MLIR's thread pool costs more than it saves, and a
     * single thread keeps diagnostics in order and inside the fatal-error
     * guard of the thread that runs the passes. */
    MlirContext context = mlirContextCreateWithThreading(false);
    MlirDialectRegistry registry = mlirDialectRegistryCreate();
    mlirRegisterAllDialects(registry);
    mlirContextAppendDialectRegistry(context, registry);
    mlirDialectRegistryDestroy(registry);
    mlirRegisterAllLLVMTranslations(context);
    mlirContextSetAllowUnregisteredDialects(context, allow_unregistered);
    return context;
}

/* Private contexts waiting for their next use, their dialects loaded by the
 * uses before: a fresh context per compile stage would load them again every
 * time, a fifth of a compile's time. Taken and given back with the GIL held,
 * so a context serves one thread at a time. MLIR never frees the types and
 * attributes a context uniques (every kernel's name, its constants), so a
 * context is retired after PRIVATE_USES uses: memory stays bounded however
 * many kernels a process compiles. */
#define PRIVATE_POOL 8
#define PRIVATE_USES 64
static mg_private_context private_pool[PRIVATE_POOL];
static int private_pooled;

mg_private_context mg_ir_private_take(int allow_unregistered, mg_diags *sink)
{
    mg_private_context taken = {{NULL}, 0, 0};
    if (private_pooled > 0) {
        taken = private_pool[--private_pooled];
        mlirContextSetAllowUnregisteredDialects(taken.context, allow_unregistered);
    } else
        taken.context = context_new(allow_unregistered);
    taken.handler = mlirContextAttachDiagnosticHandler(taken.context, mg_ir_diag_handler, sink, NULL);
    taken.uses++;
    return taken;
}

void mg_ir_private_give_back(mg_private_context *taken)
{
    /* The sink is the caller's: nothing may report into it after this. */
    mlirContextDetachDiagnosticHandler(taken->context, taken->handler);
    if (taken->uses < PRIVATE_USES && private_pooled < PRIVATE_POOL)
        private_pool[private_pooled++] = *taken;
    else {
        Py_BEGIN_ALLOW_THREADS
        mlirContextDestroy(taken->context);
        Py_END_ALLOW_THREADS
    }
    taken->context.ptr = NULL;
}

void mg_ir_print_located(MlirOperation op, mg_buf *out)
{
    MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
    mlirOpPrintingFlagsEnableDebugInfo(flags, true, false);
    /* The custom forms do not all parse back: MLIR 22 prints a vector.print
     * of a newline as a bare `vector.print`, which then takes the next
     * line's value as its operand. */
    mlirOpPrintingFlagsPrintGenericOpForm(flags);
    mlirOpPrintingFlagsAssumeVerified(flags); /* every caller verified it */
    mlirOperationPrintWithFlags(op, flags, mg_buf_callback, out);
    mlirOpPrintingFlagsDestroy(flags);
}

static mg_ir_Context *context_create(int allow_unregistered)
{
    mg_ir_Context *self = PyObject_New(mg_ir_Context, mg_ir_ContextType);
    if (self == NULL)
        return NULL;
    self->diags = (mg_diags){NULL, 0, 0};
    self->live_ops = PyDict_New();
    if (self->live_ops == NULL) {
        self->context.ptr = NULL;
        Py_DECREF(self);
        return NULL;
    }
    self->context = context_new(allow_unregistered);
    mlirContextAttachDiagnosticHandler(self->context, mg_ir_diag_handler, &self->diags, NULL);
    return self;
}

static PyObject *Context_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"allow_unregistered_dialects", NULL};
    int allow = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:Context", kwlist, &allow))
        return NULL;
    return (PyObject *)context_create(allow);
}

static void Context_dealloc(mg_ir_Context *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (!mlirContextIsNull(self->context)) {
        mg_ir_diag_clear(self);
        mlirContextDestroy(self->context);
    }
    free(self->diags.items);
    Py_XDECREF(self->live_ops);
    PyObject_Free(self);
    Py_DECREF(type);
}

/* The context of `with ctx:` blocks on this thread, else the default one. */
mg_ir_Context *mg_ir_context_current(void) /* borrowed */
{
    PyObject *top = mg_ir_stack_top(mg_ir_str_context_stack);
    if (top != NULL)
        return (mg_ir_Context *)top;
    if (PyErr_Occurred())
        return NULL;
    if (mg_ir_default_context == NULL)
        mg_ir_default_context = context_create(0);
    return mg_ir_default_context;
}

/* `context=None` arguments: the given Context, or the current one. */
mg_ir_Context *mg_ir_context_arg(PyObject *arg) /* borrowed */
{
    if (arg == NULL || arg == Py_None)
        return mg_ir_context_current();
    if (!PyObject_TypeCheck(arg, mg_ir_ContextType)) {
        PyErr_Format(PyExc_TypeError, "context must be an mlirgpu.ir.Context, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return (mg_ir_Context *)arg;
}

/* The arguments of every parse entry point, (text, *, context=None): the
 * context (borrowed) and the text, refused where its nesting would overflow
 * MLIR's recursive parser; the context's diagnostics are cleared. -1 with an
 * exception set. */
int mg_ir_parse_args(PyObject *args, PyObject *kwds, const char *format, mg_ir_Context **ctx, MlirStringRef *ref)
{
    static char *kwlist[] = {"text", "context", NULL};
    PyObject *text, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, format, kwlist, &text, &ctxarg))
        return -1;
    *ctx = mg_ir_context_arg(ctxarg);
    *ref = mg_ir_string_ref(text, "text");
    if (*ctx == NULL || ref->data == NULL || mg_ir_check_nesting(*ref) < 0)
        return -1;
    mg_ir_diag_clear(*ctx);
    return 0;
}

/* Replaces *seq (borrowed) by a new reference to a tuple of its items (None
 * and NULL stay as they are, with a reference). Called before the current
 * Context or InsertionPoint is looked at: iterating a generator runs Python
 * code, which may leave a `with` block and free what was looked at. */
int mg_ir_own_items(PyObject **seq, const char *message)
{
    if (*seq == NULL || *seq == Py_None) {
        Py_XINCREF(*seq);
        return 0;
    }
    PyObject *fast = PySequence_Fast(*seq, message);
    if (fast == NULL) {
        *seq = NULL;
        return -1;
    }
    *seq = PyList_Check(fast) ? PyList_AsTuple(fast) : Py_NewRef(fast);
    Py_DECREF(fast);
    return *seq == NULL ? -1 : 0;
}

static PyObject *Context_current(PyObject *cls, PyObject *unused)
{
    return Py_XNewRef((PyObject *)mg_ir_context_current());
}

static PyObject *Context_enter(PyObject *self, PyObject *unused) { return mg_ir_stack_push(mg_ir_str_context_stack, self); }
static PyObject *Context_exit(PyObject *self, PyObject *args) { return mg_ir_stack_pop(mg_ir_str_context_stack, self); }

static PyObject *Context_is_registered_operation(mg_ir_Context *self, PyObject *name)
{
    MlirStringRef ref = mg_ir_string_ref(name, "name");
    if (ref.data == NULL)
        return NULL;
    const char *dot = memchr(ref.data, '.', ref.length);
    if (dot != NULL)
        mlirContextGetOrLoadDialect(self->context, mlirStringRefCreate(ref.data, (size_t)(dot - ref.data)));
    return PyBool_FromLong(mlirContextIsRegisteredOperation(self->context, ref));
}

static PyObject *Context_get_allow_unregistered(mg_ir_Context *self, void *c)
{
    return PyBool_FromLong(mlirContextGetAllowUnregisteredDialects(self->context));
}

static PyMethodDef Context_methods[] = {
    {"current", (PyCFunction)Context_current, METH_NOARGS | METH_CLASS,
     "The innermost Context of a `with` on this thread, else the default Context."},
    {"__enter__", Context_enter, METH_NOARGS, NULL},
    {"__exit__", Context_exit, METH_VARARGS, NULL},
    {"is_registered_operation", (PyCFunction)Context_is_registered_operation, METH_O,
     "Whether an operation name (e.g. 'arith.addf') is known to this context."},
    {NULL},
};

static PyGetSetDef Context_getset[] = {
    {"allow_unregistered_dialects", (getter)Context_get_allow_unregistered, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Context_slots[] = {
    {Py_tp_doc, "Context(*, allow_unregistered_dialects=False): owns all IR. Every dialect "
                "and pass is registered; diagnostics become MLIRError."},
    {Py_tp_new, Context_new},
    {Py_tp_dealloc, Context_dealloc},
    {Py_tp_methods, Context_methods},
    {Py_tp_getset, Context_getset},
    {0, NULL},
};

PyType_Spec mg_ir_Context_spec = {"mlirgpu.ir.Context", sizeof(mg_ir_Context), 0,
                                   Py_TPFLAGS_DEFAULT, Context_slots};

