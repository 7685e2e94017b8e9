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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/numpy_api.h"

#define CIFACE_PREFIX "_mlir_ciface_"
/* What memref.get_global puts in a descriptor's allocated pointer. */
#define MG_GLOBAL_MARKER ((uintptr_t)0xdeadbeef)

typedef void (*packed_fn)(void **);

typedef struct {
    char *name;         /* the func.func's name (PyMem) */
    packed_fn call;     /* the packed wrapper of _mlir_ciface_<name> */
    MlirType type;      /* llvm.func @<name>'s: its return type says how results come back */
    MlirType interface; /* llvm.func @_mlir_ciface_<name>'s */
} engine_function;

typedef struct {
    PyObject_HEAD
    MlirExecutionEngine engine;
    PyObject *context; /* the ir.Context the types above live in */
    engine_function *functions;
    Py_ssize_t nfunctions;
    int runtime;
    int launches; /* the module launches kernels: NumPy arguments are lent to the GPU */
    int prints;   /* it calls runner utilities or launches kernels (printf): output is ordered */
} mg_engine;

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

static PyObject *type_str(MlirType type)
{
    mg_buf buf = {0};
    mlirTypePrint(type, mg_buf_callback, &buf);
    return mg_buf_finish(&buf);
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

/* What the engine registers for `name`: a runner utility, or with the
 * runtime one of its mgpu* functions; else NULL. */
static void *runtime_symbol(int runtime, const char *name)
{
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
    if (self->runtime) {
        /* LLVM's teardown of an engine whose module loads kernels (global
         * constructors and destructors from gpu.binary) left the H100
         * machine's heap corrupt in about half of the test runs that made and
         * dropped such engines (docs/design/host_runtime.md): its JIT is kept, and
         * the kernel modules its constructors loaded are released here. */
        mg_rt_release_modules(self);
    } else if (!mlirExecutionEngineIsNull(self->engine)) {
        mlirExecutionEngineDestroy(self->engine);
    }
    for (Py_ssize_t i = 0; i < self->nfunctions; i++)
        PyMem_Free(self->functions[i].name);
    PyMem_Free(self->functions);
    Py_XDECREF(self->context);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* ------------------------------------------------------------------------ */
/* Results: what invoke is told to expect, checked against the function      */

typedef struct {
    int memref;        /* ("memref", rank, dtype), else ("scalar", dtype) */
    int rank;
    mg_dtype *dtype;   /* borrowed singleton */
    size_t size, align, offset; /* in the result struct */
} result_spec;

static MlirType scalar_type(MlirContext ctx, mg_dtype *dt)
{
    switch (dt->id) {
    case MG_DT_BOOL: return mlirIntegerTypeGet(ctx, 1);
    case MG_DT_F16: return mlirF16TypeGet(ctx);
    case MG_DT_BF16: return mlirBF16TypeGet(ctx);
    case MG_DT_F8E4M3: return mlirFloat8E4M3FNTypeGet(ctx);
    case MG_DT_F8E5M2: return mlirFloat8E5M2TypeGet(ctx);
    case MG_DT_F32: return mlirF32TypeGet(ctx);
    case MG_DT_F64: return mlirF64TypeGet(ctx);
    default: return mlirIntegerTypeGet(ctx, (unsigned)dt->itemsize * 8);
    }
}

/* The LLVM struct of a memref descriptor of `rank`. */
static MlirType descriptor_type(MlirContext ctx, int rank)
{
    MlirType ptr = mlirLLVMPointerTypeGet(ctx, 0), i64 = mlirIntegerTypeGet(ctx, 64);
    MlirType array = mlirLLVMArrayTypeGet(i64, (unsigned)rank);
    MlirType fields[5] = {ptr, ptr, i64, array, array};
    return mlirLLVMStructTypeLiteralGet(ctx, rank > 0 ? 5 : 3, fields, false);
}

static MlirType result_type(MlirContext ctx, const result_spec *r)
{
    return r->memref ? descriptor_type(ctx, r->rank) : scalar_type(ctx, r->dtype);
}

/* The return type func-to-llvm gives a function with these results. */
static MlirType expected_return(MlirContext ctx, const result_spec *spec, Py_ssize_t n)
{
    if (n == 0)
        return mlirLLVMVoidTypeGet(ctx);
    if (n == 1)
        return result_type(ctx, &spec[0]);
    MlirType *fields = PyMem_Calloc((size_t)n, sizeof *fields);
    if (fields == NULL)
        return (MlirType){NULL};
    for (Py_ssize_t i = 0; i < n; i++)
        fields[i] = result_type(ctx, &spec[i]);
    MlirType type = mlirLLVMStructTypeLiteralGet(ctx, n, fields, false);
    PyMem_Free(fields);
    return type;
}

static int parse_result(PyObject *item, Py_ssize_t i, result_spec *r)
{
    PyObject *kind = PyTuple_Check(item) && PyTuple_GET_SIZE(item) > 0 ? PyTuple_GET_ITEM(item, 0) : NULL;
    int memref = kind != NULL && PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "memref") == 0;
    int scalar = kind != NULL && PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "scalar") == 0;
    if ((memref && PyTuple_GET_SIZE(item) != 3) || (scalar && PyTuple_GET_SIZE(item) != 2) || (!memref && !scalar)) {
        PyErr_Format(PyExc_ValueError, "results[%zd] must be ('memref', rank, dtype) or ('scalar', dtype), not %R",
                     i, item);
        return -1;
    }
    r->memref = memref;
    r->rank = 0;
    if (memref) {
        int overflow;
        long rank = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(item, 1), &overflow);
        if (rank == -1 && PyErr_Occurred())
            return -1;
        if (overflow || rank < 0 || rank > NPY_MAXDIMS) {
            PyErr_Format(PyExc_ValueError, "results[%zd]: rank must be 0..%d", i, NPY_MAXDIMS);
            return -1;
        }
        r->rank = (int)rank;
    }
    if (!mg_dtype_converter(PyTuple_GET_ITEM(item, memref ? 2 : 1), &r->dtype))
        return -1;
    r->size = memref ? (size_t)(3 + 2 * r->rank) * 8 : (size_t)r->dtype->itemsize;
    r->align = memref ? 8 : r->size;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Arguments                                                                 */

/* Bytes of a scalar parameter of the C interface (8 for a pointer), or 0
 * for a type invoke cannot pass. */
static Py_ssize_t parameter_bytes(MlirType t)
{
    if (mlirTypeIsALLVMPointerType(t))
        return 8;
    if (mlirTypeIsAInteger(t)) {
        unsigned width = mlirIntegerTypeGetWidth(t);
        return width <= 64 ? (Py_ssize_t)(width + 7) / 8 : 0;
    }
    if (mlirTypeIsAF16(t) || mlirTypeIsABF16(t))
        return 2;
    if (mlirTypeIsAF32(t))
        return 4;
    if (mlirTypeIsAF64(t))
        return 8;
    return 0;
}

/* Where an argument's memory is, to tell a returned view of it from
 * memory the function allocated. */
typedef struct {
    uintptr_t allocated;
    int device;          /* a DeviceArray in device memory */
    int64_t *descriptor; /* a NumPy array's, else NULL */
} borrowed;

/* Fills `d` with a memref descriptor over `data`; -1 with ValueError when
 * a stride is not a multiple of the element size. */
static int fill_descriptor(int64_t *d, void *data, int rank, const npy_intp *shape, const npy_intp *strides,
                           Py_ssize_t itemsize, Py_ssize_t i)
{
    d[0] = d[1] = (int64_t)(intptr_t)data;
    d[2] = 0;
    for (int k = 0; k < rank; k++) {
        if (strides[k] % itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "argument %zd: stride %zd of dimension %d is not a multiple of the "
                         "item size %zd", i, (Py_ssize_t)strides[k], k, itemsize);
            return -1;
        }
        d[3 + k] = shape[k];
        d[3 + rank + k] = strides[k] / itemsize;
    }
    return 0;
}

/* Kernels cannot read pageable host memory: the memory of NumPy array `a`
 * (the span its descriptor covers) is lent to the call, and the descriptor
 * points into the copy. */
static void lend(mg_rt_state *state, PyArrayObject *a, borrowed *b)
{
    int64_t *d = b->descriptor;
    int rank = PyArray_NDIM(a);
    int64_t itemsize = PyArray_ITEMSIZE(a), low = 0, high = 0;
    for (int k = 0; k < rank; k++) {
        int64_t size = d[3 + k], stride = d[3 + rank + k];
        if (size == 0)
            return;
        *(stride < 0 ? &low : &high) += (size - 1) * stride;
    }
    char *first = (char *)(intptr_t)d[1] + low * itemsize;
    char *copy = mg_rt_lend(state, first, (size_t)((high - low + 1) * itemsize), PyArray_ISWRITEABLE(a));
    d[0] = d[1] = (int64_t)(intptr_t)(copy - low * itemsize);
    b->allocated = (uintptr_t)d[0];
}

/* ------------------------------------------------------------------------ */
/* Copying memref results                                                    */

enum { OWNER_FUNCTION, OWNER_ARGUMENT, OWNER_GLOBAL, OWNER_RUNTIME };

typedef struct {
    int owner;
    int device; /* its memory is device memory */
} result_memory;

/* The calling thread's stack: a memref.alloca returned is gone. */
static int on_stack(uintptr_t p)
{
    static _Thread_local uintptr_t low, high;
    if (high == 0) {
        pthread_attr_t attr;
        void *base;
        size_t size;
        if (pthread_getattr_np(pthread_self(), &attr) != 0)
            return 0;
        if (pthread_attr_getstack(&attr, &base, &size) == 0) {
            low = (uintptr_t)base;
            high = low + size;
        }
        pthread_attr_destroy(&attr);
    }
    return p >= low && p < high;
}

/* A C-contiguous NumPy copy of the memref `d` of `rank`, whose memory is on
 * the host or (`device`) on the GPU. Steals `descr`. */
static PyObject *copy_memref(const int64_t *d, int rank, PyArray_Descr *descr, int device, Py_ssize_t i)
{
    npy_intp shape[NPY_MAXDIMS], strides[NPY_MAXDIMS];
    Py_ssize_t itemsize = PyDataType_ELSIZE(descr);
    int64_t low = 0, high = 0, empty = 0; /* the elements touched, relative to the first */
    for (int k = 0; k < rank; k++) {
        int64_t size = d[3 + k], stride = d[3 + rank + k];
        if (size < 0) {
            Py_DECREF(descr);
            return PyErr_Format(PyExc_ValueError, "result %zd: dimension %d has size %lld", i, k, (long long)size);
        }
        shape[k] = (npy_intp)size;
        strides[k] = (npy_intp)(stride * itemsize);
        empty |= size == 0;
        if (size > 0)
            *(stride < 0 ? &low : &high) += (size - 1) * stride;
    }
    char *first = (char *)(intptr_t)d[1] + d[2] * itemsize;
    if (empty)
        return PyArray_Empty(rank, shape, descr, 0);
    if (d[1] == 0) {
        Py_DECREF(descr);
        return PyErr_Format(PyExc_ValueError, "result %zd is a memref over a null pointer", i);
    }
    char *staging = NULL;
    if (device) {
        /* The span the memref covers comes to the host first. */
        size_t span = (size_t)(high - low + 1) * (size_t)itemsize;
        staging = PyMem_Malloc(span);
        if (staging == NULL) {
            Py_DECREF(descr);
            return PyErr_NoMemory();
        }
        CUresult r = CUDA_SUCCESS;
        if (mg_cu_ensure_context() == 0) {
            CUdeviceptr source = (CUdeviceptr)(first + low * itemsize);
            Py_BEGIN_ALLOW_THREADS
            r = mg_cu.cuMemcpyDtoHAsync(staging, source, span, NULL);
            if (r == CUDA_SUCCESS)
                r = mg_cu.cuStreamSynchronize(NULL);
            Py_END_ALLOW_THREADS
        }
        if (PyErr_Occurred() || mg_cu_check(r, "copying a memref result to the host: cuMemcpyDtoHAsync") < 0) {
            PyMem_Free(staging);
            Py_DECREF(descr);
            return NULL;
        }
        first = staging - low * itemsize;
    }
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, strides, first, 0, NULL);
    PyObject *copy = view != NULL ? PyArray_NewCopy((PyArrayObject *)view, NPY_CORDER) : NULL;
    Py_XDECREF(view);
    PyMem_Free(staging);
    return copy;
}

/* ------------------------------------------------------------------------ */
/* invoke                                                                    */

/* What Python printed before the call comes before what the program prints
 * (C stdio on file descriptor 1). Printing is not worth failing a call for:
 * a sys.stdout that cannot flush is left as it is. */
static void flush_python_stdout(void)
{
    PyObject *out = PySys_GetObject("stdout"); /* borrowed */
    if (out == NULL || out == Py_None)
        return;
    PyObject *done = PyObject_CallMethod(out, "flush", NULL);
    if (done == NULL)
        PyErr_Clear();
    Py_XDECREF(done);
}

static engine_function *find_function(mg_engine *self, const char *name)
{
    for (Py_ssize_t i = 0; i < self->nfunctions; i++)
        if (strcmp(self->functions[i].name, name) == 0)
            return &self->functions[i];
    return NULL;
}

/* Checks `results` against f's return type; fills spec and the struct layout. */
static int check_results(engine_function *f, const char *name, PyObject *seq, result_spec *spec, size_t *struct_size)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t offset = 0, align = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        result_spec *r = &spec[i];
        if (parse_result(PySequence_Fast_GET_ITEM(seq, i), i, r) < 0)
            return -1;
        offset = (offset + r->align - 1) / r->align * r->align;
        r->offset = offset;
        offset += r->size;
        align = r->align > align ? r->align : align;
    }
    *struct_size = (offset + align - 1) / align * align;
    MlirType returned = mlirLLVMFunctionTypeGetReturnType(f->type);
    MlirType expected = expected_return(mlirTypeGetContext(f->type), spec, n);
    if (mlirTypeIsNull(expected)) {
        PyErr_NoMemory();
        return -1;
    }
    if (!mlirTypeEqual(returned, expected)) {
        PyObject *text = type_str(returned);
        if (text != NULL)
            PyErr_Format(PyExc_ValueError, "%s returns %U (in the llvm dialect), which results=%R does not describe",
                         name, text, seq);
        Py_XDECREF(text);
        return -1;
    }
    return 0;
}

static PyObject *parameter_error(PyObject *cls, engine_function *f, int by_pointer, Py_ssize_t i, const char *what)
{
    PyObject *text = type_str(mlirLLVMFunctionTypeGetInput(f->interface, i + by_pointer));
    if (text != NULL)
        PyErr_Format(cls, "argument %zd of %s: the parameter is %U (in the C interface), %s", i, f->name, text, what);
    Py_XDECREF(text);
    return NULL;
}

/* A new reference to a tuple of the items of `seq` (TypeError `message` when it is no sequence). */
static PyObject *tuple_of(PyObject *seq, const char *message)
{
    PyObject *fast = PySequence_Fast(seq, message);
    if (fast == NULL || !PyList_Check(fast))
        return fast;
    PyObject *tuple = PyList_AsTuple(fast);
    Py_DECREF(fast);
    return tuple;
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
    engine_function *f = find_function(self, name);
    if (f == NULL)
        return PyErr_Format(PyExc_ValueError, "the module has no function '%s' with llvm.emit_c_interface", name);
    /* Before the arguments are read: flushing may run Python code (any sys.stdout). */
    if (self->prints)
        flush_python_stdout();

    /* Tuples of our own: reading an item (__index__, a buffer) may run Python code that changes a list. */
    PyObject *argseq = tuple_of(arglist, "args must be a sequence");
    if (argseq == NULL)
        return NULL;
    PyObject *resseq = resultlist != NULL ? tuple_of(resultlist, "results must be a sequence") : PyTuple_New(0);
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
    if (check_results(f, name, resseq, spec, &struct_size) < 0)
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
    size_t ndesc = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = PySequence_Fast_GET_ITEM(argseq, i);
        if (PyArray_Check(arg))
            ndesc += 3 + 2 * (size_t)PyArray_NDIM((PyArrayObject *)arg);
        else if (PyObject_TypeCheck(arg, mg_array_type))
            ndesc += 3 + 2 * (size_t)((mg_array *)arg)->ndim;
    }
    size_t nslots = 3 * (size_t)nargs + 3 + (struct_size + 15) / 8 + ndesc;
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
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = PySequence_Fast_GET_ITEM(argseq, i);
        MlirType param = mlirLLVMFunctionTypeGetInput(f->interface, i + by_pointer);
        Py_ssize_t bytes = parameter_bytes(param);
        if (bytes == 0) {
            parameter_error(PyExc_TypeError, f, by_pointer, i, "which invoke cannot pass");
            goto done;
        }
        if (PyBytes_Check(arg)) {
            Py_ssize_t n = PyBytes_GET_SIZE(arg);
            if (n != 1 && n != 2 && n != 4 && n != 8) {
                PyErr_Format(PyExc_ValueError, "argument %zd: a scalar is 1, 2, 4 or 8 bytes, got %zd", i, n);
                goto done;
            }
            if (n != bytes) {
                char what[64];
                PyOS_snprintf(what, sizeof what, "not %zd bytes", n);
                parameter_error(PyExc_ValueError, f, by_pointer, i, what);
                goto done;
            }
            memcpy(&scalars[i], PyBytes_AS_STRING(arg), (size_t)n);
            packed[k++] = &scalars[i];
            continue;
        }
        int is_ndarray = PyArray_Check(arg), is_device_array = PyObject_TypeCheck(arg, mg_array_type);
        if (!is_ndarray && !is_device_array) {
            PyErr_Format(PyExc_TypeError, "argument %zd: expected a numpy.ndarray, an mlirgpu.DeviceArray or the "
                         "bytes of a scalar, not %.100s", i, Py_TYPE(arg)->tp_name);
            goto done;
        }
        if (!mlirTypeIsALLVMPointerType(param)) {
            parameter_error(PyExc_TypeError, f, by_pointer, i, "not a memref");
            goto done;
        }
        int64_t *descriptor = d;
        if (is_ndarray) {
            PyArrayObject *a = (PyArrayObject *)arg;
            PyArray_Descr *descr = PyArray_DESCR(a);
            if (PyDataType_FLAGCHK(descr, NPY_ITEM_REFCOUNT) || PyDataType_ELSIZE(descr) == 0) {
                PyErr_Format(PyExc_TypeError, "argument %zd: arrays of dtype %R cannot be passed", i, (PyObject *)descr);
                goto done;
            }
            if (fill_descriptor(d, PyArray_DATA(a), PyArray_NDIM(a), PyArray_DIMS(a), PyArray_STRIDES(a),
                                PyDataType_ELSIZE(descr), i) < 0)
                goto done;
            lent[i] = (borrowed){(uintptr_t)PyArray_DATA(a), 0, d};
            d += 3 + 2 * PyArray_NDIM(a);
        } else {
            mg_array *a = (mg_array *)arg;
            npy_intp shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
            for (int j = 0; j < a->ndim; j++) {
                shape[j] = a->shape[j];
                strides[j] = a->strides[j];
            }
            if (fill_descriptor(d, (void *)(uintptr_t)a->ptr, a->ndim, shape, strides, a->dtype->itemsize, i) < 0)
                goto done;
            lent[i] = (borrowed){(uintptr_t)a->ptr, !a->host, NULL};
            d += 3 + 2 * a->ndim;
        }
        /* The C interface takes a pointer to the descriptor; packed, a pointer to that. */
        pointers[i] = descriptor;
        packed[k++] = &pointers[i];
    }
    if (nresults == 1 && !by_pointer)
        packed[k++] = returned;

    mg_rt_state *state = NULL;
    if (self->runtime && (state = mg_rt_begin(f->name, timeline != Py_None)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; state != NULL && self->launches && i < nargs; i++)
        if (lent[i].descriptor != NULL)
            lend(state, (PyArrayObject *)PySequence_Fast_GET_ITEM(argseq, i), &lent[i]);
    packed_fn call = f->call;
    Py_BEGIN_ALLOW_THREADS
    call(packed);
    if (state != NULL)
        mg_rt_synchronize(state);
    if (self->prints)
        fflush(stdout);
    Py_END_ALLOW_THREADS
    /* After a runtime failure the results are garbage: only what the
     * function allocated on the host is freed, then mg_rt_end raises. */
    int skip = state != NULL && mg_rt_failed(state);

    /* Who owns each memref result's memory: an argument, a global, the
     * runtime (freed by mg_rt_end), or the function (memory it allocated,
     * which comes back copied and is freed here). */
    for (Py_ssize_t i = 0; i < nresults; i++) {
        if (!spec[i].memref)
            continue;
        uintptr_t allocated = (uintptr_t)*(int64_t *)((char *)returned + spec[i].offset);
        int kind = state != NULL ? mg_rt_memory(state, (void *)allocated) : MG_RT_NOT_OURS;
        if (kind == MG_RT_FREED) {
            if (!skip)
                PyErr_Format(PyExc_ValueError, "result %zd of %s is GPU memory the program freed", i, name);
            skip = 1;
            memory[i].owner = OWNER_GLOBAL; /* never freed */
        } else if (allocated == MG_GLOBAL_MARKER)
            memory[i].owner = OWNER_GLOBAL;
        else if (kind != MG_RT_NOT_OURS)
            memory[i] = (result_memory){OWNER_RUNTIME, kind == MG_RT_DEVICE};
        else
            memory[i].owner = OWNER_FUNCTION;
        for (Py_ssize_t j = 0; j < nargs && memory[i].owner == OWNER_FUNCTION; j++)
            if (!PyBytes_Check(PySequence_Fast_GET_ITEM(argseq, j)) && lent[j].allocated == allocated)
                memory[i] = (result_memory){OWNER_ARGUMENT, lent[j].device};
        if (memory[i].owner == OWNER_FUNCTION && allocated != 0 && on_stack(allocated)) {
            if (!skip)
                PyErr_Format(PyExc_ValueError, "result %zd of %s is stack memory (memref.alloca), gone once the "
                             "function returned", i, name);
            skip = 1;
            memory[i].owner = OWNER_GLOBAL; /* never freed */
        }
    }
    tuple = skip ? NULL : PyTuple_New(nresults);
    for (Py_ssize_t i = 0; tuple != NULL && i < nresults; i++) {
        char *data = (char *)returned + spec[i].offset;
        PyObject *descr = mg_dtype_numpy(spec[i].dtype);
        PyObject *value = NULL;
        if (descr != NULL && spec[i].memref)
            value = copy_memref((int64_t *)data, spec[i].rank, (PyArray_Descr *)descr, memory[i].device, i);
        else if (descr != NULL) {
            value = PyArray_Scalar(data, (PyArray_Descr *)descr, NULL);
            Py_DECREF(descr);
        }
        if (value == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, value);
    }
    /* Free what the function allocated, once per allocation, error or not. */
    for (Py_ssize_t i = 0; i < nresults; i++) {
        if (!spec[i].memref || memory[i].owner != OWNER_FUNCTION)
            continue;
        void *allocated = (void *)(intptr_t)*(int64_t *)((char *)returned + spec[i].offset);
        int seen = 0;
        for (Py_ssize_t j = 0; j < i && !seen; j++)
            seen = spec[j].memref && memory[j].owner == OWNER_FUNCTION &&
                   *(int64_t *)((char *)returned + spec[j].offset) == (int64_t)(intptr_t)allocated;
        if (!seen)
            free(allocated);
    }
    if (state != NULL) {
        /* Its error wins: it explains garbage results. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (mg_rt_end(state, timeline != Py_None ? timeline : NULL) < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            Py_CLEAR(tuple);
        } else {
            PyErr_Restore(type, value, traceback);
        }
    }
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
