/* The IR layer (mlirgpu.ir): Context, Location, Type, Attribute, Module,
 * Operation, Block, Region, Value and InsertionPoint over MLIR's C API.
 * Ownership rules are in ir.h. */
#include "mlir/ir.h"

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

static PyTypeObject *ContextType, *LocationType, *TypeType, *AttributeType, *OperationType,
    *BlockType, *RegionType, *ValueType, *InsertionPointType;
PyTypeObject *mg_ir_ModuleType;

/* Keys of the per-thread stacks that `with` statements push onto. */
static PyObject *str_context_stack, *str_location_stack, *str_ip_stack;
static mg_ir_Context *default_context; /* made on first use, kept for the process */

_Thread_local sigjmp_buf *mg_fatal_target;
_Thread_local char mg_fatal_reason[1024];
_Thread_local int mg_fatal_signal;

/* Signals by which code inside MLIR or LLVM crashes: a bad access, a trap
 * (llvm_unreachable, __builtin_trap), an illegal instruction, abort(). */
static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGABRT};
#define NCRASH (sizeof crash_signals / sizeof *crash_signals)
static struct sigaction previous[NCRASH];
/* Guarded bodies running, on any thread (some run without the GIL): the
 * handlers are ours while there is one. */
static int guards;
static pthread_mutex_t guards_lock = PTHREAD_MUTEX_INITIALIZER;

static void crash_handler(int signal, siginfo_t *info, void *context)
{
    if (mg_fatal_target != NULL) {
        mg_fatal_signal = signal;
        siglongjmp(*mg_fatal_target, 1);
    }
    /* Not a guarded thread: whoever handled the signal before us does. */
    for (size_t i = 0; i < NCRASH; i++)
        if (crash_signals[i] == signal)
            sigaction(signal, &previous[i], NULL);
    /* A fault comes again when the instruction runs again; a raised one must be raised again. */
    if (signal == SIGABRT || signal == SIGTRAP)
        raise(signal);
}

/* A thread's alternate signal stack, given back when the thread ends:
 * threads that compile come and go (thread pools). */
static pthread_key_t signal_stack_key;
static pthread_once_t signal_stack_once = PTHREAD_ONCE_INIT;

static void signal_stack_free(void *stack)
{
    stack_t off = {.ss_flags = SS_DISABLE};
    sigaltstack(&off, NULL);
    free(stack);
}

static void signal_stack_key_create(void) { pthread_key_create(&signal_stack_key, signal_stack_free); }

/* A stack for the handler, so that a stack overflow inside MLIR is caught too. */
static int ensure_signal_stack(void)
{
    pthread_once(&signal_stack_once, signal_stack_key_create);
    if (pthread_getspecific(signal_stack_key) != NULL)
        return 0;
    size_t size = 1 << 16;
    void *stack = malloc(size);
    if (stack == NULL)
        return -1;
    stack_t alternate = {.ss_sp = stack, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&alternate, NULL) < 0) {
        free(stack);
        return -1;
    }
    if (pthread_setspecific(signal_stack_key, stack) != 0) {
        signal_stack_free(stack);
        return -1;
    }
    return 0;
}

int mg_fatal_guarded(void (*body)(void *), void *arg)
{
    pthread_mutex_lock(&guards_lock);
    if (guards++ == 0) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = crash_handler;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        for (size_t i = 0; i < NCRASH; i++)
            sigaction(crash_signals[i], &action, &previous[i]);
    }
    pthread_mutex_unlock(&guards_lock);
    ensure_signal_stack(); /* without one, a stack overflow still ends the process */
    sigjmp_buf target;
    mg_fatal_signal = 0;
    mg_fatal_target = &target;
    /* The mask is saved: a crash leaves through the handler, its signal blocked. */
    volatile int crashed = 1;
    if (sigsetjmp(target, 1) == 0) {
        body(arg);
        crashed = 0;
    }
    mg_fatal_target = NULL;
    pthread_mutex_lock(&guards_lock);
    if (--guards == 0)
        for (size_t i = 0; i < NCRASH; i++)
            sigaction(crash_signals[i], &previous[i], NULL);
    pthread_mutex_unlock(&guards_lock);
    if (crashed && mg_fatal_signal != 0)
        PyOS_snprintf(mg_fatal_reason, sizeof mg_fatal_reason, "a crash (%s)",
                      mg_fatal_signal == SIGSEGV ? "SIGSEGV, a bad memory access"
                      : mg_fatal_signal == SIGBUS ? "SIGBUS, a bad memory access"
                      : mg_fatal_signal == SIGILL ? "SIGILL, a trap or an illegal instruction"
                      : mg_fatal_signal == SIGFPE ? "SIGFPE, an arithmetic fault"
                      : mg_fatal_signal == SIGTRAP ? "SIGTRAP, a trap"
                                                    : "SIGABRT, an abort");
    return crashed;
}

/* ===================================================================== */
/* Strings                                                               */
/* ===================================================================== */

PyObject *mg_ir_str(MlirStringRef ref)
{
    return PyUnicode_DecodeUTF8(ref.data ? ref.data : "", (Py_ssize_t)ref.length, "replace");
}

void mg_buf_callback(MlirStringRef chunk, void *userdata)
{
    mg_buf *buf = userdata;
    if (buf->failed)
        return;
    if (buf->len + chunk.length + 1 > buf->cap) {
        size_t cap = buf->cap ? buf->cap : 256;
        while (cap < buf->len + chunk.length + 1)
            cap *= 2;
        char *grown = realloc(buf->data, cap);
        if (grown == NULL) {
            buf->failed = 1;
            return;
        }
        buf->data = grown;
        buf->cap = cap;
    }
    memcpy(buf->data + buf->len, chunk.data, chunk.length);
    buf->len += chunk.length;
    buf->data[buf->len] = '\0';
}

PyObject *mg_buf_finish(mg_buf *buf)
{
    PyObject *result = buf->failed ? PyErr_NoMemory()
                                   : PyUnicode_DecodeUTF8(buf->data ? buf->data : "",
                                                          (Py_ssize_t)buf->len, "replace");
    free(buf->data);
    buf->data = NULL;
    buf->len = buf->cap = 0;
    return result;
}

/* A list of the n items make(owner, i) returns; NULL if one fails. */
typedef PyObject *(*item_maker)(void *owner, intptr_t i);

static PyObject *list_of(intptr_t n, item_maker make, void *owner)
{
    PyObject *list = PyList_New(n);
    for (intptr_t i = 0; list != NULL && i < n; i++) {
        PyObject *item = make(owner, i);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static char *buf_take(mg_buf *buf)
{
    if (buf->failed || buf->data == NULL) {
        free(buf->data);
        return strdup("");
    }
    return buf->data;
}

static MlirStringRef string_ref(PyObject *str, const char *what)
{
    Py_ssize_t len;
    const char *data = PyUnicode_Check(str) ? PyUnicode_AsUTF8AndSize(str, &len) : NULL;
    if (data == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", what, Py_TYPE(str)->tp_name);
        return (MlirStringRef){NULL, 0};
    }
    return mlirStringRefCreate(data, (size_t)len);
}

/* ===================================================================== */
/* Diagnostics                                                           */
/* ===================================================================== */

static MlirLogicalResult diag_handler(MlirDiagnostic diag, void *userdata)
{
    mg_diags *diags = userdata;
    intptr_t nnotes = mlirDiagnosticGetNumNotes(diag);
    for (intptr_t i = -1; i < nnotes; i++) {
        MlirDiagnostic d = i < 0 ? diag : mlirDiagnosticGetNote(diag, i);
        if (diags->count == diags->cap) {
            size_t cap = diags->cap ? 2 * diags->cap : 8;
            mg_diag *grown = realloc(diags->items, cap * sizeof *grown);
            if (grown == NULL)
                break;
            diags->items = grown;
            diags->cap = cap;
        }
        mg_buf loc = {0}, msg = {0};
        mlirLocationPrint(mlirDiagnosticGetLocation(d), mg_buf_callback, &loc);
        mlirDiagnosticPrint(d, mg_buf_callback, &msg);
        /* MLIR attaches the whole failing operation to some diagnostics; its
         * first line names it, the rest would bury the message. */
        static const char seen[] = "see current operation:";
        char *newline = msg.data ? strchr(msg.data, '\n') : NULL;
        if (newline != NULL && strncmp(msg.data, seen, sizeof seen - 1) == 0) {
            char *second = strchr(newline + 1, '\n');
            if (second != NULL)
                *second = '\0';
        }
        diags->items[diags->count++] = (mg_diag){
            i < 0 ? (int)mlirDiagnosticGetSeverity(d) : (int)MlirDiagnosticNote,
            buf_take(&loc), buf_take(&msg)};
    }
    /* Handled: MLIR prints nothing; the caller raises. */
    return mlirLogicalResultSuccess();
}

void mg_diags_clear(mg_diags *diags)
{
    for (size_t i = 0; i < diags->count; i++) {
        free(diags->items[i].location);
        free(diags->items[i].message);
    }
    diags->count = 0;
}

int mg_diags_has_error(const mg_diags *diags)
{
    for (size_t i = 0; i < diags->count; i++)
        if (diags->items[i].severity == MlirDiagnosticError)
            return 1;
    return 0;
}

void mg_ir_diag_clear(mg_ir_Context *ctx) { mg_diags_clear(&ctx->diags); }
int mg_ir_diag_has_error(mg_ir_Context *ctx) { return mg_diags_has_error(&ctx->diags); }
PyObject *mg_ir_diag_raise(mg_ir_Context *ctx, PyObject *cls, const char *what)
{
    return mg_diags_raise(&ctx->diags, cls, what);
}
int mg_ir_diag_warn(mg_ir_Context *ctx) { return mg_diags_warn(&ctx->diags); }

static const char *severity_name(int severity)
{
    switch (severity) {
    case MlirDiagnosticError: return "error";
    case MlirDiagnosticWarning: return "warning";
    case MlirDiagnosticNote: return "note";
    default: return "remark";
    }
}

PyObject *mg_diags_raise(mg_diags *diags, PyObject *cls, const char *what)
{
    PyObject *list = PyList_New(0), *text = NULL, *exc = NULL;
    PyObject *lines = PyList_New(0);
    if (list == NULL || lines == NULL)
        goto error;
    PyObject *head = PyUnicode_FromString(what);
    if (head == NULL || PyList_Append(lines, head) < 0) {
        Py_XDECREF(head);
        goto error;
    }
    Py_DECREF(head);
    for (size_t i = 0; i < diags->count; i++) {
        mg_diag *d = &diags->items[i];
        PyObject *item = Py_BuildValue("(sss)", severity_name(d->severity), d->location, d->message);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            goto error;
        }
        Py_DECREF(item);
        PyObject *line = PyUnicode_FromFormat("%s%s: %s: %s", d->severity == MlirDiagnosticNote ? "  " : "",
                                              d->location, severity_name(d->severity), d->message);
        if (line == NULL || PyList_Append(lines, line) < 0) {
            Py_XDECREF(line);
            goto error;
        }
        Py_DECREF(line);
    }
    PyObject *sep = PyUnicode_FromString("\n");
    if (sep == NULL)
        goto error;
    text = PyUnicode_Join(sep, lines);
    Py_DECREF(sep);
    if (text == NULL)
        goto error;
    exc = PyObject_CallOneArg(cls, text);
    if (exc == NULL || PyObject_SetAttrString(exc, "diagnostics", list) < 0)
        goto error;
    PyErr_SetObject(cls, exc);
error:
    mg_diags_clear(diags);
    Py_XDECREF(exc);
    Py_XDECREF(text);
    Py_XDECREF(lines);
    Py_XDECREF(list);
    return NULL;
}

int mg_diags_warn(mg_diags *diags)
{
    int rc = 0;
    for (size_t i = 0; i < diags->count && rc == 0; i++) {
        mg_diag *d = &diags->items[i];
        if (d->severity == MlirDiagnosticNote)
            continue;
        if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%s: %s: %s", d->location,
                             severity_name(d->severity), d->message) < 0)
            rc = -1;
    }
    mg_diags_clear(diags);
    return rc;
}

/* Raises the collected diagnostics if there is an error among them (or
 * `failed` says the call failed), else turns the rest into warnings. */
static int diag_check(mg_ir_Context *ctx, int failed, const char *what)
{
    if (failed || mg_ir_diag_has_error(ctx)) {
        mg_ir_diag_raise(ctx, mg_st->MLIRError, what);
        return -1;
    }
    return mg_ir_diag_warn(ctx);
}

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

static PyObject *stack_top(PyObject *key) /* borrowed, NULL without error if empty */
{
    PyObject *stack = stack_get(key);
    if (stack == NULL || PyList_GET_SIZE(stack) == 0)
        return NULL;
    return PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
}

static PyObject *stack_push(PyObject *key, PyObject *self)
{
    PyObject *stack = stack_get(key);
    if (stack == NULL || PyList_Append(stack, self) < 0)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *stack_pop(PyObject *key, PyObject *self)
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

static void fatal_error_handler(const char *reason)
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
    taken.handler = mlirContextAttachDiagnosticHandler(taken.context, diag_handler, sink, NULL);
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
    mg_ir_Context *self = PyObject_New(mg_ir_Context, ContextType);
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
    mlirContextAttachDiagnosticHandler(self->context, diag_handler, &self->diags, NULL);
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
static mg_ir_Context *context_current(void) /* borrowed */
{
    PyObject *top = stack_top(str_context_stack);
    if (top != NULL)
        return (mg_ir_Context *)top;
    if (PyErr_Occurred())
        return NULL;
    if (default_context == NULL)
        default_context = context_create(0);
    return default_context;
}

/* `context=None` arguments: the given Context, or the current one. */
static mg_ir_Context *context_arg(PyObject *arg) /* borrowed */
{
    if (arg == NULL || arg == Py_None)
        return context_current();
    if (!PyObject_TypeCheck(arg, ContextType)) {
        PyErr_Format(PyExc_TypeError, "context must be an mlirgpu.ir.Context, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return (mg_ir_Context *)arg;
}

/* Replaces *seq (borrowed) by a new reference to a tuple of its items (None
 * and NULL stay as they are, with a reference). Called before the current
 * Context or InsertionPoint is looked at: iterating a generator runs Python
 * code, which may leave a `with` block and free what was looked at. */
static int own_items(PyObject **seq, const char *message)
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
    return Py_XNewRef((PyObject *)context_current());
}

static PyObject *Context_enter(PyObject *self, PyObject *unused) { return stack_push(str_context_stack, self); }
static PyObject *Context_exit(PyObject *self, PyObject *args) { return stack_pop(str_context_stack, self); }

static PyObject *Context_is_registered_operation(mg_ir_Context *self, PyObject *name)
{
    MlirStringRef ref = string_ref(name, "name");
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

static PyType_Spec Context_spec = {"mlirgpu.ir.Context", sizeof(mg_ir_Context), 0,
                                   Py_TPFLAGS_DEFAULT, Context_slots};

/* ===================================================================== */
/* Location, Type, Attribute: uniqued values that hold their Context      */
/* ===================================================================== */

typedef struct {
    PyObject_HEAD
    union { MlirLocation loc; MlirType type; MlirAttribute attr; const void *ptr; } h;
    mg_ir_Context *context;
} mg_ir_Value_like; /* layout shared by Location, Type and Attribute */

static PyObject *uniqued_new(PyTypeObject *type, mg_ir_Context *ctx, const void *ptr)
{
    mg_ir_Value_like *self = PyObject_New(mg_ir_Value_like, type);
    if (self == NULL)
        return NULL;
    self->h.ptr = ptr;
    self->context = (mg_ir_Context *)Py_NewRef(ctx);
    return (PyObject *)self;
}

#define wrap_location(ctx, l) uniqued_new(LocationType, (ctx), (l).ptr)
#define wrap_type(ctx, t) uniqued_new(TypeType, (ctx), (t).ptr)
#define wrap_attribute(ctx, a) uniqued_new(AttributeType, (ctx), (a).ptr)

static void uniqued_dealloc(mg_ir_Value_like *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(self->context);
    PyObject_Free(self);
    Py_DECREF(type);
}

static Py_hash_t uniqued_hash(mg_ir_Value_like *self) { return _Py_HashPointer(self->h.ptr); }

static PyObject *uniqued_richcompare(mg_ir_Value_like *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
        Py_RETURN_NOTIMPLEMENTED;
    /* Uniqued in their context: equal handles mean equal values. */
    int eq = self->h.ptr == ((mg_ir_Value_like *)other)->h.ptr;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *uniqued_get_context(mg_ir_Value_like *self, void *c) { return Py_NewRef(self->context); }

/* Type(f32), Attribute(3 : i32), Location(loc("a.py":3:0)) */
static PyObject *uniqued_repr(PyObject *self)
{
    PyObject *text = PyObject_Str(self);
    if (text == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("%s(%U)", strrchr(Py_TYPE(self)->tp_name, '.') + 1, text);
    Py_DECREF(text);
    return r;
}

/* Checks that `obj` is of `type` and belongs to `ctx`; borrowed. */
static mg_ir_Value_like *uniqued_arg(PyObject *obj, PyTypeObject *type, mg_ir_Context *ctx, const char *what)
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

static int uniqued_seq(PyObject *seq, PyTypeObject *type, mg_ir_Context *ctx, const char *what,
                       const void ***out, Py_ssize_t *n);

/* The location for new IR: the argument, else the innermost `with loc:`,
 * else unknown. */
static int location_arg(PyObject *arg, mg_ir_Context *ctx, MlirLocation *out)
{
    if (arg == NULL || arg == Py_None) {
        arg = stack_top(str_location_stack);
        if (arg == NULL) {
            if (PyErr_Occurred())
                return -1;
            *out = mlirLocationUnknownGet(ctx->context);
            return 0;
        }
    }
    mg_ir_Value_like *loc = uniqued_arg(arg, LocationType, ctx, "location");
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
    mg_ir_Context *ctx = context_arg(ctxarg);
    if (ctx == NULL)
        return NULL;
    MlirStringRef name = string_ref(filename, "filename");
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
    mg_ir_Context *ctx = context_arg(ctxarg);
    if (ctx == NULL)
        return NULL;
    MlirLocation childloc = mlirLocationUnknownGet(ctx->context);
    if (child != NULL && child != Py_None) {
        mg_ir_Value_like *c = uniqued_arg(child, LocationType, ctx, "child");
        if (c == NULL)
            return NULL;
        childloc = c->h.loc;
    }
    MlirStringRef ref = string_ref(name, "name");
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
    mg_ir_Context *ctx = context_arg(ctxarg);
    return ctx ? wrap_location(ctx, mlirLocationUnknownGet(ctx->context)) : NULL;
}

static PyObject *Location_fused(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"locations", "context", NULL};
    PyObject *seq, *ctxarg = NULL;
    const void **locs;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Location.fused", kwlist, &seq, &ctxarg) ||
        own_items(&seq, "expected a sequence") < 0)
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    PyObject *result = NULL;
    if (ctx != NULL && uniqued_seq(seq, LocationType, ctx, "location", &locs, &n) == 0) {
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

static PyObject *Location_enter(PyObject *self, PyObject *unused) { return stack_push(str_location_stack, self); }
static PyObject *Location_exit(PyObject *self, PyObject *args) { return stack_pop(str_location_stack, self); }

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
    {"context", (getter)uniqued_get_context, NULL, NULL, NULL},
    {"filename", (getter)Location_get_filename, NULL, "File of a file:line:col location, else None.", NULL},
    {"line", (getter)Location_get_line, NULL, NULL, NULL},
    {"col", (getter)Location_get_col, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot Location_slots[] = {
    {Py_tp_doc, "A source location; `with loc:` makes it the default for new operations."},
    {Py_tp_dealloc, uniqued_dealloc},
    {Py_tp_hash, uniqued_hash},
    {Py_tp_richcompare, uniqued_richcompare},
    {Py_tp_str, Location_str},
    {Py_tp_repr, uniqued_repr},
    {Py_tp_methods, Location_methods},
    {Py_tp_getset, Location_getset},
    {0, NULL},
};

static PyType_Spec Location_spec = {"mlirgpu.ir.Location", sizeof(mg_ir_Value_like), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                    Location_slots};

/* ---- Type ---- */

/* Parses `text` with the parser `parse` (type or attribute); raises
 * MLIRError with MLIR's diagnostics on failure. */
static PyObject *Type_parse(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"text", "context", NULL};
    PyObject *text, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$O:Type.parse", kwlist, &text, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    MlirStringRef ref = string_ref(text, "text");
    if (ctx == NULL || ref.data == NULL)
        return NULL;
    mg_ir_diag_clear(ctx);
    MlirType t = mlirTypeParseGet(ctx->context, ref);
    if (diag_check(ctx, mlirTypeIsNull(t), "cannot parse type") < 0)
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
    mg_ir_Context *ctx = context_arg(ctxarg);
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
        mg_ir_Context *ctx = context_arg(ctxarg);                                           \
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
    mg_ir_Value_like *et = uniqued_arg(elem, TypeType, NULL, "element_type");
    if (et == NULL)
        return NULL;
    mg_ir_Context *ctx = et->context;
    MlirLocation loc;
    if (location_arg(locarg, ctx, &loc) < 0)
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
        mg_ir_Value_like *a = uniqued_arg(space, AttributeType, ctx, "memory_space");
        if (a == NULL)
            return NULL;
        space_attr = a->h.attr;
    }
    MlirAttribute layout = mlirAttributeGetNull();
    if (layoutarg != Py_None) {
        mg_ir_Value_like *a = uniqued_arg(layoutarg, AttributeType, ctx, "layout");
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
    if (diag_check(ctx, mlirTypeIsNull(t), "invalid memref type") < 0)
        return NULL;
    return wrap_type(ctx, t);
}

static PyObject *Type_vector(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"shape", "element_type", "location", NULL};
    PyObject *shape, *elem, *locarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|$O:Type.vector", kwlist, &shape, &elem, &locarg))
        return NULL;
    mg_ir_Value_like *et = uniqued_arg(elem, TypeType, NULL, "element_type");
    if (et == NULL)
        return NULL;
    MlirLocation loc;
    if (location_arg(locarg, et->context, &loc) < 0)
        return NULL;
    int64_t *dims;
    intptr_t rank;
    if (shape_arg(shape, &dims, &rank, 0) < 0)
        return NULL;
    mg_ir_diag_clear(et->context);
    MlirType t = mlirVectorTypeGetChecked(loc, rank, dims, et->h.type);
    PyMem_Free(dims);
    if (diag_check(et->context, mlirTypeIsNull(t), "invalid vector type") < 0)
        return NULL;
    return wrap_type(et->context, t);
}

/* Fills `out` with the handles of a sequence of Types (or Attributes, or
 * Locations: anything of the uniqued layout) from `ctx`. */
static int uniqued_seq(PyObject *seq, PyTypeObject *type, mg_ir_Context *ctx, const char *what,
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
        mg_ir_Value_like *v = uniqued_arg(PySequence_Fast_GET_ITEM(fast, i), type, ctx, what);
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
    if (own_items(&inputs, "expected a sequence") < 0)
        return NULL;
    if (own_items(&results, "expected a sequence") < 0) {
        Py_DECREF(inputs);
        return NULL;
    }
    mg_ir_Context *ctx = context_arg(ctxarg);
    if (ctx == NULL || uniqued_seq(inputs, TypeType, ctx, "input type", &in, &nin) < 0 ||
        uniqued_seq(results, TypeType, ctx, "result type", &out, &nout) < 0)
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
        return list_of(mlirFunctionTypeGetNumResults(t), function_result, self);
    return list_of(mlirFunctionTypeGetNumInputs(t), function_input, self);
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
    {"context", (getter)uniqued_get_context, NULL, NULL, NULL},
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
    {Py_tp_dealloc, uniqued_dealloc},
    {Py_tp_hash, uniqued_hash},
    {Py_tp_richcompare, uniqued_richcompare},
    {Py_tp_str, Type_str},
    {Py_tp_repr, uniqued_repr},
    {Py_tp_methods, Type_methods},
    {Py_tp_getset, Type_getset},
    {0, NULL},
};

static PyType_Spec Type_spec = {"mlirgpu.ir.Type", sizeof(mg_ir_Value_like), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Type_slots};

/* ---- Attribute ---- */

static PyObject *Attribute_parse(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"text", "context", NULL};
    PyObject *text, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$O:Attribute.parse", kwlist, &text, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    MlirStringRef ref = string_ref(text, "text");
    if (ctx == NULL || ref.data == NULL)
        return NULL;
    mg_ir_diag_clear(ctx);
    MlirAttribute a = mlirAttributeParseGet(ctx->context, ref);
    if (diag_check(ctx, mlirAttributeIsNull(a), "cannot parse attribute") < 0)
        return NULL;
    return wrap_attribute(ctx, a);
}

/* The `type=` of a typed attribute constructor, or `fallback` in ctx. */
static mg_ir_Value_like *attr_type_arg(PyObject *arg, mg_ir_Context **ctx, PyObject *ctxarg)
{
    *ctx = NULL;
    if (arg != NULL && arg != Py_None) {
        mg_ir_Value_like *t = uniqued_arg(arg, TypeType, NULL, "type");
        if (t != NULL)
            *ctx = t->context;
        return t;
    }
    *ctx = context_arg(ctxarg);
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
    if (diag_check(ctx, mlirAttributeIsNull(a), "invalid float attribute") < 0)
        return NULL;
    return wrap_attribute(ctx, a);
}

static PyObject *Attribute_string(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"value", "context", NULL};
    PyObject *value, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$O:Attribute.string", kwlist, &value, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    MlirStringRef ref = string_ref(value, "value");
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
    mg_ir_Context *ctx = context_arg(ctxarg);
    MlirStringRef ref = string_ref(value, "name");
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
    mg_ir_Context *ctx = context_arg(ctxarg);
    return ctx ? wrap_attribute(ctx, mlirBoolAttrGet(ctx->context, value)) : NULL;
}

static PyObject *Attribute_unit(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"context", NULL};
    PyObject *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$O:Attribute.unit", kwlist, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    return ctx ? wrap_attribute(ctx, mlirUnitAttrGet(ctx->context)) : NULL;
}

static PyObject *Attribute_type_attr(PyObject *cls, PyObject *arg)
{
    mg_ir_Value_like *t = uniqued_arg(arg, TypeType, NULL, "type");
    return t ? wrap_attribute(t->context, mlirTypeAttrGet(t->h.type)) : NULL;
}

static PyObject *Attribute_array(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"elements", "context", NULL};
    PyObject *seq, *ctxarg = NULL;
    const void **items;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:Attribute.array", kwlist, &seq, &ctxarg) ||
        own_items(&seq, "expected a sequence") < 0)
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    PyObject *r = NULL;
    if (ctx != NULL && uniqued_seq(seq, AttributeType, ctx, "array element", &items, &n) == 0) {
        r = wrap_attribute(ctx, mlirArrayAttrGet(ctx->context, n, (MlirAttribute *)items));
        PyMem_Free(items);
    }
    Py_DECREF(seq);
    return r;
}

/* Named attributes from a {str: Attribute} mapping; *out freed by caller. */
static int named_attributes(PyObject *mapping, mg_ir_Context *ctx, MlirNamedAttribute **out, Py_ssize_t *n)
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
        MlirStringRef name = string_ref(key, "attribute name");
        mg_ir_Value_like *a = name.data ? uniqued_arg(value, AttributeType, ctx, "attribute value") : NULL;
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
    mg_ir_Context *ctx = context_arg(ctxarg);
    if (ctx == NULL || named_attributes(mapping, ctx, &named, &n) < 0)
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
    mg_ir_Context *ctx = context_arg(ctxarg);
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
    mg_ir_Context *ctx = context_arg(ctxarg);
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
    mg_ir_Context *ctx = context_arg(ctxarg);
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
    mg_ir_Context *ctx = context_arg(ctxarg);
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
        return list_of(mlirArrayAttrGetNumElements(a), array_element, self);
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
        return list_of(mlirDenseArrayGetNumElements(a), dense_element, self);
    return mg_raise(PyExc_TypeError, "this kind of attribute has no Python value; use str()");
}

static PyMethodDef Attribute_methods[] = {
    {"parse", (PyCFunction)(void (*)(void))Attribute_parse, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
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
    {"context", (getter)uniqued_get_context, NULL, NULL, NULL},
    {"type", (getter)Attribute_get_type, NULL, "The type of a typed attribute, else None.", NULL},
    {"value", (getter)Attribute_get_value, NULL,
     "The Python value of an integer, float, bool, string, symbol, type, unit, array, "
     "dictionary or dense array attribute.", NULL},
    {NULL},
};

static PyType_Slot Attribute_slots[] = {
    {Py_tp_doc, "An MLIR attribute, uniqued in its Context."},
    {Py_tp_dealloc, uniqued_dealloc},
    {Py_tp_hash, uniqued_hash},
    {Py_tp_richcompare, uniqued_richcompare},
    {Py_tp_str, Attribute_str},
    {Py_tp_repr, uniqued_repr},
    {Py_tp_methods, Attribute_methods},
    {Py_tp_getset, Attribute_getset},
    {0, NULL},
};

static PyType_Spec Attribute_spec = {"mlirgpu.ir.Attribute", sizeof(mg_ir_Value_like), 0,
                                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                     Attribute_slots};

/* ===================================================================== */
/* Operation, Block, Region, Value                                       */
/* ===================================================================== */

/* Blocks, regions and values are views into an operation: each holds the
 * wrapper of the operation it belongs to, and is valid while that is. */
typedef struct {
    PyObject_HEAD
    MlirBlock block;
    mg_ir_Operation *anchor; /* the operation whose region holds the block */
} mg_ir_Block;

typedef struct {
    PyObject_HEAD
    MlirRegion region;
    mg_ir_Operation *anchor;
} mg_ir_Region;

typedef struct {
    PyObject_HEAD
    MlirValue value;
    mg_ir_Operation *anchor; /* defining operation, or the block argument's */
} mg_ir_ValueObject;

static int op_check(mg_ir_Operation *op)
{
    if (!op->valid) {
        PyErr_SetString(mg_st->InvalidObjectError,
                        "the operation was erased, or rewritten by a pass that ran over it");
        return -1;
    }
    return 0;
}

static int anchor_check(mg_ir_Operation *anchor, const char *what)
{
    if (!anchor->valid) {
        PyErr_Format(mg_st->InvalidObjectError,
                     "the %s belongs to an operation that was erased or rewritten by a pass", what);
        return -1;
    }
    return 0;
}

static PyObject *live_key(MlirOperation op) { return PyLong_FromVoidPtr(op.ptr); }

static mg_ir_Operation *op_new(mg_ir_Context *ctx, MlirOperation op, PyObject *parent, int owned)
{
    PyObject *key = live_key(op), *addr = NULL;
    mg_ir_Operation *self = PyObject_New(mg_ir_Operation, OperationType);
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
    mg_ir_Operation *self = op_new(ctx, op, parent, 0);
    Py_XDECREF(parent);
    return (PyObject *)self;
}

/* Marks every live wrapper strictly under `root` (found through the wrappers'
 * own parent chains: the IR they point into may already be freed) invalid. */
static int invalidate_under(mg_ir_Operation *root, int include_root)
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
    if (invalidate_under(root, 0) < 0)
        PyErr_WriteUnraisable((PyObject *)root);
    PyErr_Restore(type, value, tb);
}

static void Operation_dealloc(mg_ir_Operation *self)
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

static PyObject *block_wrap(mg_ir_Operation *anchor, MlirBlock block)
{
    mg_ir_Block *self = PyObject_New(mg_ir_Block, BlockType);
    if (self == NULL)
        return NULL;
    self->block = block;
    self->anchor = (mg_ir_Operation *)Py_NewRef(anchor);
    return (PyObject *)self;
}

/* The wrapper of the operation owning `block`, new ref. */
static mg_ir_Operation *block_owner(mg_ir_Context *ctx, MlirBlock block)
{
    return (mg_ir_Operation *)mg_ir_operation_wrap(ctx, mlirBlockGetParentOperation(block));
}

static PyObject *region_wrap(mg_ir_Operation *anchor, MlirRegion region)
{
    mg_ir_Region *self = PyObject_New(mg_ir_Region, RegionType);
    if (self == NULL)
        return NULL;
    self->region = region;
    self->anchor = (mg_ir_Operation *)Py_NewRef(anchor);
    return (PyObject *)self;
}

static PyObject *value_wrap(mg_ir_Operation *anchor, MlirValue value)
{
    mg_ir_ValueObject *self = PyObject_New(mg_ir_ValueObject, ValueType);
    if (self == NULL)
        return NULL;
    self->value = value;
    self->anchor = (mg_ir_Operation *)Py_NewRef(anchor);
    return (PyObject *)self;
}

static void view_dealloc(mg_ir_Block *self) /* Block, Region and Value share the layout's tail */
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(self->anchor);
    PyObject_Free(self);
    Py_DECREF(type);
}

static Py_hash_t view_hash(mg_ir_Block *self) { return _Py_HashPointer(self->block.ptr); }

static PyObject *view_richcompare(mg_ir_Block *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
        Py_RETURN_NOTIMPLEMENTED;
    int eq = self->block.ptr == ((mg_ir_Block *)other)->block.ptr;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

/* ---- insertion ---- */

typedef struct { MlirOperation *ops; size_t n, cap; int failed; } op_list;

static MlirWalkResult collect_op(MlirOperation op, void *userdata)
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


static MlirOperation ir_root(MlirOperation op)
{
    for (MlirOperation p = op; !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p))
        op = p;
    return op;
}

/* The operation defining a value, or owning the block of a block argument. */
static MlirOperation value_owner_op(MlirValue v)
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

/* Whether `value` is a result of an operation that holds `user` (or would
 * hold it once `user`'s root is inserted under `under`, when not null). Such
 * a use never dominates, and MLIR's verifier, which the printer runs first,
 * dereferences a null block checking it where that operation is a detached
 * root: refused wherever a use is made, so no IR holds one. */
static int result_of_enclosing(MlirValue value, MlirOperation user, MlirOperation under)
{
    if (!mlirValueIsAOpResult(value))
        return 0;
    MlirOperation owner = mlirOpResultGetOwner(value);
    if (op_encloses(owner, user))
        return 1;
    return !mlirOperationIsNull(under) && (mlirOperationEqual(owner, under) || op_encloses(owner, under));
}

/* Moves the detached operation `op` into `block` before `before` (or at the
 * end when before is NULL). */
static int insert_operation(mg_ir_Block *block, mg_ir_Operation *before, PyObject *opobj)
{
    if (!PyObject_TypeCheck(opobj, OperationType)) {
        PyErr_Format(PyExc_TypeError, "expected an mlirgpu.ir.Operation, not %.100s", Py_TYPE(opobj)->tp_name);
        return -1;
    }
    mg_ir_Operation *op = (mg_ir_Operation *)opobj;
    if (op_check(op) < 0 || anchor_check(block->anchor, "block") < 0)
        return -1;
    if (op->context != block->anchor->context) {
        PyErr_SetString(PyExc_ValueError, "the operation and the block belong to different Contexts");
        return -1;
    }
    if (!op->owned || op->parent != NULL) {
        PyErr_SetString(PyExc_ValueError, "the operation is already in a block; only a detached operation can be inserted");
        return -1;
    }
    for (MlirOperation p = block->anchor->op; !mlirOperationIsNull(p); p = mlirOperationGetParentOperation(p)) {
        if (mlirOperationEqual(p, op->op)) {
            PyErr_SetString(PyExc_ValueError, "cannot insert an operation into its own region");
            return -1;
        }
    }
    /* Uses across two roots would dangle once either root is freed: every
     * operand of the operation and of the operations nested in it (a clone's
     * body may use values of the module it was cloned from) must be defined
     * in the block's tree or inside the operation itself. */
    MlirOperation root = ir_root(block->anchor->op);
    op_list nested = {0};
    mlirOperationWalk(op->op, collect_op, &nested, MlirWalkPreOrder);
    if (nested.failed) {
        free(nested.ops);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < nested.n; k++) {
        MlirOperation user = nested.ops[k];
        for (intptr_t i = 0; i < mlirOperationGetNumOperands(user); i++) {
            MlirValue operand = mlirOperationGetOperand(user, i);
            if (result_of_enclosing(operand, user, block->anchor->op)) {
                PyObject *name = mg_ir_str(mlirIdentifierStr(mlirOperationGetName(user)));
                if (name != NULL)
                    PyErr_Format(PyExc_ValueError, "operand #%zd of '%U' is a result of an operation that would "
                                 "hold it: a value cannot be used inside the operation that defines it",
                                 (Py_ssize_t)i, name);
                Py_XDECREF(name);
                free(nested.ops);
                return -1;
            }
            MlirOperation owner_root = ir_root(value_owner_op(operand));
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
        if (op_check(before) < 0)
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

typedef struct {
    PyObject_HEAD
    mg_ir_Block *block;
    mg_ir_Operation *before; /* NULL: the end of the block */
} mg_ir_InsertionPoint;

static PyObject *ip_new(mg_ir_Block *block, mg_ir_Operation *before)
{
    mg_ir_InsertionPoint *self = PyObject_New(mg_ir_InsertionPoint, InsertionPointType);
    if (self == NULL)
        return NULL;
    self->block = (mg_ir_Block *)Py_NewRef(block);
    self->before = (mg_ir_Operation *)Py_XNewRef(before);
    return (PyObject *)self;
}

static mg_ir_Block *block_arg(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, BlockType)) {
        PyErr_Format(PyExc_TypeError, "expected an mlirgpu.ir.Block, not %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    mg_ir_Block *b = (mg_ir_Block *)obj;
    return anchor_check(b->anchor, "block") < 0 ? NULL : b;
}

static PyObject *InsertionPoint_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"block", NULL};
    PyObject *blockobj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:InsertionPoint", kwlist, &blockobj))
        return NULL;
    mg_ir_Block *block = block_arg(blockobj);
    return block ? ip_new(block, NULL) : NULL;
}

static PyObject *InsertionPoint_at_block_begin(PyObject *cls, PyObject *blockobj)
{
    mg_ir_Block *block = block_arg(blockobj);
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
    mg_ir_Block *block = block_arg(blockobj);
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
    if (!PyObject_TypeCheck(opobj, OperationType))
        return mg_raise(PyExc_TypeError, "expected an mlirgpu.ir.Operation, not %.100s", Py_TYPE(opobj)->tp_name);
    mg_ir_Operation *op = (mg_ir_Operation *)opobj;
    if (op_check(op) < 0)
        return NULL;
    MlirBlock b = mlirOperationGetBlock(op->op);
    if (mlirBlockIsNull(b) || mlirOperationIsNull(mlirBlockGetParentOperation(b)))
        return mg_raise(PyExc_ValueError, "the operation is not in a block of another operation");
    PyObject *block = block_wrap((mg_ir_Operation *)op->parent, b);
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
    if (insert_operation(self->block, self->before, op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *InsertionPoint_get_block(mg_ir_InsertionPoint *self, void *c) { return Py_NewRef(self->block); }
static PyObject *InsertionPoint_enter(PyObject *self, PyObject *unused) { return stack_push(str_ip_stack, self); }
static PyObject *InsertionPoint_exit(PyObject *self, PyObject *args) { return stack_pop(str_ip_stack, self); }

static PyObject *InsertionPoint_current(PyObject *cls, PyObject *unused)
{
    PyObject *top = stack_top(str_ip_stack);
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

static PyType_Spec InsertionPoint_spec = {"mlirgpu.ir.InsertionPoint", sizeof(mg_ir_InsertionPoint), 0,
                                          Py_TPFLAGS_DEFAULT, InsertionPoint_slots};

/* ---- Operation ---- */

/* The Context of a new operation: the `context=` argument, else that of the
 * `location=` argument, of the current insertion point, of the current
 * `with loc:`, else the current Context. */
static mg_ir_Context *implied_context(PyObject *ctxarg, PyObject *locarg)
{
    if (ctxarg != NULL && ctxarg != Py_None)
        return context_arg(ctxarg);
    if (locarg != NULL && PyObject_TypeCheck(locarg, LocationType))
        return ((mg_ir_Value_like *)locarg)->context;
    PyObject *ip = stack_top(str_ip_stack);
    if (ip != NULL)
        return ((mg_ir_InsertionPoint *)ip)->block->anchor->context;
    PyObject *loc = PyErr_Occurred() ? NULL : stack_top(str_location_stack);
    if (loc != NULL)
        return ((mg_ir_Value_like *)loc)->context;
    return PyErr_Occurred() ? NULL : context_current();
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
        if (!PyObject_TypeCheck(item, ValueType)) {
            PyErr_Format(PyExc_TypeError, "operand #%zd must be an mlirgpu.ir.Value, not %.100s", i,
                         Py_TYPE(item)->tp_name);
            goto error;
        }
        mg_ir_ValueObject *v = (mg_ir_ValueObject *)item;
        if (anchor_check(v->anchor, "value") < 0)
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
        mg_ir_Block *b = block_arg(PySequence_Fast_GET_ITEM(fast, i));
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
    if (own_items(&operands, "operands must be a sequence of Values") < 0)
        return NULL;
    if (own_items(&results, "expected a sequence") < 0 ||
        own_items(&successors, "successors must be a sequence of Blocks") < 0) {
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
    MlirStringRef nameref = string_ref(name, "name");
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
    if (location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    mg_ir_InsertionPoint *ip = NULL;
    if (!detached) {
        ip = (mg_ir_InsertionPoint *)stack_top(str_ip_stack);
        if (ip == NULL && PyErr_Occurred())
            return NULL;
        if (ip != NULL && (anchor_check(ip->block->anchor, "block") < 0 ||
                           (ip->before != NULL && op_check(ip->before) < 0)))
            return NULL;
        if (ip != NULL && ip->block->anchor->context != ctx)
            return mg_raise(PyExc_ValueError, "the current InsertionPoint belongs to a different Context");
    }
    if ((operands && operands != Py_None && values_arg(operands, ctx, &vals, &nvals, &anchors) < 0) ||
        (results && results != Py_None && uniqued_seq(results, TypeType, ctx, "result type", &types, &ntypes) < 0) ||
        named_attributes(attributes, ctx, &named, &nnamed) < 0 ||
        (successors && successors != Py_None && blocks_arg(successors, ctx, &succ, &nsucc) < 0))
        goto error;
    if (nsucc > 0 && ip == NULL) {
        PyErr_SetString(PyExc_ValueError, "an operation with successors must be created at an InsertionPoint");
        goto error;
    }
    for (Py_ssize_t i = 0; i < nsucc; i++) {
        if (!mlirOperationEqual(ir_root(mlirBlockGetParentOperation(succ[i])), ir_root(ip->block->anchor->op))) {
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
    if (diag_check(ctx, mlirOperationIsNull(op), "cannot create the operation") < 0) {
        if (!mlirOperationIsNull(op))
            mlirOperationDestroy(op);
        goto error;
    }
    mg_ir_Operation *self = op_new(ctx, op, NULL, 1);
    if (self == NULL)
        goto error;
    self->keepalive = anchors;
    anchors = NULL;
    if (ip != NULL && insert_operation(ip->block, ip->before, (PyObject *)self) < 0) {
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

#define OP_CHECKED(self) \
    if (op_check(self) < 0) \
        return NULL;

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
    mg_ir_Operation *owner = (mg_ir_Operation *)mg_ir_operation_wrap(op->context, value_owner_op(v));
    PyObject *item = owner ? value_wrap(owner, v) : NULL;
    Py_XDECREF(owner);
    return item;
}

static PyObject *result_item(void *self, intptr_t i)
{
    return value_wrap(self, mlirOperationGetResult(((mg_ir_Operation *)self)->op, i));
}

static PyObject *region_item(void *self, intptr_t i)
{
    return region_wrap(self, mlirOperationGetRegion(((mg_ir_Operation *)self)->op, i));
}

static PyObject *successor_item(void *self, intptr_t i)
{
    mg_ir_Operation *op = self;
    MlirBlock b = mlirOperationGetSuccessor(op->op, i);
    mg_ir_Operation *owner = block_owner(op->context, b);
    PyObject *item = owner ? block_wrap(owner, b) : NULL;
    Py_XDECREF(owner);
    return item;
}

static PyObject *Operation_get_operands(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return list_of(mlirOperationGetNumOperands(self->op), operand_item, self);
}

static PyObject *Operation_get_results(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return list_of(mlirOperationGetNumResults(self->op), result_item, self);
}

static PyObject *Operation_get_result(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    if (mlirOperationGetNumResults(self->op) != 1)
        return mg_raise(PyExc_ValueError, "the operation has %zd results, not exactly one",
                        (Py_ssize_t)mlirOperationGetNumResults(self->op));
    return value_wrap(self, mlirOperationGetResult(self->op, 0));
}

static PyObject *Operation_get_regions(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return list_of(mlirOperationGetNumRegions(self->op), region_item, self);
}

static PyObject *Operation_get_successors(mg_ir_Operation *self, void *c)
{
    OP_CHECKED(self);
    return list_of(mlirOperationGetNumSuccessors(self->op), successor_item, self);
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
    return block_wrap((mg_ir_Operation *)self->parent, mlirOperationGetBlock(self->op));
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
    MlirStringRef ref = string_ref(name, "name");
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
    MlirStringRef ref = string_ref(args[0], "name");
    mg_ir_Value_like *a = ref.data ? uniqued_arg(args[1], AttributeType, self->context, "attribute") : NULL;
    if (a == NULL)
        return NULL;
    mlirOperationSetAttributeByName(self->op, ref, a->h.attr);
    Py_RETURN_NONE;
}

static PyObject *Operation_remove_attribute(mg_ir_Operation *self, PyObject *name)
{
    OP_CHECKED(self);
    MlirStringRef ref = string_ref(name, "name");
    if (ref.data == NULL)
        return NULL;
    if (!mlirOperationRemoveAttributeByName(self->op, ref)) {
        PyErr_SetObject(PyExc_KeyError, name);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Operation_verify(mg_ir_Operation *self, PyObject *unused)
{
    OP_CHECKED(self);
    mg_ir_diag_clear(self->context);
    int ok = mlirOperationVerify(self->op);
    if (diag_check(self->context, !ok, "verification failed") < 0)
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

static PyObject *Operation_str(mg_ir_Operation *self) { return op_print(self, 0, 0); }

static PyObject *Operation_print(mg_ir_Operation *self, PyObject *args, PyObject *kwds)
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

static PyObject *Operation_walk(mg_ir_Operation *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"post_order", NULL};
    int post = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:walk", kwlist, &post))
        return NULL;
    OP_CHECKED(self);
    op_list list = {0};
    mlirOperationWalk(self->op, collect_op, &list, post ? MlirWalkPostOrder : MlirWalkPreOrder);
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
    for (MlirOpOperand use = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(use); use = mlirOpOperandGetNextUse(use))
        if (!is_inside(mlirOpOperandGetOwner(use), root))
            return 1;
    return 0;
}

/* Whether an operation outside `root` (in the same tree) branches to a
 * block inside it: the C API has no block-use list, so look at successors. */
static int has_outside_branches_in(MlirOperation root)
{
    op_list list = {0};
    int found = 0;
    mlirOperationWalk(ir_root(root), collect_op, &list, MlirWalkPreOrder);
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
    mlirOperationWalk(root, collect_op, &list, MlirWalkPreOrder);
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
    mlirOperationWalk(root->op, collect_op, &list, MlirWalkPreOrder);
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
    if (invalidate_under(self, 1) < 0)
        return NULL;
    mlirOperationDestroy(self->op);
    Py_CLEAR(self->parent);
    Py_RETURN_NONE;
}

static PyObject *Operation_clone(mg_ir_Operation *self, PyObject *unused)
{
    OP_CHECKED(self);
    MlirOperation copy = mlirOperationClone(self->op);
    mg_ir_Operation *clone = op_new(self->context, copy, NULL, 1);
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
    {"verify", (PyCFunction)Operation_verify, METH_NOARGS, "True, or MLIRError with the diagnostics."},
    {"print", (PyCFunction)(void (*)(void))Operation_print, METH_VARARGS | METH_KEYWORDS,
     "print(*, generic=False, debug_info=False) -> str"},
    {"walk", (PyCFunction)(void (*)(void))Operation_walk, METH_VARARGS | METH_KEYWORDS,
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
    {Py_tp_dealloc, Operation_dealloc},
    {Py_tp_hash, Operation_hash},
    {Py_tp_richcompare, Operation_richcompare},
    {Py_tp_str, Operation_str},
    {Py_tp_repr, Operation_repr},
    {Py_tp_methods, Operation_methods},
    {Py_tp_getset, Operation_getset},
    {0, NULL},
};

static PyType_Spec Operation_spec = {"mlirgpu.ir.Operation", sizeof(mg_ir_Operation), 0,
                                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Operation_slots};

/* ---- Block ---- */

#define VIEW_CHECKED(self, what) \
    if (anchor_check((self)->anchor, what) < 0) \
        return NULL;

static PyObject *argument_item(void *self, intptr_t i)
{
    mg_ir_Block *block = self;
    return value_wrap(block->anchor, mlirBlockGetArgument(block->block, i));
}

static PyObject *Block_get_arguments(mg_ir_Block *self, void *c)
{
    VIEW_CHECKED(self, "block");
    return list_of(mlirBlockGetNumArguments(self->block), argument_item, self);
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
    return region_wrap(self->anchor, mlirBlockGetParentRegion(self->block));
}

static PyObject *Block_add_argument(mg_ir_Block *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"type", "location", NULL};
    PyObject *typeobj, *locarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:add_argument", kwlist, &typeobj, &locarg))
        return NULL;
    VIEW_CHECKED(self, "block");
    mg_ir_Context *ctx = self->anchor->context;
    mg_ir_Value_like *t = uniqued_arg(typeobj, TypeType, ctx, "type");
    MlirLocation loc;
    if (t == NULL || location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    return value_wrap(self->anchor, mlirBlockAddArgument(self->block, t->h.type, loc));
}

static PyObject *Block_append(mg_ir_Block *self, PyObject *op)
{
    if (insert_operation(self, NULL, op) < 0)
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
    {Py_tp_dealloc, view_dealloc},
    {Py_tp_hash, view_hash},
    {Py_tp_richcompare, view_richcompare},
    {Py_tp_str, Block_str},
    {Py_tp_methods, Block_methods},
    {Py_tp_getset, Block_getset},
    {0, NULL},
};

static PyType_Spec Block_spec = {"mlirgpu.ir.Block", sizeof(mg_ir_Block), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Block_slots};

/* ---- Region ---- */

static PyObject *Region_get_blocks(mg_ir_Region *self, void *c)
{
    VIEW_CHECKED(self, "region");
    PyObject *list = PyList_New(0);
    for (MlirBlock b = mlirRegionGetFirstBlock(self->region); list != NULL && !mlirBlockIsNull(b);
         b = mlirBlockGetNextInRegion(b)) {
        PyObject *item = block_wrap(self->anchor, b);
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
    if (types && uniqued_seq(types, TypeType, ctx, "argument type", &t, &nt) < 0)
        goto error;
    if (locs && locs != Py_None) {
        if (uniqued_seq(locs, LocationType, ctx, "argument location", &l, &nl) < 0)
            goto error;
        if (nl != nt) {
            PyErr_Format(PyExc_ValueError, "%zd argument types but %zd locations", nt, nl);
            goto error;
        }
    } else {
        MlirLocation loc;
        l = PyMem_Calloc((size_t)nt + 1, sizeof *l);
        if (l == NULL || location_arg(NULL, ctx, &loc) < 0)
            goto error;
        for (Py_ssize_t i = 0; i < nt; i++)
            l[i] = loc.ptr;
    }
    /* Reading the sequences ran Python code, which may have erased the region's operation. */
    if (anchor_check(self->anchor, "region") < 0)
        goto error;
    MlirBlock block = mlirBlockCreate(nt, (MlirType *)t, (MlirLocation *)l);
    mlirRegionAppendOwnedBlock(self->region, block);
    result = block_wrap(self->anchor, block);
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
    {Py_tp_dealloc, view_dealloc},
    {Py_tp_hash, view_hash},
    {Py_tp_richcompare, view_richcompare},
    {Py_tp_methods, Region_methods},
    {Py_tp_getset, Region_getset},
    {0, NULL},
};

static PyType_Spec Region_spec = {"mlirgpu.ir.Region", sizeof(mg_ir_Region), 0,
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
    return block_wrap(self->anchor, mlirBlockArgumentGetOwner(self->value));
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
    if (!PyObject_TypeCheck(other, ValueType))
        return mg_raise(PyExc_TypeError, "expected an mlirgpu.ir.Value, not %.100s", Py_TYPE(other)->tp_name);
    mg_ir_ValueObject *o = (mg_ir_ValueObject *)other;
    VIEW_CHECKED(o, "value");
    if (!mlirOperationEqual(ir_root(self->anchor->op), ir_root(o->anchor->op)))
        return mg_raise(PyExc_ValueError, "the two values are in different IR trees");
    /* MLIR's loop would set each use to the value it already has, forever. */
    if (mlirValueEqual(self->value, o->value))
        Py_RETURN_NONE;
    for (MlirOpOperand u = mlirValueGetFirstUse(self->value); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
        if (result_of_enclosing(o->value, mlirOpOperandGetOwner(u), (MlirOperation){NULL}))
            return mg_raise(PyExc_ValueError, "a use of this value is inside the operation that defines the "
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
    {Py_tp_dealloc, view_dealloc},
    {Py_tp_hash, view_hash},
    {Py_tp_richcompare, view_richcompare},
    {Py_tp_str, Value_str},
    {Py_tp_methods, Value_methods},
    {Py_tp_getset, Value_getset},
    {0, NULL},
};

static PyType_Spec Value_spec = {"mlirgpu.ir.Value", sizeof(mg_ir_ValueObject), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Value_slots};

/* ===================================================================== */
/* Module                                                                */
/* ===================================================================== */

PyObject *mg_ir_module_adopt(mg_ir_Context *ctx, MlirOperation op)
{
    mg_ir_Operation *wrapped = op_new(ctx, op, NULL, 1);
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
    return op_check(op) < 0 ? NULL : op;
}

static PyObject *Module_create(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"location", "context", NULL};
    PyObject *locarg = NULL, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OO:Module.create", kwlist, &locarg, &ctxarg))
        return NULL;
    mg_ir_Context *ctx;
    if ((ctxarg == NULL || ctxarg == Py_None) && locarg != NULL && PyObject_TypeCheck(locarg, LocationType))
        ctx = ((mg_ir_Value_like *)locarg)->context;
    else
        ctx = context_arg(ctxarg);
    MlirLocation loc;
    if (ctx == NULL || location_arg(locarg, ctx, &loc) < 0)
        return NULL;
    return mg_ir_module_adopt(ctx, mlirModuleGetOperation(mlirModuleCreateEmpty(loc)));
}

static PyObject *Module_parse(PyObject *cls, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"text", "context", NULL};
    PyObject *text, *ctxarg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$O:Module.parse", kwlist, &text, &ctxarg))
        return NULL;
    mg_ir_Context *ctx = context_arg(ctxarg);
    MlirStringRef ref = string_ref(text, "text");
    if (ctx == NULL || ref.data == NULL)
        return NULL;
    mg_ir_diag_clear(ctx);
    MlirModule m = mlirModuleCreateParse(ctx->context, ref);
    if (diag_check(ctx, mlirModuleIsNull(m), "cannot parse the module") < 0) {
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
    return block_wrap(self->operation, mlirModuleGetBody(mlirModuleFromOperation(self->operation->op)));
}

static PyObject *Module_str(mg_ir_Module *self) { return Operation_str(self->operation); }

static PyObject *Module_verify(mg_ir_Module *self, PyObject *unused) { return Operation_verify(self->operation, NULL); }

static PyObject *Module_walk(mg_ir_Module *self, PyObject *args, PyObject *kwds)
{
    return Operation_walk(self->operation, args, kwds);
}

static PyObject *Module_print(mg_ir_Module *self, PyObject *args, PyObject *kwds)
{
    return Operation_print(self->operation, args, kwds);
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
    str_context_stack = PyUnicode_InternFromString("mlirgpu.ir.context_stack");
    str_location_stack = PyUnicode_InternFromString("mlirgpu.ir.location_stack");
    str_ip_stack = PyUnicode_InternFromString("mlirgpu.ir.insertion_point_stack");
    if (!str_context_stack || !str_location_stack || !str_ip_stack)
        return -1;
    if (!(ContextType = mg_add_type(module, &Context_spec, NULL)) ||
        !(LocationType = mg_add_type(module, &Location_spec, NULL)) ||
        !(TypeType = mg_add_type(module, &Type_spec, NULL)) ||
        !(AttributeType = mg_add_type(module, &Attribute_spec, NULL)) ||
        !(OperationType = mg_add_type(module, &Operation_spec, NULL)) ||
        !(BlockType = mg_add_type(module, &Block_spec, NULL)) ||
        !(RegionType = mg_add_type(module, &Region_spec, NULL)) ||
        !(ValueType = mg_add_type(module, &Value_spec, NULL)) ||
        !(InsertionPointType = mg_add_type(module, &InsertionPoint_spec, NULL)) ||
        !(mg_ir_ModuleType = mg_add_type(module, &Module_spec, NULL)))
        return -1;
    if (PyModule_AddIntConstant(module, "DYNAMIC", (long)mlirShapedTypeGetDynamicSize()) < 0)
        return -1;
    LLVMInstallFatalErrorHandler(fatal_error_handler);
    return 0;
}
