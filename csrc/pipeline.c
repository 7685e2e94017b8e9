/* PassManager over a textual pipeline, with IR printing and timing captured
 * into Python strings, and LLVM's fatal errors turned into CompileError. */
#include "pipeline.h"
#include "ir.h"

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/Dialect/GPU.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <llvm-c/BitReader.h>
#include <llvm-c/Core.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- stderr capture ----
 * MLIR's IR printing and timing report write to llvm::errs() (fd 2). The
 * user asked for them, but as Python strings: a notebook's sys.stdout is not
 * fd 2, and nothing may be printed behind Python's back. */

typedef struct {
    FILE *file;
    int saved_fd;
} capture;

static int capture_begin(capture *c)
{
    fflush(stderr);
    c->file = tmpfile();
    if (c->file == NULL) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    c->saved_fd = dup(2);
    if (c->saved_fd < 0 || dup2(fileno(c->file), 2) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        if (c->saved_fd >= 0)
            close(c->saved_fd);
        fclose(c->file);
        return -1;
    }
    return 0;
}

static PyObject *capture_end(capture *c)
{
    fflush(stderr);
    dup2(c->saved_fd, 2);
    close(c->saved_fd);
    long size = ftell(c->file);
    PyObject *text = NULL;
    char *data = malloc(size > 0 ? (size_t)size : 1);
    if (data == NULL)
        PyErr_NoMemory();
    else {
        rewind(c->file);
        size_t got = size > 0 ? fread(data, 1, (size_t)size, c->file) : 0;
        text = PyUnicode_DecodeUTF8(data, (Py_ssize_t)got, "replace");
        free(data);
    }
    fclose(c->file);
    return text;
}

/* ---- PassManager ---- */

/* What the pass manager prints before each pass: "// -----// IR Dump Before
 * <Pass> (<argument>) //----- //" (made at module init). */
static PyObject *before_marker;

typedef struct {
    PyObject_HEAD
    PyObject *pipeline; /* str */
    int print_ir_before_all, print_ir_after_all, timing, verify_each;
} mg_PassManager;

static PyTypeObject *PassManagerType;

static PyObject *PassManager_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"pipeline", "print_ir_before_all", "print_ir_after_all", "timing", "verify_each", NULL};
    PyObject *pipeline;
    int before = 0, after = 0, timing = 0, verify = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|$pppp:PassManager", kwlist, &pipeline, &before, &after,
                                     &timing, &verify))
        return NULL;
    mg_PassManager *self = (mg_PassManager *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->pipeline = Py_NewRef(pipeline);
    self->print_ir_before_all = before;
    self->print_ir_after_all = after;
    self->timing = timing;
    self->verify_each = verify;
    return (PyObject *)self;
}

static void PassManager_dealloc(mg_PassManager *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(self->pipeline);
    type->tp_free(self);
    Py_DECREF(type);
}

static void append_callback(MlirStringRef chunk, void *userdata) { mg_buf_callback(chunk, userdata); }

/* The pipeline text anchored on `opname`: "canonicalize,cse" run on a
 * builtin.module becomes "builtin.module(canonicalize,cse)". */
static PyObject *anchored_pipeline(PyObject *pipeline, PyObject *opname)
{
    PyObject *prefix = PyUnicode_FromFormat("%U(", opname);
    if (prefix == NULL)
        return NULL;
    int anchored = PyUnicode_Tailmatch(pipeline, prefix, 0, PY_SSIZE_T_MAX, -1);
    Py_DECREF(prefix);
    if (anchored < 0)
        return NULL;
    if (anchored)
        return Py_NewRef(pipeline);
    return PyUnicode_FromFormat("%U(%U)", opname, pipeline);
}

typedef struct {
    MlirPassManager pm;
    MlirOperation op;
    MlirLogicalResult ran;
} pass_run;

static void run_passes(void *arg)
{
    pass_run *run = arg;
    run->ran = mlirPassManagerRunOnOp(run->pm, run->op);
}

/* Runs the pass manager; 1 if LLVM hit a fatal error inside. */
static int run_guarded(MlirPassManager pm, MlirOperation op, MlirLogicalResult *ran)
{
    pass_run run = {pm, op, mlirLogicalResultFailure()};
    int fatal = mg_fatal_guarded(run_passes, &run);
    *ran = run.ran;
    return fatal;
}

/* `printed` without the blocks the pass manager printed before each pass
 * (a header line, the operation, a blank line): the names that were only
 * there in case of a crash. */
static PyObject *strip_pass_names(PyObject *printed)
{
    PyObject *lines = PyUnicode_Splitlines(printed, 1), *kept = PyList_New(0), *result = NULL;
    if (lines == NULL || kept == NULL)
        goto done;
    int skipping = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (PyUnicode_Tailmatch(line, before_marker, 0, PY_SSIZE_T_MAX, -1) == 1)
            skipping = 1;
        else if (skipping && PyUnicode_GET_LENGTH(line) <= 1)
            skipping = 0; /* the blank line that ends the block */
        else if (!skipping && PyList_Append(kept, line) < 0)
            goto done;
    }
    PyObject *empty = PyUnicode_FromString("");
    if (empty != NULL) {
        result = PyUnicode_Join(empty, kept);
        Py_DECREF(empty);
    }
done:
    Py_XDECREF(lines);
    Py_XDECREF(kept);
    return result;
}

/* The pass a crash happened in: the last "IR Dump Before <Pass> (<argument>)"
 * header in what the pass manager printed, or NULL. */
static PyObject *crashed_pass(PyObject *printed)
{
    Py_ssize_t at = PyUnicode_Find(printed, before_marker, 0, PyUnicode_GET_LENGTH(printed), -1);
    Py_ssize_t start = at + PyUnicode_GET_LENGTH(before_marker);
    if (at < 0)
        return NULL;
    Py_ssize_t end = PyUnicode_FindChar(printed, '/', start, PyUnicode_GET_LENGTH(printed), 1);
    if (end < 0)
        return NULL;
    PyObject *header = PyUnicode_Substring(printed, start, end);
    if (header == NULL)
        return NULL;
    PyObject *stripped = PyObject_CallMethod(header, "strip", NULL);
    Py_DECREF(header);
    return stripped;
}

/* MLIR's pass registry is filled when the first pipeline is parsed, not at
 * import: registering every pass costs a new process a millisecond that
 * importing mlirgpu or loading a kernel from the compile cache never needs.
 * Called with the GIL held, which makes the check and the registration one
 * step; no pipeline is parsed before it returns. */
static void register_passes_once(void)
{
    static int registered = 0;
    if (!registered) {
        mlirRegisterAllPasses();
        registered = 1;
    }
}

/* Runs the pipeline on `target`, with `extra` (owned, may be NULL) added last. */
static PyObject *run_pipeline(mg_PassManager *self, PyObject *target, MlirPass (*extra)(void))
{
    mg_ir_Operation *op = mg_ir_module_operation(target);
    if (op == NULL)
        return NULL;
    mg_ir_Context *ctx = op->context;
    MlirContext mctx = mlirOperationGetContext(op->op);
    MlirStringRef opname = mlirIdentifierStr(mlirOperationGetName(op->op));
    PyObject *name = mg_ir_str(opname), *text = NULL, *result = NULL;
    if (name == NULL || (text = anchored_pipeline(self->pipeline, name)) == NULL) {
        Py_XDECREF(name);
        return NULL;
    }
    Py_ssize_t len;
    const char *data = PyUnicode_AsUTF8AndSize(text, &len);
    if (data == NULL)
        goto done;

    /* Passes assume verified IR: on anything else they may crash. */
    mg_ir_diag_clear(ctx);
    if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx)) {
        mg_ir_diag_raise(ctx, mg_st->MLIRError, "the module does not verify; no pass ran");
        goto done;
    }
    if (mg_ir_check_self_contained(op) < 0)
        goto done;
    register_passes_once();
    MlirPassManager pm = mlirPassManagerCreateOnOperation(mctx, opname);
    mg_buf err = {0};
    /* A bad pass option is reported by LLVM's option parser on fd 2. */
    capture parse_cap;
    if (capture_begin(&parse_cap) < 0) {
        mlirPassManagerDestroy(pm);
        goto done;
    }
    MlirLogicalResult parsed = mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm),
                                                     mlirStringRefCreate(data, (size_t)len), append_callback, &err);
    PyObject *parse_output = capture_end(&parse_cap);
    if (parse_output == NULL) {
        mlirPassManagerDestroy(pm);
        free(err.data);
        goto done;
    }
    if (mlirLogicalResultIsFailure(parsed)) {
        mlirPassManagerDestroy(pm);
        PyObject *msg = mg_buf_finish(&err);
        if (msg != NULL) {
            mg_raise(mg_st->MLIRError, "invalid pass pipeline '%U': %U%U", text, msg, parse_output);
            Py_DECREF(msg);
        }
        Py_DECREF(parse_output);
        goto done;
    }
    Py_DECREF(parse_output);
    free(err.data);
    if (extra != NULL)
        mlirPassManagerAddOwnedPass(pm, extra());
    mlirPassManagerEnableVerifier(pm, self->verify_each);
    int asked = self->print_ir_before_all || self->print_ir_after_all || self->timing;
    /* Each pass prints its name before it runs (without the IR unless that
     * was asked for): after a crash the last name printed is the pass's. */
    MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate(); /* copied by the pass manager */
    if (!self->print_ir_before_all && !self->print_ir_after_all)
        mlirOpPrintingFlagsSkipRegions(flags);
    mlirPassManagerEnableIRPrinting(pm, true, self->print_ir_after_all, false, false, false, flags,
                                    mlirStringRefCreate(NULL, 0));
    mlirOpPrintingFlagsDestroy(flags);
    if (self->timing)
        mlirPassManagerEnableTiming(pm);
    /* A crash on one of the context's worker threads could not be caught:
     * the passes run on this thread. */
    mlirContextEnableMultithreading(mctx, false);
    capture cap;
    if (capture_begin(&cap) < 0) {
        mlirPassManagerDestroy(pm);
        goto done;
    }
    mg_ir_diag_clear(ctx);
    MlirLogicalResult ran = mlirLogicalResultFailure();
    int fatal = run_guarded(pm, op->op, &ran);
    /* After a fatal error LLVM's state inside the pass manager is unknown:
     * leak it rather than run its destructors. */
    if (!fatal)
        mlirPassManagerDestroy(pm);
    PyObject *captured = capture_end(&cap);
    mg_ir_invalidate_nested(op);
    if (captured == NULL)
        goto done;
    if (fatal) {
        mg_ir_diag_clear(ctx);
        PyObject *pass = crashed_pass(captured);
        PyErr_Clear();
        if (mg_fatal_signal != 0)
            mg_raise(mg_st->CompileError, "MLIR crashed in pass '%U' of '%U': %s. The module is left as the crash "
                     "left it and its context must not be used again; other contexts work as before",
                     pass != NULL ? pass : Py_None, text, mg_fatal_reason);
        else
            mg_raise(mg_st->CompileError, "LLVM fatal error in pass '%U' of '%U': %s",
                     pass != NULL ? pass : Py_None, text, mg_fatal_reason);
        Py_XDECREF(pass);
        Py_DECREF(captured);
        goto done;
    }
    if (!asked) {
        Py_SETREF(captured, PyUnicode_FromString(""));
        if (captured == NULL)
            goto done;
    } else if (!self->print_ir_before_all) {
        /* The names printed for a crash that did not come are not what was asked for. */
        PyObject *kept = strip_pass_names(captured);
        Py_DECREF(captured);
        if (kept == NULL)
            goto done;
        captured = kept;
    }
    if (mlirLogicalResultIsFailure(ran) || mg_ir_diag_has_error(ctx)) {
        PyObject *what = PyUnicode_FromFormat("pass pipeline '%U' failed", text);
        if (what != NULL) {
            mg_ir_diag_raise(ctx, mg_st->MLIRError, PyUnicode_AsUTF8(what));
            Py_DECREF(what);
        }
        Py_DECREF(captured);
        goto done;
    }
    if (mg_ir_diag_warn(ctx) < 0) {
        Py_DECREF(captured);
        goto done;
    }
    result = captured;
done:
    Py_XDECREF(text);
    Py_XDECREF(name);
    return result;
}

static PyObject *PassManager_run(mg_PassManager *self, PyObject *target)
{
    return run_pipeline(self, target, NULL);
}

/* For the tests of the crash guard: a pass that raises SIGTRAP, as a trap
 * inside a pass of MLIR would. */
static void crash_construct(void *data) {}
static void crash_destruct(void *data) {}
static void *crash_clone(void *data) { return data; }
static void crash_run(MlirOperation op, MlirExternalPass pass, void *data) { raise(SIGTRAP); }

static MlirPass crash_pass(void)
{
    static _Alignas(8) char id;
    MlirExternalPassCallbacks callbacks = {crash_construct, crash_destruct, NULL, crash_clone, crash_run};
    return mlirCreateExternalPass(mlirTypeIDCreate(&id), mlirStringRefCreateFromCString("MlirgpuCrashTest"),
                                  mlirStringRefCreateFromCString("mlirgpu-crash-test"),
                                  mlirStringRefCreateFromCString("raises SIGTRAP"), mlirStringRefCreate(NULL, 0), 0,
                                  NULL, callbacks, NULL);
}

static PyObject *PassManager_run_then_crash(mg_PassManager *self, PyObject *target)
{
    return run_pipeline(self, target, crash_pass);
}

static PyObject *PassManager_get_pipeline(mg_PassManager *self, void *c) { return Py_NewRef(self->pipeline); }

static PyMethodDef PassManager_methods[] = {
    {"run", (PyCFunction)PassManager_run, METH_O,
     "run(module) -> str: runs the pipeline in place. Returns the IR dumps and timing report "
     "that were asked for (else ''). MLIRError with the diagnostics if a pass fails; CompileError "
     "naming the pass if LLVM hits a fatal error or MLIR crashes inside one. Wrappers "
     "of operations inside the module become invalid."},
    {"_run_then_crash", (PyCFunction)PassManager_run_then_crash, METH_O,
     "For the tests of the crash guard: run(module) with a last pass that raises SIGTRAP."},
    {NULL},
};

static PyGetSetDef PassManager_getset[] = {
    {"pipeline", (getter)PassManager_get_pipeline, NULL, NULL, NULL},
    {NULL},
};

static PyType_Slot PassManager_slots[] = {
    {Py_tp_doc, "PassManager(pipeline, *, print_ir_before_all=False, print_ir_after_all=False, "
                "timing=False, verify_each=True): a textual pass pipeline, e.g. "
                "'builtin.module(canonicalize,cse)' or just 'canonicalize,cse'."},
    {Py_tp_new, PassManager_new},
    {Py_tp_dealloc, PassManager_dealloc},
    {Py_tp_methods, PassManager_methods},
    {Py_tp_getset, PassManager_getset},
    {0, NULL},
};

static PyType_Spec PassManager_spec = {"mlirgpu.passes.PassManager", sizeof(mg_PassManager), 0,
                                       Py_TPFLAGS_DEFAULT, PassManager_slots};

/* ---- GPU objects and LLVM bitcode ---- */

/* gpu_objects(module) -> [(gpu.binary name, format, bytes), ...] */
static PyObject *gpu_objects(PyObject *self, PyObject *module)
{
    mg_ir_Operation *root = mg_ir_module_operation(module);
    if (root == NULL)
        return NULL;
    PyObject *list = PyList_New(0);
    MlirBlock body = mlirModuleGetBody(mlirModuleFromOperation(root->op));
    for (MlirOperation op = mlirBlockGetFirstOperation(body); list != NULL && !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op)) {
        MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
        if (name.length != 10 || memcmp(name.data, "gpu.binary", 10) != 0)
            continue;
        MlirAttribute sym = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("sym_name"));
        MlirAttribute objects = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("objects"));
        if (!mlirAttributeIsAString(sym) || !mlirAttributeIsAArray(objects))
            continue;
        for (intptr_t i = 0; list != NULL && i < mlirArrayAttrGetNumElements(objects); i++) {
            MlirAttribute object = mlirArrayAttrGetElement(objects, i);
            if (!mlirAttributeIsAGPUObjectAttr(object))
                continue;
            MlirStringRef symname = mlirStringAttrGetValue(sym);
            MlirStringRef data = mlirGPUObjectAttrGetObject(object);
            PyObject *item = Py_BuildValue("(s#Iy#)", symname.data, (Py_ssize_t)symname.length,
                                           (unsigned)mlirGPUObjectAttrGetFormat(object), data.data,
                                           (Py_ssize_t)data.length);
            if (item == NULL || PyList_Append(list, item) < 0)
                Py_CLEAR(list);
            Py_XDECREF(item);
        }
    }
    return list;
}

/* Keeps LLVM's first error message: without a handler LLVM prints it and
 * exits the process. */
static void llvm_diagnostic(LLVMDiagnosticInfoRef info, void *userdata)
{
    char **message = userdata;
    if (*message == NULL && LLVMGetDiagInfoSeverity(info) == LLVMDSError)
        *message = LLVMGetDiagInfoDescription(info);
}

/* llvm_bitcode_to_text(bytes) -> str: LLVM IR as LLVM prints it. */
static PyObject *llvm_bitcode_to_text(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    char *message = NULL;
    LLVMContextRef llctx = LLVMContextCreate();
    LLVMContextSetDiagnosticHandler(llctx, llvm_diagnostic, &message);
    LLVMMemoryBufferRef buffer =
        LLVMCreateMemoryBufferWithMemoryRangeCopy(view.buf, (size_t)view.len, "mlirgpu-bitcode");
    PyBuffer_Release(&view);
    LLVMModuleRef mod = NULL;
    PyObject *result = NULL;
    if (LLVMParseBitcodeInContext2(llctx, buffer, &mod) != 0)
        mg_raise(mg_st->CompileError, "not valid LLVM bitcode: %s", message ? message : "unknown error");
    else {
        char *text = LLVMPrintModuleToString(mod);
        result = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
        LLVMDisposeMessage(text);
        LLVMDisposeModule(mod);
    }
    if (message != NULL)
        LLVMDisposeMessage(message);
    LLVMDisposeMemoryBuffer(buffer);
    LLVMContextDispose(llctx);
    return result;
}

static PyMethodDef pipeline_functions[] = {
    {"gpu_objects", gpu_objects, METH_O,
     "gpu_objects(module) -> [(name, format, bytes)] for each #gpu.object of each gpu.binary."},
    {"llvm_bitcode_to_text", llvm_bitcode_to_text, METH_O, NULL},
    {NULL},
};

int mg_pipeline_init(PyObject *module)
{
    if (before_marker == NULL && (before_marker = PyUnicode_InternFromString("// -----// IR Dump Before ")) == NULL)
        return -1;
    if ((PassManagerType = mg_add_type(module, &PassManager_spec, NULL)) == NULL)
        return -1;
    return PyModule_AddFunctions(module, pipeline_functions);
}
