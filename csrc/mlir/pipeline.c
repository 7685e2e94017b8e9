/* PassManager over a textual pipeline, with IR printing and timing captured
 * into Python strings, and LLVM's fatal errors turned into CompileError. */
#include "mlir/pipeline.h"
#include "mlir/ir.h"

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

/* Parses the anchored pipeline `text` into `pm`; -1 with MLIRError set on a
 * bad pipeline. */
static int parse_pipeline(MlirPassManager pm, PyObject *text)
{
    Py_ssize_t len;
    const char *data = PyUnicode_AsUTF8AndSize(text, &len);
    if (data == NULL || mg_ir_check_nesting(mlirStringRefCreate(data, (size_t)len)) < 0)
        return -1; /* MLIR's pipeline parser recurses per level as its IR parser does */
    mg_buf err = {0};
    /* A bad pass option is reported by LLVM's option parser on fd 2. */
    capture cap;
    if (capture_begin(&cap) < 0)
        return -1;
    MlirLogicalResult parsed = mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm),
                                                     mlirStringRefCreate(data, (size_t)len), append_callback, &err);
    PyObject *output = capture_end(&cap);
    if (output == NULL) {
        free(err.data);
        return -1;
    }
    int rc = 0;
    if (mlirLogicalResultIsFailure(parsed)) {
        PyObject *msg = mg_buf_finish(&err);
        if (msg != NULL) {
            mg_raise(mg_st->MLIRError, "invalid pass pipeline '%U': %U%U", text, msg, output);
            Py_DECREF(msg);
        }
        rc = -1;
    }
    else
        free(err.data);
    Py_DECREF(output);
    return rc;
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
    if (parse_pipeline(pm, text) < 0) {
        mlirPassManagerDestroy(pm);
        goto done;
    }
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

/* The #gpu.object attributes of a module's gpu.binary operations, copied out
 * of MLIR without touching Python (so without the GIL). */
typedef struct {
    char *name;
    unsigned format;
    char *data;
    size_t size;
} gpu_object;

typedef struct {
    gpu_object *items;
    size_t count, cap;
    int failed;
} gpu_object_list;

static char *copy_bytes(MlirStringRef ref)
{
    char *copy = malloc(ref.length + 1);
    if (copy != NULL) {
        memcpy(copy, ref.data, ref.length);
        copy[ref.length] = '\0';
    }
    return copy;
}

static void collect_gpu_objects(MlirOperation module, gpu_object_list *out)
{
    MlirBlock body = mlirModuleGetBody(mlirModuleFromOperation(module));
    for (MlirOperation op = mlirBlockGetFirstOperation(body); !out->failed && !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op)) {
        MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
        if (name.length != 10 || memcmp(name.data, "gpu.binary", 10) != 0)
            continue;
        MlirAttribute sym = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("sym_name"));
        MlirAttribute objects = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("objects"));
        if (!mlirAttributeIsAString(sym) || !mlirAttributeIsAArray(objects))
            continue;
        for (intptr_t i = 0; !out->failed && i < mlirArrayAttrGetNumElements(objects); i++) {
            MlirAttribute object = mlirArrayAttrGetElement(objects, i);
            if (!mlirAttributeIsAGPUObjectAttr(object))
                continue;
            if (out->count == out->cap) {
                size_t cap = out->cap ? 2 * out->cap : 4;
                gpu_object *grown = realloc(out->items, cap * sizeof *grown);
                if (grown == NULL) {
                    out->failed = 1;
                    break;
                }
                out->items = grown;
                out->cap = cap;
            }
            MlirStringRef data = mlirGPUObjectAttrGetObject(object);
            gpu_object item = {copy_bytes(mlirStringAttrGetValue(sym)),
                               (unsigned)mlirGPUObjectAttrGetFormat(object), copy_bytes(data), data.length};
            out->items[out->count++] = item;
            if (item.name == NULL || item.data == NULL)
                out->failed = 1;
        }
    }
}

static void gpu_object_list_free(gpu_object_list *objects)
{
    for (size_t i = 0; i < objects->count; i++) {
        free(objects->items[i].name);
        free(objects->items[i].data);
    }
    free(objects->items);
    *objects = (gpu_object_list){0};
}

/* [(gpu.binary name, format, bytes), ...]; frees the list. */
static PyObject *gpu_object_list_finish(gpu_object_list *objects)
{
    PyObject *list = objects->failed ? PyErr_NoMemory() : PyList_New(0);
    for (size_t i = 0; list != NULL && i < objects->count; i++) {
        gpu_object *o = &objects->items[i];
        PyObject *item = Py_BuildValue("(s#Iy#)", o->name, (Py_ssize_t)strlen(o->name), o->format, o->data,
                                       (Py_ssize_t)o->size);
        if (item == NULL || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    gpu_object_list_free(objects);
    return list;
}

/* ---- Lowering without the GIL ----
 * A compile stage runs in an MLIR context of its own that no Python object
 * refers to: the module arrives as text (printed with its locations), is
 * parsed there, lowered, and leaves as text or as gpu objects. Nothing
 * another thread can reach is touched meanwhile, so the GIL is released for
 * all of it and threads compile in parallel. (PassManager.run keeps the
 * GIL: it transforms a module of a Context other threads may be using.)
 *
 * A crash needs the pass it happened in, which PassManager.run learns from
 * what the pass manager prints on fd 2; fd 2 is the process's, shared by
 * every thread, so here a marker pass before each pass of the pipeline
 * records the pass's name for its own thread instead. */

static _Thread_local const char *current_pass; /* the marked pass running on this thread */

static void marker_construct(void *data) {}
static void marker_destruct(void *data) {}
static void *marker_clone(void *data) { return data; }
static void marker_run(MlirOperation op, MlirExternalPass pass, void *data) { current_pass = data; }

static MlirPass marker_pass(const char *name)
{
    static _Alignas(8) char id;
    MlirExternalPassCallbacks callbacks = {marker_construct, marker_destruct, NULL, marker_clone, marker_run};
    return mlirCreateExternalPass(mlirTypeIDCreate(&id), mlirStringRefCreateFromCString("MlirgpuPassMarker"),
                                  mlirStringRefCreateFromCString("mlirgpu-pass-marker"),
                                  mlirStringRefCreateFromCString("names the next pass for a crash's message"),
                                  mlirStringRefCreate(NULL, 0), 0, NULL, callbacks, (void *)name);
}

typedef struct {
    char **items;
    size_t count, cap;
} name_list;

/* A copy of text[start, end) without surrounding blanks, kept in `names`; NULL if out of memory. */
static const char *keep_name(name_list *names, const char *text, size_t start, size_t end)
{
    while (start < end && (text[start] == ' ' || text[start] == '\n' || text[start] == '\t'))
        start++;
    while (end > start && (text[end - 1] == ' ' || text[end - 1] == '\n' || text[end - 1] == '\t'))
        end--;
    if (names->count == names->cap) {
        size_t cap = names->cap ? 2 * names->cap : 16;
        char **grown = realloc(names->items, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        names->items = grown;
        names->cap = cap;
    }
    char *copy = copy_bytes(mlirStringRefCreate(text + start, end - start));
    if (copy != NULL)
        names->items[names->count++] = copy;
    return copy;
}

/* Adds the pipeline elements text[start, end) ("a, b{x=1}, gpu.module(c, d)")
 * to `pm`, each pass after a marker naming it; nested pipelines are entered.
 * -1 where the text is not read the way MLIR reads it: the caller then runs
 * the pipeline unmarked. */
static int add_marked(MlirOpPassManager pm, const char *text, size_t start, size_t end, name_list *names)
{
    while (start < end) {
        /* One element: up to a comma outside parentheses, braces and quotes. */
        size_t stop = start, open = 0;
        int depth = 0, quoted = 0;
        for (; stop < end; stop++) {
            char c = text[stop];
            if (quoted) {
                quoted = c != '"';
                continue;
            }
            if (c == '"')
                quoted = 1;
            else if (c == '(' || c == '{') {
                if (depth++ == 0 && open == 0)
                    open = stop;
            } else if ((c == ')' || c == '}') && --depth < 0)
                return -1;
            else if (c == ',' && depth == 0)
                break;
        }
        if (depth != 0 || quoted)
            return -1;
        const char *name = keep_name(names, text, start, open ? open : stop);
        if (name == NULL)
            return -1;
        if (*name != '\0') {
            if (open && text[open] == '(' && strcmp(name, "any") != 0) {
                /* op-name(...): a pipeline nested on that operation. */
                size_t close = stop;
                while (close > open && text[close - 1] != ')')
                    close--;
                MlirOpPassManager nested = mlirOpPassManagerGetNestedUnder(pm, mlirStringRefCreateFromCString(name));
                if (close <= open || add_marked(nested, text, open + 1, close - 1, names) < 0)
                    return -1;
            } else {
                mlirOpPassManagerAddOwnedPass(pm, marker_pass(name));
                mg_buf err = {0};
                MlirLogicalResult added = mlirOpPassManagerAddPipeline(
                    pm, mlirStringRefCreate(text + start, stop - start), append_callback, &err);
                free(err.data);
                if (mlirLogicalResultIsFailure(added))
                    return -1;
            }
        }
        start = stop + 1;
    }
    return 0;
}

static void name_list_free(name_list *names)
{
    for (size_t i = 0; i < names->count; i++)
        free(names->items[i]);
    free(names->items);
    *names = (name_list){0};
}

typedef struct {
    mg_private_context taken;
    MlirContext context;
    MlirPassManager pm;
    MlirStringRef source;
    int objects;           /* collect gpu objects rather than print */
    mg_diags diags;        /* the private context's diagnostics */
    int parsed, fatal;
    const char *crashed_in; /* the pass a crash or fatal error happened in, if marked */
    MlirLogicalResult ran;
    mg_buf text;           /* the lowered module, with its locations */
    gpu_object_list found;
} lowering;

/* Runs with the GIL released. */
static void lowering_run(lowering *l)
{
    MlirModule module = mlirModuleCreateParse(l->context, l->source);
    if (mlirModuleIsNull(module))
        return;
    l->parsed = 1;
    MlirOperation op = mlirModuleGetOperation(module);
    current_pass = NULL;
    l->fatal = run_guarded(l->pm, op, &l->ran);
    l->crashed_in = current_pass;
    if (l->fatal)
        return; /* LLVM's state is unknown: the module, pass manager and context are leaked */
    if (mlirLogicalResultIsSuccess(l->ran) && !mg_diags_has_error(&l->diags)) {
        if (l->objects)
            collect_gpu_objects(op, &l->found);
        else
            mg_ir_print_located(op, &l->text);
    }
    mlirModuleDestroy(module);
}

/* lower(source, pipeline, *, objects=False) */
static PyObject *lower(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"source", "pipeline", "objects", "_then_crash", NULL};
    PyObject *source, *pipeline, *text = NULL, *result = NULL;
    int objects = 0, then_crash = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OU|$pp:lower", kwlist, &source, &pipeline, &objects,
                                     &then_crash))
        return NULL;
    lowering l = {.objects = objects};
    mg_buf printed = {0};
    name_list names = {0};
    int allow_unregistered = 0;
    /* Owned while the GIL is released: its text is read meanwhile. */
    Py_INCREF(source);
    if (PyUnicode_Check(source)) {
        Py_ssize_t len;
        const char *data = PyUnicode_AsUTF8AndSize(source, &len);
        if (data == NULL)
            goto done;
        l.source = mlirStringRefCreate(data, (size_t)len);
    }
    else {
        mg_ir_Operation *op = mg_ir_module_operation(source);
        if (op == NULL)
            goto done;
        mg_ir_Context *ctx = op->context;
        mg_ir_diag_clear(ctx);
        if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx)) {
            mg_ir_diag_raise(ctx, mg_st->MLIRError, "the module does not verify; no pass ran");
            goto done;
        }
        allow_unregistered = mlirContextGetAllowUnregisteredDialects(ctx->context);
        mg_ir_print_located(op->op, &printed);
        if (printed.failed) {
            PyErr_NoMemory();
            goto done;
        }
        l.source = mlirStringRefCreate(printed.data ? printed.data : "", printed.len);
    }
    if (mg_ir_check_nesting(l.source) < 0)
        goto done;
    PyObject *opname = PyUnicode_FromString("builtin.module");
    text = opname != NULL ? anchored_pipeline(pipeline, opname) : NULL;
    Py_XDECREF(opname);
    Py_ssize_t text_len;
    const char *text_data = text != NULL ? PyUnicode_AsUTF8AndSize(text, &text_len) : NULL;
    if (text_data == NULL || mg_ir_check_nesting(mlirStringRefCreate(text_data, (size_t)text_len)) < 0)
        goto done; /* add_marked and MLIR's pipeline parser recurse per level */
    register_passes_once();
    l.taken = mg_ir_private_take(allow_unregistered, &l.diags);
    l.context = l.taken.context;
    MlirStringRef anchor = mlirStringRefCreateFromCString("builtin.module");
    /* Each pass after a marker naming it; where the text is not read that
     * way, parsed whole, as MLIR reports a bad pipeline, and run unmarked. */
    size_t prefix = strlen("builtin.module(");
    l.pm = mlirPassManagerCreateOnOperation(l.context, anchor);
    if (text_data[text_len - 1] != ')' ||
        add_marked(mlirPassManagerGetAsOpPassManager(l.pm), text_data, prefix, (size_t)text_len - 1, &names) < 0) {
        mlirPassManagerDestroy(l.pm);
        l.pm = mlirPassManagerCreateOnOperation(l.context, anchor);
        if (parse_pipeline(l.pm, text) < 0) {
            mlirPassManagerDestroy(l.pm);
            mg_ir_private_give_back(&l.taken);
            goto done;
        }
    }
    if (then_crash) {
        mlirPassManagerAddOwnedPass(l.pm, marker_pass("mlirgpu-crash-test"));
        mlirPassManagerAddOwnedPass(l.pm, crash_pass());
    }
    Py_BEGIN_ALLOW_THREADS
    lowering_run(&l);
    if (!l.fatal)
        mlirPassManagerDestroy(l.pm);
    Py_END_ALLOW_THREADS
    if (!l.fatal)
        mg_ir_private_give_back(&l.taken);
    if (!l.parsed)
        mg_diags_raise(&l.diags, mg_st->MLIRError, "cannot parse the module");
    else if (l.fatal)
        mg_raise(mg_st->CompileError, "%s in pass '%s' of '%U': %s. It ran on a copy of the module in a "
                 "context of its own, which is dropped: the module and its context work as before",
                 mg_fatal_signal != 0 ? "MLIR crashed" : "LLVM fatal error",
                 l.crashed_in != NULL ? l.crashed_in : "?", text, mg_fatal_reason);
    else if (mlirLogicalResultIsFailure(l.ran) || mg_diags_has_error(&l.diags)) {
        PyObject *what = PyUnicode_FromFormat("pass pipeline '%U' failed", text);
        const char *what_text = what != NULL ? PyUnicode_AsUTF8(what) : NULL;
        if (what_text != NULL)
            mg_diags_raise(&l.diags, mg_st->MLIRError, what_text);
        Py_XDECREF(what);
    }
    else if (mg_diags_warn(&l.diags) == 0)
        result = objects ? gpu_object_list_finish(&l.found) : mg_buf_finish(&l.text);
done:
    gpu_object_list_free(&l.found);
    free(l.text.data);
    mg_diags_clear(&l.diags);
    free(l.diags.items);
    free(printed.data);
    name_list_free(&names);
    Py_XDECREF(text);
    Py_DECREF(source);
    return result;
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
    {"llvm_bitcode_to_text", llvm_bitcode_to_text, METH_O, NULL},
    {"lower", (PyCFunction)(void (*)(void))lower, METH_VARARGS | METH_KEYWORDS,
     "lower(source, pipeline, *, objects=False) -> str | [(name, format, bytes)]: runs `pipeline` on a "
     "copy of `source` (an ir.Module, or the text a previous lower() returned) in an MLIR context of "
     "its own, without the GIL. Returns the lowered module's text with its locations, or with "
     "objects=True its gpu objects. MLIRError with the diagnostics if it does not parse or a pass "
     "fails; CompileError naming the pass on an LLVM fatal error or a crash inside MLIR "
     "(_then_crash=True adds a last pass that raises SIGTRAP, for the tests of the crash guard)."},
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
