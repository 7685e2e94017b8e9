/* What guards every call into MLIR: the crash guard (a signal in MLIR or
 * LLVM becomes a Python error), strings out of MLIR, and diagnostics
 * collected into MLIRError. The bottom of mlir/. */
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
/* Keys of the per-thread stacks that `with` statements push onto. */
PyObject *mg_ir_str_context_stack, *mg_ir_str_location_stack, *mg_ir_str_ip_stack;
mg_ir_Context *mg_ir_default_context; /* made on first use, kept for the process */

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

PyObject *mg_ir_list_of(intptr_t n, item_maker make, void *owner)
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

MlirStringRef mg_ir_string_ref(PyObject *str, const char *what)
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

/* MLIR's parser recurses once per bracket level and overflows a thread's
 * stack on text only a few thousand levels deep: refuse such text first. */
int mg_ir_check_nesting(MlirStringRef text)
{
    size_t depth = 0;
    int quoted = 0;
    for (size_t i = 0; i < text.length; i++) {
        char c = text.data[i];
        if (quoted) {
            if (c == '\\')
                i++; /* an escaped character never closes the string */
            else if (c == '"')
                quoted = 0;
        } else if (c == '"')
            quoted = 1;
        else if (c == '{' || c == '[' || c == '(' || c == '<') {
            if (++depth > MG_IR_MAX_NESTING) {
                mg_diags none = {0};
                mg_diags_raise(&none, mg_st->MLIRError,
                               "the text nests brackets deeper than " MG_IR_MAX_NESTING_TEXT " levels");
                return -1;
            }
        } else if ((c == '}' || c == ']' || c == ')' || (c == '>' && (i == 0 || text.data[i - 1] != '-')))
                   && depth > 0)
            depth--; /* the '>' of an arrow "->" closes nothing */
    }
    return 0;
}

/* ===================================================================== */
/* Diagnostics                                                           */
/* ===================================================================== */

MlirLogicalResult mg_ir_diag_handler(MlirDiagnostic diag, void *userdata)
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
int mg_ir_diag_check(mg_ir_Context *ctx, int failed, const char *what)
{
    if (failed || mg_ir_diag_has_error(ctx)) {
        mg_ir_diag_raise(ctx, mg_st->MLIRError, what);
        return -1;
    }
    return mg_ir_diag_warn(ctx);
}

