/* The IR layer: Python objects over MLIR's C API handles.
 *
 * Ownership: every wrapper holds a strong reference to whatever keeps its
 * handle's memory alive. A Context owns everything; an attached Operation
 * holds its parent (an Operation, or a detached Block), a Block or Region
 * holds the Operation it belongs to, a Value holds its defining Operation or
 * Block. Only roots (a Module's operation, a detached Operation or Block) free
 * MLIR memory, and only once nothing refers into them. Erasing an operation
 * or running a pass invalidates the wrappers of the operations it may have
 * freed; using one then raises InvalidObjectError. */
#ifndef MG_IR_H
#define MG_IR_H

#include "base/state.h"
#include <mlir-c/Diagnostics.h>
#include <mlir-c/IR.h>

/* One diagnostic as MLIR reported it, kept in C: the handler runs inside
 * MLIR and must not raise. */
typedef struct {
    int severity; /* MlirDiagnosticSeverity; notes are entries of their own */
    char *location;
    char *message;
} mg_diag;

/* The diagnostics one MLIR context reported since they were last cleared. */
typedef struct {
    mg_diag *items;
    size_t count, cap;
} mg_diags;

typedef struct {
    PyObject_HEAD
    MlirContext context;
    mg_diags diags;
    PyObject *live_ops; /* dict: op address -> wrapper address, not owning */
} mg_ir_Context;

typedef struct {
    PyObject_HEAD
    MlirOperation op;
    mg_ir_Context *context;
    PyObject *parent;    /* the parent Operation's wrapper; NULL for a root */
    PyObject *keepalive; /* a detached operation's operands' operations */
    int owned;           /* a root: this wrapper destroys the operation */
    int valid;
} mg_ir_Operation;

typedef struct {
    PyObject_HEAD
    mg_ir_Operation *operation; /* owned: the builtin.module operation */
} mg_ir_Module;

extern PyTypeObject *mg_ir_ModuleType;

/* The deepest bracket nesting accepted in IR text (see docs/ir.md). */
#define MG_IR_MAX_NESTING 256
#define MG_IR_MAX_NESTING_TEXT "256"
/* Raises MLIRError (-1) if `text` nests brackets deeper than MG_IR_MAX_NESTING. */
int mg_ir_check_nesting(MlirStringRef text);

/* Diagnostics: clear before an MLIR call, then raise those it reported. */
void mg_ir_diag_clear(mg_ir_Context *ctx);
PyObject *mg_ir_diag_raise(mg_ir_Context *ctx, PyObject *cls, const char *what);
int mg_ir_diag_has_error(mg_ir_Context *ctx);
/* Turns warnings and remarks into Python warnings; -1 if one was raised. */
int mg_ir_diag_warn(mg_ir_Context *ctx);
/* The same over a list of diagnostics of its own. */
void mg_diags_clear(mg_diags *diags);
int mg_diags_has_error(const mg_diags *diags);
PyObject *mg_diags_raise(mg_diags *diags, PyObject *cls, const char *what);
int mg_diags_warn(mg_diags *diags);

/* The module's operation, checked valid; borrowed; NULL with TypeError or
 * InvalidObjectError set. */
mg_ir_Operation *mg_ir_module_operation(PyObject *module);
/* Wraps a detached operation (a clone, say) as a new Module owning it. */
PyObject *mg_ir_module_adopt(mg_ir_Context *ctx, MlirOperation op);
/* -1 with ValueError if an operation outside `root` uses a value defined
 * inside it: a pass over `root` could free that value under it. */
int mg_ir_check_self_contained(mg_ir_Operation *root);
/* After a pass ran on `root`, any operation under it may be gone. */
void mg_ir_invalidate_nested(mg_ir_Operation *root);
/* Returns the Python wrapper of `op` (new ref), making one if needed. */
PyObject *mg_ir_operation_wrap(mg_ir_Context *ctx, MlirOperation op);

/* A str from an MLIR string reference or printing callback. */
PyObject *mg_ir_str(MlirStringRef ref);
typedef struct { char *data; size_t len, cap; int failed; } mg_buf;
void mg_buf_callback(MlirStringRef chunk, void *userdata);
PyObject *mg_buf_finish(mg_buf *buf);

/* Prints `op` in the generic form with its locations: the text that a
 * private context's parser reads back as the same IR. */
void mg_ir_print_located(MlirOperation op, mg_buf *out);

/* A context that no Python object refers to, reporting into `sink`: for work
 * done without the GIL, which no other thread can reach. Taken from a pool
 * (or made) with the GIL held, and given back with the GIL held once nothing
 * of it is in use (its modules and pass managers destroyed); after a fatal
 * error it is leaked instead, never given back. */
typedef struct {
    MlirContext context;
    MlirDiagnosticHandlerID handler;
    int uses;
} mg_private_context;
mg_private_context mg_ir_private_take(int allow_unregistered, mg_diags *sink);
void mg_ir_private_give_back(mg_private_context *taken);

/* LLVM's fatal errors, and crashes inside MLIR or LLVM (a trap, a bad
 * access, an abort), end the process; inside mg_fatal_guarded one becomes a
 * return to the guard instead (as clang's crash recovery does: signal
 * handlers installed around the body jump back out). Only for code that
 * validated its input and guards against what validation cannot see; what
 * the body was working on is left as the crash left it, never to be touched
 * again. */
#include <setjmp.h>
extern _Thread_local sigjmp_buf *mg_fatal_target;
extern _Thread_local char mg_fatal_reason[1024];
/* The signal of the last crash caught on this thread, 0 for a fatal error. */
extern _Thread_local int mg_fatal_signal;
/* Runs body(arg) under the guard, with the GIL or without it (the guard is
 * per thread): 1 if LLVM hit a fatal error or crashed inside (the reason is
 * in mg_fatal_reason), else 0. */
int mg_fatal_guarded(void (*body)(void *), void *arg);

/* Adds the mlirgpu.ir types. */
int mg_ir_init(PyObject *module);

#endif
