/* mlirgpu._mlirgpu.ExecutionEngine (see engine.h and docs/design/host_runtime.md).
 *
 * Creation: verify, translate once to LLVM IR to list what the module
 * declares but does not define, refuse (CompileError) what neither the
 * process nor the runtime provides (LLVM's JIT would abort the process on it),
 * then create the engine, register the runtime symbols the module uses,
 * initialize it and look up every C interface, all under the fatal-error
 * guard. Invocation: memref descriptors over the arguments' memory, the call
 * without the GIL, the results copied into NumPy arrays and the memory they
 * owned freed. */
#include "host/engine.h"
#include "arrays/array.h"
#include "base/interrupt.h"
#include "cuda/driver.h"
#include "mlir/ir.h"
#include "host/async_runtime.h"
#include "host/runner_utils.h"
#include "host/runtime.h"

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/LLVM.h>
#include <mlir-c/ExecutionEngine.h>
#include <mlir-c/Target/LLVMIR.h>
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/numpy_api.h"
#include "host/engine_shared.h"
#define CIFACE_PREFIX "_mlir_ciface_"




static PyTypeObject *EngineType;

/* ------------------------------------------------------------------------ */
/* Reading the module                                                        */

static int ref_equals(MlirStringRef ref, const char *text)
{
    size_t n = strlen(text);
    return ref.length == n && memcmp(ref.data, text, n) == 0;
}

static int is_llvm_func(MlirOperation op)
{
    return ref_equals(mlirIdentifierStr(mlirOperationGetName(op)), "llvm.func");
}

static int has_body(MlirOperation op)
{
    return !mlirBlockIsNull(mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0)));
}

static MlirType function_type(MlirOperation op)
{
    return mlirTypeAttrGetValue(mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("function_type")));
}


/* Every llvm.func @_mlir_ciface_<name> with a body whose @<name> exists too. */
static int read_functions(mg_engine *self, MlirOperation module)
{
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(module, 0));
    MlirSymbolTable table = mlirSymbolTableCreate(module);
    Py_ssize_t count = 0;
    for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op))
        count += is_llvm_func(op);
    self->functions = PyMem_Calloc(count ? (size_t)count : 1, sizeof *self->functions);
    if (self->functions == NULL) {
        mlirSymbolTableDestroy(table);
        PyErr_NoMemory();
        return -1;
    }
    size_t prefix = strlen(CIFACE_PREFIX);
    for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op)) {
        if (!is_llvm_func(op) || !has_body(op))
            continue;
        MlirStringRef sym = mlirStringAttrGetValue(mlirOperationGetAttributeByName(op, mlirSymbolTableGetSymbolAttributeName()));
        if (sym.length <= prefix || memcmp(sym.data, CIFACE_PREFIX, prefix) != 0)
            continue;
        MlirStringRef base = {sym.data + prefix, sym.length - prefix};
        MlirOperation target = mlirSymbolTableLookup(table, base);
        if (mlirOperationIsNull(target) || !is_llvm_func(target))
            continue;
        engine_function *f = &self->functions[self->nfunctions];
        f->name = PyMem_Malloc(base.length + 1);
        if (f->name == NULL) {
            mlirSymbolTableDestroy(table);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(f->name, base.data, base.length);
        f->name[base.length] = '\0';
        f->type = function_type(target);
        f->interface = function_type(op);
        self->nfunctions++;
    }
    mlirSymbolTableDestroy(table);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Translation to LLVM IR and the module's external symbols                  */

typedef struct {
    MlirOperation module;
    LLVMContextRef llvm_context;
    LLVMModuleRef llvm_module;
} translation;

static void translate_body(void *arg)
{
    translation *t = arg;
    t->llvm_module = mlirTranslateModuleToLLVMIR(t->module, t->llvm_context);
}

/* The module's LLVM IR in a fresh LLVM context (dispose both), or NULL
 * with CompileError set. */
static LLVMModuleRef translate(mg_ir_Operation *op, LLVMContextRef *llvm_context)
{
    translation t = {op->op, LLVMContextCreate(), NULL};
    mg_ir_diag_clear(op->context);
    if (mg_fatal_guarded(translate_body, &t)) {
        /* LLVM's state is half-built: leaked, never touched. */
        mg_raise(mg_st->CompileError, "LLVM fatal error while translating to LLVM IR: %s", mg_fatal_reason);
        return NULL;
    }
    if (t.llvm_module == NULL) {
        LLVMContextDispose(t.llvm_context);
        if (mg_ir_diag_has_error(op->context))
            mg_ir_diag_raise(op->context, mg_st->CompileError, "translating the module to LLVM IR failed");
        else
            mg_raise(mg_st->CompileError, "translating the module to LLVM IR failed (is it lowered to the "
                                          "llvm dialect?)");
        return NULL;
    }
    *llvm_context = t.llvm_context;
    return t.llvm_module;
}

/* What the engine registers for `name`: its loops' poll, a runner utility,
 * or with the runtime one of its mgpu* functions; else NULL. */
static void *runtime_symbol(int runtime, const char *name)
{
    if (strcmp(name, "mg_host_poll") == 0)
        return (void *)mg_host_poll;
    void *address = mg_runner_symbol(name);
    if (address != NULL || !runtime)
        return address;
    address = mg_async_symbol(name);
    return address != NULL ? address : mg_rt_symbol(name);
}

/* Appends `value`'s name to `missing` unless the runtime or the process
 * provides it; names the runtime provides go to `registered`. */
static int resolve(LLVMValueRef value, int runtime, PyObject *missing, PyObject *registered)
{
    if (!LLVMIsDeclaration(value) || LLVMGetLinkage(value) == LLVMExternalWeakLinkage)
        return 0;
    size_t length;
    const char *name = LLVMGetValueName2(value, &length);
    PyObject *str = PyUnicode_DecodeUTF8(name, (Py_ssize_t)length, "replace");
    if (str == NULL)
        return -1;
    int status = 0;
    if (runtime_symbol(runtime, name) != NULL)
        status = PyList_Append(registered, str);
    else if (dlsym(RTLD_DEFAULT, name) == NULL)
        status = PyList_Append(missing, str);
    Py_DECREF(str);
    return status;
}

/* A list of the runtime symbols the module uses, or NULL with CompileError
 * naming every external symbol nothing provides. */
static PyObject *check_externals(mg_ir_Operation *op, int runtime)
{
    LLVMContextRef llvm_context;
    LLVMModuleRef llvm_module = translate(op, &llvm_context);
    if (llvm_module == NULL)
        return NULL;
    PyObject *missing = PyList_New(0), *registered = PyList_New(0), *text = NULL;
    if (missing == NULL || registered == NULL)
        goto error;
    for (LLVMValueRef f = LLVMGetFirstFunction(llvm_module); f != NULL; f = LLVMGetNextFunction(f))
        if (LLVMGetIntrinsicID(f) == 0 && resolve(f, runtime, missing, registered) < 0)
            goto error;
    for (LLVMValueRef g = LLVMGetFirstGlobal(llvm_module); g != NULL; g = LLVMGetNextGlobal(g))
        if (resolve(g, runtime, missing, registered) < 0)
            goto error;
    if (PyList_GET_SIZE(missing) > 0) {
        PyObject *sep = PyUnicode_FromString(", ");
        if (sep == NULL)
            goto error;
        text = PyUnicode_Join(sep, missing);
        Py_DECREF(sep);
        if (text == NULL)
            goto error;
        mg_raise(mg_st->CompileError, "the module calls or uses symbols that neither the process nor the "
                 "runtime provides: %U%s", text, runtime ? "" : " (mgpu* functions need runtime=True)");
        goto error;
    }
    Py_DECREF(missing);
    LLVMDisposeModule(llvm_module);
    LLVMContextDispose(llvm_context);
    return registered;
error:
    Py_XDECREF(text);
    Py_XDECREF(missing);
    Py_XDECREF(registered);
    LLVMDisposeModule(llvm_module);
    LLVMContextDispose(llvm_context);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                  */

typedef struct {
    MlirModule module;
    int opt_level;
    MlirExecutionEngine engine;
} creation;

/* Whether the llvm.func `op` names the CPU features to compile it for: a
 * target_features attribute, or "target-features" among its passthrough
 * attributes (`passthrough`, of `count` entries). */
static int names_features(MlirOperation op, MlirAttribute passthrough, intptr_t count)
{
    MlirStringRef features = mlirStringRefCreateFromCString("target_features");
    if (!mlirAttributeIsNull(mlirOperationGetInherentAttributeByName(op, features)))
        return 1;
    for (intptr_t i = 0; i < count; i++) {
        MlirAttribute entry = mlirArrayAttrGetElement(passthrough, i);
        if (mlirAttributeIsAArray(entry) && mlirArrayAttrGetNumElements(entry) == 2 &&
            mlirAttributeIsAString(mlirArrayAttrGetElement(entry, 0)) &&
            ref_equals(mlirStringAttrGetValue(mlirArrayAttrGetElement(entry, 0)), "target-features"))
            return 1;
    }
    return 0;
}

/* Where the CPU has AVX512-BF16 or AVX-NE-CONVERT, LLVM compiles an f32 to
 * bf16 conversion (and integer operations that round the same way, which it
 * recognizes) to vcvtneps2bf16, which flushes subnormal inputs to zero where
 * IEEE rounding and the GPU keep them. Each function that names no CPU
 * features of its own is compiled for the host's without those two: a
 * passthrough attribute, which becomes an LLVM function attribute. */
static void exact_bf16_conversions(MlirModule module)
{
    static const char without[] = ",-avx512bf16,-avxneconvert";
    char *host = LLVMGetHostCPUFeatures();
    size_t length = host != NULL ? strlen(host) : 0;
    char *features = malloc(length + sizeof without);
    MlirAttribute *entries = NULL;
    if (features == NULL)
        goto done;   /* the engine is still built, with LLVM's choice of instructions */
    memcpy(features, host != NULL ? host : "", length);
    memcpy(features + length, without, sizeof without);
    MlirContext context = mlirModuleGetContext(module);
    MlirAttribute pair[2] = {mlirStringAttrGet(context, mlirStringRefCreateFromCString("target-features")),
                             mlirStringAttrGet(context, mlirStringRefCreateFromCString(features))};
    MlirAttribute entry = mlirArrayAttrGet(context, 2, pair);
    MlirStringRef name = mlirStringRefCreateFromCString("passthrough");
    for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(module)); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op)) {
        if (!is_llvm_func(op))
            continue;
        MlirAttribute passthrough = mlirOperationGetInherentAttributeByName(op, name);
        intptr_t count = !mlirAttributeIsNull(passthrough) && mlirAttributeIsAArray(passthrough)
                       ? mlirArrayAttrGetNumElements(passthrough) : 0;
        if (names_features(op, passthrough, count))
            continue;
        MlirAttribute *grown = realloc(entries, (size_t)(count + 1) * sizeof *entries);
        if (grown == NULL)
            goto done;
        entries = grown;
        for (intptr_t i = 0; i < count; i++)
            entries[i] = mlirArrayAttrGetElement(passthrough, i);
        entries[count] = entry;
        mlirOperationSetInherentAttributeByName(op, name, mlirArrayAttrGet(context, count + 1, entries));
    }
done:
    free(entries);
    free(features);
    LLVMDisposeMessage(host);
}

static void create_body(void *arg)
{
    creation *c = arg;
    exact_bf16_conversions(c->module);
    /* Position-independent code: with the small code model a JIT'd call
     * reaches +-2 GB only, and a process holding a CUDA context has reserved
     * so much address space that the JIT's memory can land farther than that
     * from libc and from our runtime functions. */
    c->engine = mlirExecutionEngineCreate(c->module, c->opt_level, 0, NULL, false, true);
}

int mg_engine_print_source(mg_ir_Operation *op, mg_buf *out)
{
    mg_ir_print_located(op->op, out);
    if (out->failed) {
        free(out->data);
        *out = (mg_buf){0};
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

MlirExecutionEngine mg_engine_create_detached(MlirStringRef source, int allow_unregistered, int opt_level,
                                              const char *what)
{
    creation c = {{NULL}, opt_level, {NULL}};
    mg_diags diags = {0};
    int parsed, fatal = 0;
    if (mg_ir_check_nesting(source) < 0)
        return (MlirExecutionEngine){NULL};
    mg_private_context private = mg_ir_private_take(allow_unregistered, &diags);
    Py_BEGIN_ALLOW_THREADS
    c.module = mlirModuleCreateParse(private.context, source);
    parsed = !mlirModuleIsNull(c.module);
    if (parsed && !(fatal = mg_fatal_guarded(create_body, &c)))
        mlirModuleDestroy(c.module); /* the engine keeps an LLVM module of its own */
    Py_END_ALLOW_THREADS
    if (!fatal)
        mg_ir_private_give_back(&private); /* after a fatal error: leaked with what LLVM left in it */
    if (!parsed)
        mg_diags_raise(&diags, mg_st->MLIRError, "the module does not parse");
    else if (fatal)
        /* a half-built engine: leaked, never touched */
        mg_raise(mg_st->CompileError, "LLVM fatal error while JIT-compiling %s: %s", what, mg_fatal_reason);
    else if (mlirExecutionEngineIsNull(c.engine)) {
        if (mg_diags_has_error(&diags)) {
            char message[600];
            PyOS_snprintf(message, sizeof message, "JIT-compiling %s failed", what);
            mg_diags_raise(&diags, mg_st->CompileError, message);
        } else
            mg_raise(mg_st->CompileError, "JIT-compiling %s failed (is it lowered to the llvm dialect?)", what);
    }
    mg_diags_clear(&diags);
    free(diags.items);
    return c.engine;
}

typedef struct {
    mg_engine *self;
    Py_ssize_t missing; /* index of a function whose C interface was not found, or -1 */
} initialization;

/* Runs the module's global constructors and compiles it (the first lookup
 * materializes it), then finds every C interface. */
static void initialize_body(void *arg)
{
    initialization *init = arg;
    mg_engine *self = init->self;
    if (self->runtime)
        mg_rt_adopt_begin(self);
    mlirExecutionEngineInitialize(self->engine);
    mg_rt_adopt_end();
    char name[512];
    for (Py_ssize_t i = 0; i < self->nfunctions; i++) {
        engine_function *f = &self->functions[i];
        PyOS_snprintf(name, sizeof name, CIFACE_PREFIX "%s", f->name);
        f->call = (packed_fn)mlirExecutionEngineLookupPacked(self->engine, mlirStringRefCreateFromCString(name));
        if (f->call == NULL && init->missing < 0)
            init->missing = i;
    }
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"module", "opt_level", "runtime", NULL};
    PyObject *module;
    int opt_level = 2, runtime = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|ip:ExecutionEngine", kwlist, &module, &opt_level, &runtime))
        return NULL;
    if (opt_level < 0 || opt_level > 3)
        return PyErr_Format(PyExc_ValueError, "opt_level must be 0..3, not %d", opt_level);
    mg_ir_Operation *op = mg_ir_module_operation(module);
    if (op == NULL)
        return NULL;
    mg_ir_Context *ctx = op->context;
    mg_ir_diag_clear(ctx);
    if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx))
        return mg_ir_diag_raise(ctx, mg_st->MLIRError, "the module does not verify");

    mg_engine *self = (mg_engine *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->context = Py_NewRef((PyObject *)ctx);
    self->runtime = runtime;
    PyObject *registered = NULL;
    if (read_functions(self, op->op) < 0 || (registered = check_externals(op, runtime)) == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(registered); i++) {
        PyObject *symbol = PyList_GET_ITEM(registered, i);
        self->launches |= PyUnicode_CompareWithASCIIString(symbol, "mgpuLaunchKernel") == 0 ||
                          PyUnicode_CompareWithASCIIString(symbol, "mgpuLaunchClusterKernel") == 0;
        const char *text = PyUnicode_AsUTF8(symbol);
        if (text == NULL)
            goto error;
        self->prints |= mg_runner_symbol(text) != NULL;
    }
    self->prints |= self->launches;

    mg_buf source = {0};
    if (mg_engine_print_source(op, &source) < 0)
        goto error;
    self->engine = mg_engine_create_detached(mlirStringRefCreate(source.data, source.len),
                                             mlirContextGetAllowUnregisteredDialects(ctx->context), opt_level,
                                             "the module");
    free(source.data);
    if (mlirExecutionEngineIsNull(self->engine))
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(registered); i++) {
        const char *name = PyUnicode_AsUTF8(PyList_GET_ITEM(registered, i));
        if (name == NULL)
            goto error;
        mlirExecutionEngineRegisterSymbol(self->engine, mlirStringRefCreateFromCString(name),
                                          runtime_symbol(runtime, name));
    }
    for (const mg_runtime_symbol *c = mg_conversion_symbols; c->name != NULL; c++)
        mlirExecutionEngineRegisterSymbol(self->engine, mlirStringRefCreateFromCString(c->name), c->address);
    initialization init = {self, -1};
    /* No Python object can reach the engine yet, and the global constructors
     * call only the runtime, which needs no GIL outside a call: the JIT
     * compiles without it. */
    int fatal;
    Py_BEGIN_ALLOW_THREADS
    fatal = mg_fatal_guarded(initialize_body, &init);
    Py_END_ALLOW_THREADS
    if (fatal) {
        self->engine.ptr = NULL; /* half-initialized by LLVM: leaked, never touched */
        mg_raise(mg_st->CompileError, "LLVM fatal error while JIT-compiling the module: %s", mg_fatal_reason);
        goto error;
    }
    if (init.missing >= 0) {
        mg_raise(mg_st->CompileError, "the JIT found no C interface of %s", self->functions[init.missing].name);
        goto error;
    }
    Py_DECREF(registered);
    return (PyObject *)self;
error:
    Py_XDECREF(registered);
    Py_DECREF(self);
    return NULL;
}

static void Engine_dealloc(mg_engine *self)
{
    PyTypeObject *type = Py_TYPE(self);
    /* The JIT first: its global destructors unload the kernel modules its
     * constructors loaded while they are still listed. Released the other way
     * round, a destructor was handed a module freed already, whose address a
     * newer engine's module may have taken (docs/design/host_runtime.md). */
    if (!mlirExecutionEngineIsNull(self->engine))
        mlirExecutionEngineDestroy(self->engine);
    if (self->runtime)
        mg_rt_release_modules(self); /* what no destructor unloaded (a half-built engine's) */
    for (Py_ssize_t i = 0; i < self->nfunctions; i++)
        PyMem_Free(self->functions[i].name);
    PyMem_Free(self->functions);
    Py_XDECREF(self->context);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* Ctrl-C during a call: HostProgram puts a call of mg_host_poll at the top
 * of each loop's body, which jumps out of the program back to the call of
 * it on this thread. What the program allocated is lost, as its frames. */
static _Thread_local sigjmp_buf *interrupt_target;
static _Thread_local uint64_t interrupt_since;

void mg_host_poll(void)
{
    /* Only on the calling thread: an async.execute body's thread has no target. */
    if (interrupt_target != NULL && mg_interrupted(interrupt_since))
        siglongjmp(*interrupt_target, 1);
}

/* Runs call(packed) until it returns (0) or a SIGINT since `since` reaches a poll (1). */
static int call_interruptibly(packed_fn call, void **packed, uint64_t since)
{
    sigjmp_buf target;
    sigjmp_buf *outer = interrupt_target;
    uint64_t outer_since = interrupt_since;
    int interrupted = sigsetjmp(target, 0);
    if (!interrupted) {
        interrupt_target = &target;
        interrupt_since = since;
        call(packed);
    }
    interrupt_target = outer;
    interrupt_since = outer_since;
    return interrupted;
}

static PyObject *Engine_invoke(mg_engine *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "args", "results", "timeline", NULL};
    const char *name;
    PyObject *arglist, *resultlist = NULL, *timeline = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO|O$O:invoke", kwlist, &name, &arglist, &resultlist, &timeline))
        return NULL;
    if (timeline != Py_None && !PyList_Check(timeline))
        return PyErr_Format(PyExc_TypeError, "timeline must be None or a list, not %.100s", Py_TYPE(timeline)->tp_name);
    if (timeline != Py_None && !self->runtime)
        return PyErr_Format(PyExc_ValueError, "timeline needs an engine made with runtime=True");
    engine_function *f = mg_engine_find_function(self, name);
    if (f == NULL)
        return PyErr_Format(PyExc_ValueError, "the module has no function '%s' with llvm.emit_c_interface", name);
    /* Before the arguments are read: flushing may run Python code (any sys.stdout). */
    if (self->prints)
        mg_engine_flush_python_stdout();

    /* Tuples of our own: reading an item (__index__, a buffer) may run Python code that changes a list. */
    PyObject *argseq = mg_engine_tuple_of(arglist, "args must be a sequence");
    if (argseq == NULL)
        return NULL;
    PyObject *resseq = resultlist != NULL ? mg_engine_tuple_of(resultlist, "results must be a sequence") : PyTuple_New(0);
    if (resseq == NULL) {
        Py_DECREF(argseq);
        return NULL;
    }
    Py_ssize_t nargs = PySequence_Fast_GET_SIZE(argseq), nresults = PySequence_Fast_GET_SIZE(resseq);
    PyObject *result = NULL, *tuple = NULL;
    result_spec *spec = PyMem_Calloc(nresults ? (size_t)nresults : 1, sizeof *spec);
    borrowed *lent = PyMem_Calloc(nargs ? (size_t)nargs : 1, sizeof *lent);
    result_memory *memory = PyMem_Calloc(nresults ? (size_t)nresults : 1, sizeof *memory);
    int64_t *slots = NULL;
    if (spec == NULL || lent == NULL || memory == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t struct_size;
    if (mg_engine_check_results(f, name, resseq, spec, &struct_size) < 0)
        goto done;
    /* Several results, or a memref, come back through a pointer passed first. */
    int by_pointer = nresults > 1 || (nresults == 1 && spec[0].memref);
    intptr_t nparams = mlirLLVMFunctionTypeGetNumInputs(f->interface);
    if (nargs != nparams - by_pointer) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, (Py_ssize_t)(nparams - by_pointer),
                     nargs);
        goto done;
    }

    /* One block: per argument a scalar slot and a pointer to its descriptor,
     * the packed array, the result struct, then the descriptors. */
    size_t nslots = 3 * (size_t)nargs + 3 + (struct_size + 15) / 8 + mg_engine_descriptor_slots(argseq);
    slots = PyMem_Calloc(nslots, sizeof *slots);
    if (slots == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *scalars = slots;                           /* nargs */
    void **pointers = (void **)(scalars + nargs);       /* nargs + 1: what a ptr parameter points to */
    void **packed = pointers + nargs + 1;               /* nargs + 1 (+ the return slot) */
    int64_t *returned = (int64_t *)(packed + nargs + 2); /* the result struct or the scalar returned */
    int64_t *descriptors = returned + (struct_size + 15) / 8;

    Py_ssize_t k = 0;
    if (by_pointer) {
        pointers[nargs] = returned;
        packed[k++] = &pointers[nargs];
    }
    int64_t *d = descriptors;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (mg_engine_pack_argument(f, by_pointer, i, PySequence_Fast_GET_ITEM(argseq, i), scalars, pointers, packed, &k, &d,
                          lent) < 0)
            goto done;
    if (nresults == 1 && !by_pointer)
        packed[k++] = returned;

    mg_rt_state *state = NULL;
    if (self->runtime && (state = mg_rt_begin(f->name, timeline != Py_None)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; state != NULL && self->launches && i < nargs; i++)
        if (lent[i].descriptor != NULL)
            mg_engine_lend(state, (PyArrayObject *)PySequence_Fast_GET_ITEM(argseq, i), &lent[i]);
    packed_fn call = f->call;
    uint64_t interrupts = mg_interrupt_watch();
    int interrupted;
    Py_BEGIN_ALLOW_THREADS
    interrupted = call_interruptibly(call, packed, interrupts);
    if (state != NULL)
        mg_rt_synchronize(state);
    if (self->prints)
        fflush(stdout);
    Py_END_ALLOW_THREADS
    /* After a runtime failure or Ctrl-C the results are garbage: only what the
     * function allocated on the host is freed, then mg_rt_end raises. */
    int skip = interrupted || (state != NULL && mg_rt_failed(state));
    /* Python's handler raises KeyboardInterrupt; a user's that does not still stops the call. */
    if (interrupted && PyErr_CheckSignals() == 0)
        PyErr_SetNone(PyExc_KeyboardInterrupt);

    skip = mg_engine_result_owners(state, name, spec, memory, nresults, returned, argseq, lent, skip);
    tuple = skip ? NULL : mg_engine_results_tuple(spec, memory, nresults, returned);
    mg_engine_free_function_results(spec, memory, nresults, returned);
    if (state != NULL && mg_engine_end_invocation(state, timeline) < 0)
        Py_CLEAR(tuple);
    if (tuple != NULL)
        result = nresults == 0 ? Py_NewRef(Py_None) : Py_NewRef(tuple);
done:
    Py_XDECREF(tuple);
    PyMem_Free(slots);
    PyMem_Free(memory);
    PyMem_Free(lent);
    PyMem_Free(spec);
    Py_DECREF(resseq);
    Py_DECREF(argseq);
    return result;
}

static PyObject *Engine_get_functions(mg_engine *self, void *unused)
{
    PyObject *names = PyTuple_New(self->nfunctions);
    for (Py_ssize_t i = 0; names != NULL && i < self->nfunctions; i++) {
        PyObject *name = PyUnicode_FromString(self->functions[i].name);
        if (name == NULL)
            Py_CLEAR(names);
        else
            PyTuple_SET_ITEM(names, i, name);
    }
    return names;
}

static PyObject *Engine_get_compiler_log(mg_engine *self, void *unused)
{
    return mg_rt_compiler_log(self);
}

static PyObject *Engine_get_runtime(mg_engine *self, void *unused)
{
    return PyBool_FromLong(self->runtime);
}

static PyObject *Engine_repr(mg_engine *self)
{
    PyObject *names = Engine_get_functions(self, NULL);
    if (names == NULL)
        return NULL;
    PyObject *text = PyUnicode_FromFormat("<mlirgpu.ExecutionEngine functions=%R runtime=%s>", names,
                                          self->runtime ? "True" : "False");
    Py_DECREF(names);
    return text;
}

/* ------------------------------------------------------------------------ */
/* translate_to_llvm_ir                                                      */

static PyObject *translate_to_llvm_ir(PyObject *unused, PyObject *module)
{
    mg_ir_Operation *op = mg_ir_module_operation(module);
    if (op == NULL)
        return NULL;
    LLVMContextRef llvm_context;
    LLVMModuleRef llvm_module = translate(op, &llvm_context);
    if (llvm_module == NULL)
        return NULL;
    char *text = LLVMPrintModuleToString(llvm_module);
    PyObject *result = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    LLVMDisposeMessage(text);
    LLVMDisposeModule(llvm_module);
    LLVMContextDispose(llvm_context);
    return result;
}

static PyObject *runtime_functions(PyObject *unused, PyObject *noargs)
{
    return mg_rt_names();
}

static PyMethodDef engine_functions[] = {
    {"runtime_functions", runtime_functions, METH_NOARGS,
     "runtime_functions() -> the names of the mgpu* functions an ExecutionEngine made with runtime=True provides."},
    {"translate_to_llvm_ir", translate_to_llvm_ir, METH_O,
     "translate_to_llvm_ir(module): the LLVM IR text of a module lowered to the llvm dialect (what the "
     "ExecutionEngine compiles). CompileError if it does not translate."},
    {NULL},
};

static PyMethodDef Engine_methods[] = {
    {"invoke", (PyCFunction)(void (*)(void))Engine_invoke, METH_VARARGS | METH_KEYWORDS,
     "invoke(name, args, results=(), *, timeline=None): calls the function `name` (a func.func with "
     "llvm.emit_c_interface) through its C interface, without the GIL.\n\n"
     "args: per parameter a numpy.ndarray or mlirgpu.DeviceArray (a memref descriptor over its memory: "
     "offset 0, its shape, its strides in elements; zero strides and read-only arrays accepted; the memory "
     "is borrowed for the call), or the bytes of a scalar (1, 2, 4 or 8, as the parameter's type). "
     "results: per result ('memref', rank, dtype) or ('scalar', dtype), checked against the function's "
     "return type. Returns a tuple of NumPy arrays (copies) and NumPy scalars, or None without results. "
     "Memory a memref result owns (not an argument's, not a memref.get_global) is freed after the copy.\n\n"
     "Only the number of arguments and whether each is a memref or a scalar of the right size are checked: "
     "the ranks and element types of memrefs are the caller's to check. ValueError for an unknown name, "
     "results that do not match, a stride that is not a multiple of the item size or a scalar of the "
     "wrong size; TypeError for a wrong number or kind of arguments.\n\n"
     "With runtime=True: a failure of the GPU runtime during the call raises CudaError once it returned; "
     "memory, streams and events the call left are released; memref results in its GPU memory are copied "
     "from the device; `timeline`, a list, receives (kernel, stream, start_ms, end_ms) per kernel launch."},
    {NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"functions", (getter)Engine_get_functions, NULL, "Names of the functions invoke can call.", NULL},
    {"runtime", (getter)Engine_get_runtime, NULL, "Whether mlirgpu's mgpu* runtime is registered.", NULL},
    {"compiler_log", (getter)Engine_get_compiler_log, NULL, "What the driver's JIT reported (verbose) compiling "
     "the PTX of the kernels loaded so far (with runtime=True): '' before that, and for cubins.", NULL},
    {NULL},
};

static PyType_Slot Engine_slots[] = {
    {Py_tp_doc, "ExecutionEngine(module, opt_level=2, runtime=False): an mlirgpu.ir.Module lowered to the llvm "
                "dialect, JIT-compiled for the host by MLIR's ExecutionEngine. The module must verify "
                "(MLIRError) and every symbol it declares must be provided by the process (dlsym: libc, libm) "
                "or, with runtime=True, by mlirgpu's mgpu* runtime; otherwise CompileError names them. "
                "LLVM fatal errors while compiling become CompileError."},
    {Py_tp_new, Engine_new},
    {Py_tp_dealloc, Engine_dealloc},
    {Py_tp_repr, Engine_repr},
    {Py_tp_methods, Engine_methods},
    {Py_tp_getset, Engine_getset},
    {0, NULL},
};

static PyType_Spec Engine_spec = {
    .name = "mlirgpu.ExecutionEngine",
    .basicsize = sizeof(mg_engine),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Engine_slots,
};

int mg_engine_init(PyObject *module)
{
    EngineType = mg_add_type(module, &Engine_spec, NULL);
    if (EngineType == NULL)
        return -1;
    return PyModule_AddFunctions(module, engine_functions);
}
