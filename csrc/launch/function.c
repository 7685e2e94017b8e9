/* Modules and kernels: mlirgpu.cuda.Module (CudaModule) loads PTX or a
 * cubin, mlirgpu.cuda.Function is one of its kernels, and calling it packs
 * the arguments (arrays of every kind, scalars, tensor maps) and launches. */
#include "launch/function.h"
#include "launch/tensor_map.h"
#include "arrays/array.h"
#include "cuda/graph.h"
#include "cuda/stream.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "base/numpy_api.h"
#include "launch/launch_shared.h"

static PyObject *str_grid, *str_block, *str_shared_mem, *str_stream, *str_cluster;

/* ---------------------------------------------------------------------- */
/* Module                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    CUmodule handle;
    int device;
    PyObject *info_log;   /* str from the PTX JIT, or None */
    /* Recorded after each launch of a kernel that uses the module's grid
     * barrier counter (mg.grid.sync()): the next such launch waits for it,
     * as they share the counter. Made on the first. */
    CUevent after_cooperative;
    /* Whether the image may define the grid barrier's counter: only then is
     * it looked up (a failed cuModuleGetGlobal is an error to
     * compute-sanitizer and to API tracers, so modules without it skip it). */
    int may_have_grid_barrier;
} mg_module;

/* Whether `data` names the grid barrier's counter: PTX and cubins hold the
 * symbol's name as text; a fatbin's images may be compressed, so it may. */
static int may_have_grid_barrier(const char *data, Py_ssize_t size)
{
    if (size >= 4 && memcmp(data, "\x50\xed\x55\xba", 4) == 0)
        return 1;
    const size_t length = sizeof MG_CU_GRID_BARRIER - 1;
    for (const char *at = data; (at = memchr(at, '_', (size_t)(data + size - at))) != NULL; at++)
        if ((size_t)(data + size - at) >= length && memcmp(at, MG_CU_GRID_BARRIER, length) == 0)
            return 1;
    return 0;
}

PyTypeObject *mg_cu_Module_type;

/* JIT log buffers; the driver truncates longer logs. */
#define JIT_LOG_BYTES 16384

PyObject *mg_cu_module_load(PyObject *image)
{
    const char *data;
    Py_ssize_t size;
    int is_binary = 0;
    if (PyUnicode_Check(image)) {
        data = PyUnicode_AsUTF8AndSize(image, &size);
        if (data == NULL)
            return NULL;
    }
    else if (PyBytes_Check(image)) {
        data = PyBytes_AS_STRING(image);
        size = PyBytes_GET_SIZE(image);
        /* ELF (cubin) or the fatbin header magic 0xBA55ED50: no JIT needed. */
        is_binary = size >= 4 && (memcmp(data, "\x7f" "ELF", 4) == 0 || memcmp(data, "\x50\xed\x55\xba", 4) == 0);
    }
    else {
        return PyErr_Format(PyExc_TypeError, "a module image is PTX (str or bytes) or a cubin (bytes), not %.100s",
                            Py_TYPE(image)->tp_name);
    }
    if (size == 0)
        return mg_raise(PyExc_ValueError, "the module image is empty");
    if (mg_cu_ensure_context() < 0)
        return NULL;

    char *logs = PyMem_Malloc(2 * JIT_LOG_BYTES);
    if (logs == NULL)
        return PyErr_NoMemory();
    char *info_log = logs, *error_log = logs + JIT_LOG_BYTES;
    info_log[0] = error_log[0] = '\0';
    CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[] = {info_log, (void *)(uintptr_t)JIT_LOG_BYTES, error_log, (void *)(uintptr_t)JIT_LOG_BYTES};
    CUmodule handle = NULL;
    CUresult r;
    mg_module *self = NULL;
    /* PTX JIT takes milliseconds; `image` is immutable and held by the caller. */
    Py_BEGIN_ALLOW_THREADS
    if (is_binary)
        r = mg_cu.cuModuleLoadData(&handle, data);
    else
        r = mg_cu.cuModuleLoadDataEx(&handle, data, 4, options, values);
    Py_END_ALLOW_THREADS
    info_log[JIT_LOG_BYTES - 1] = error_log[JIT_LOG_BYTES - 1] = '\0';
    if (r != CUDA_SUCCESS) {
        mg_cu_raise(r, is_binary ? "cuModuleLoadData" : "cuModuleLoadDataEx (PTX JIT)",
                    error_log[0] ? error_log : NULL);
        goto error;
    }
    self = (mg_module *)mg_cu_Module_type->tp_alloc(mg_cu_Module_type, 0);
    if (self == NULL) {
        mg_cu.cuModuleUnload(handle);
        goto error;
    }
    self->handle = handle;
    self->device = mg_cu_tls_device;
    self->may_have_grid_barrier = may_have_grid_barrier(data, size);
    self->info_log = info_log[0] ? PyUnicode_DecodeUTF8(info_log, strlen(info_log), "replace")
                                 : Py_NewRef(Py_None);
    if (self->info_log == NULL)
        Py_CLEAR(self);
error:
    PyMem_Free(logs);
    return (PyObject *)self;
}

static void module_dealloc(mg_module *self)
{
    PyTypeObject *type = Py_TYPE(self);
    int pushed = mg_cu_push_quietly(self->device);
    if (pushed >= 0) {
        /* Destroying a pending event is fine: the driver frees it once it fires. */
        if (self->after_cooperative != NULL)
            mg_cu.cuEventDestroy(self->after_cooperative);
        mg_cu.cuModuleUnload(self->handle);
        mg_cu_pop(pushed);
    }
    Py_XDECREF(self->info_log);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *module_load(PyObject *cls, PyObject *image)
{
    return mg_cu_module_load(image);
}

static PyObject *module_get_function(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"name", "params", "stores", NULL};
    const char *name;
    PyObject *params = Py_None, *stores = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|OO:get_function", keywords, &name, &params, &stores))
        return NULL;
    return mg_cu_function_new(self, name, params, stores);
}

static PyMethodDef module_methods[] = {
    {"load", (PyCFunction)module_load, METH_O | METH_CLASS,
     "Module.load(image): PTX (str, or bytes) through the JIT, or a cubin (ELF bytes)."},
    {"get_function", (PyCFunction)(void (*)(void))module_get_function, METH_VARARGS | METH_KEYWORDS,
     "get_function(name, params=None, stores=None): the kernel `name`; `params` lists \"ptr\" or a dtype per "
     "parameter; `stores` the indices of the pointer parameters the kernel may store to (None: any). A read-only "
     "array passed for one of those is a LaunchError."},
    {NULL},
};

static PyMemberDef module_members[] = {
    {"info_log", T_OBJECT, offsetof(mg_module, info_log), READONLY, "The PTX JIT's info log, or None."},
    {"device", T_INT, offsetof(mg_module, device), READONLY, NULL},
    {NULL},
};

static PyType_Slot module_slots[] = {
    {Py_tp_doc, "A loaded CUDA module (Module.load or load_module); unloaded when its last user dies."},
    {Py_tp_dealloc, module_dealloc},
    {Py_tp_methods, module_methods},
    {Py_tp_members, module_members},
    {0, NULL},
};

static PyType_Spec module_spec = {
    .name = "mlirgpu.cuda.Module",
    .basicsize = sizeof(mg_module),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = module_slots,
};

/* ---------------------------------------------------------------------- */
/* Function and the launch                                                 */
/* ---------------------------------------------------------------------- */



PyTypeObject *mg_cu_Function_type;

static PyObject *function_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);

PyObject *mg_cu_function_new(PyObject *module, const char *name, PyObject *params, PyObject *stores)
{
    if (!PyObject_TypeCheck(module, mg_cu_Module_type))
        return PyErr_Format(PyExc_TypeError, "expected an mlirgpu.Module, not %.100s", Py_TYPE(module)->tp_name);
    mg_function *self = (mg_function *)mg_cu_Function_type->tp_alloc(mg_cu_Function_type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = function_vectorcall;
    self->module = Py_NewRef(module);
    self->name = PyUnicode_FromString(name);
    if (self->name == NULL || mg_launch_parse_signature(self, params ? params : Py_None) < 0 || mg_launch_parse_stores(self, stores) < 0)
        goto error;
    int pushed;
    if (mg_cu_push(((mg_module *)module)->device, &pushed) < 0)
        goto error;
    CUresult r = mg_cu.cuModuleGetFunction(&self->handle, ((mg_module *)module)->handle, name);
    if (r == CUDA_SUCCESS && ((mg_module *)module)->may_have_grid_barrier) {
        /* The grid barrier's counter: the kernel calls mg.grid.sync(). */
        CUdeviceptr counter;
        size_t bytes;
        self->cooperative = mg_cu.cuModuleGetGlobal(&counter, &bytes, ((mg_module *)module)->handle,
                                                    MG_CU_GRID_BARRIER) == CUDA_SUCCESS;
    }
    mg_cu_pop(pushed);
    if (r != CUDA_SUCCESS) {
        char detail[300];
        PyOS_snprintf(detail, sizeof detail, "no kernel named '%.200s' in the module", name);
        mg_cu_raise(r, "cuModuleGetFunction", detail);
        goto error;
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

int mg_cu_function_nparams(PyObject *function)
{
    return ((mg_function *)function)->nparams;
}

static void function_dealloc(mg_function *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_XDECREF(self->name);
    Py_XDECREF(self->params);
    Py_XDECREF(self->module);   /* may unload the CUmodule */
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *function_get_attribute(mg_function *self, void *closure)
{
    int pushed, value = 0;
    if (mg_cu_push(((mg_module *)self->module)->device, &pushed) < 0)
        return NULL;
    CUresult r = mg_cu.cuFuncGetAttribute(&value, (CUfunction_attribute)(intptr_t)closure, self->handle);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuFuncGetAttribute") < 0)
        return NULL;
    return PyLong_FromLong(value);
}

static PyObject *function_set_max_dynamic_shared_memory(mg_function *self, PyObject *arg)
{
    long nbytes = PyLong_AsLong(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (nbytes < 0 || nbytes > INT32_MAX)
        return PyErr_Format(PyExc_ValueError, "nbytes must be between 0 and 2**31-1, got %ld", nbytes);
    int pushed;
    if (mg_cu_push(((mg_module *)self->module)->device, &pushed) < 0)
        return NULL;
    CUresult r = mg_cu.cuFuncSetAttribute(self->handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)nbytes);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int launch_error(mg_function *self, const char *fmt, ...)
{
    va_list vargs;
    va_start(vargs, fmt);
    PyObject *detail = PyUnicode_FromFormatV(fmt, vargs);
    va_end(vargs);
    if (detail == NULL)
        return -1;
    if (self != NULL)
        mg_raise(mg_st->LaunchError, "launch of kernel '%U': %U", self->name, detail);
    else   /* keywords read before the kernel is known (mg_cu_launch_config_parse) */
        mg_raise(mg_st->LaunchError, "launch: %U", detail);
    Py_DECREF(detail);
    return -1;
}

/* How many blocks of `threads` threads with `shared` bytes of dynamic shared
 * memory can be resident at once on the function's device (the most a
 * cooperative launch may have): the occupancy per multiprocessor times the
 * multiprocessors. The function's context must be current. */
static int cooperative_blocks(mg_function *self, int threads, unsigned long long shared, int *out)
{
    if (self->fit_threads == threads && self->fit_shared == shared) {
        *out = self->fit_blocks;
        return 0;
    }
    CUdevice device;
    int per_multiprocessor, multiprocessors;
    if (mg_cu_check(mg_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, self->handle, threads,
                                                                      (size_t)shared),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor") < 0 ||
        mg_cu_check(mg_cu.cuDeviceGet(&device, ((mg_module *)self->module)->device), "cuDeviceGet") < 0 ||
        mg_cu_check(mg_cu.cuDeviceGetAttribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
                    "cuDeviceGetAttribute") < 0)
        return -1;
    self->fit_threads = threads;
    self->fit_shared = shared;
    *out = self->fit_blocks = per_multiprocessor * multiprocessors;
    return 0;
}

/* Before a cooperative launch: a grid that cannot be resident at once is a
 * LaunchError (it would never get past mg.grid.sync()). Context current. */
static int check_cooperative_grid(mg_function *self, const unsigned grid[3], const unsigned block[3],
                                  unsigned long long shared)
{
    int fit;
    if (cooperative_blocks(self, (int)(block[0] * block[1] * block[2]), shared, &fit) < 0)
        return -1;
    unsigned long long blocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    if (blocks <= (unsigned long long)fit)
        return 0;
    return launch_error(self, "it calls mg.grid.sync(), so every block of its grid must be resident on the GPU "
                        "at once, and this device holds at most %d blocks of (%u, %u, %u) threads with %llu bytes "
                        "of dynamic shared memory; the grid (%u, %u, %u) has %llu (max_cooperative_grid_blocks "
                        "gives the limit)", fit, block[0], block[1], block[2], shared, grid[0], grid[1], grid[2],
                        blocks);
}

static int stored_readonly(mg_function *self, Py_ssize_t index)
{
    return launch_error(self, "argument %zd is a read-only array, and the kernel may store to it%s", index,
                        self->stores == ~(uint64_t)0 ? " (get_function's stores= names the parameters it "
                                                       "stores to)" : "");
}

/* A grid or block extent: a positive int that fits in 32 bits. *ran_python
 * is set where its __index__ (user code) ran. */
static int parse_extent(mg_function *self, PyObject *value, const char *what, int axis, unsigned int *out,
                        int *ran_python)
{
    if (!PyIndex_Check(value) || PyBool_Check(value))
        return launch_error(self, "%s must be an int or a tuple of 1 to 3 ints, got %.100s in it",
                            what, Py_TYPE(value)->tp_name);
    int overflow = 0;
    long long n = PyLong_Check(value) ? PyLong_AsLongLongAndOverflow(value, &overflow) : -1;
    if (!PyLong_Check(value)) {
        *ran_python = 1;
        PyObject *index = PyNumber_Index(value);
        if (index == NULL)
            return -1;
        n = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
    }
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (overflow || n <= 0 || n > (long long)UINT32_MAX)
        return launch_error(self, "%s[%d] = %R must be a positive int below 2**32", what, axis, value);
    *out = (unsigned int)n;
    return 0;
}

static int parse_dims(mg_function *self, PyObject *value, const char *what, unsigned int out[3], int *ran_python)
{
    if (PyTuple_Check(value) || PyList_Check(value)) {
        /* A tuple of our own: an item's __index__ may change a list while it is read. */
        PyObject *items = PySequence_Tuple(value);
        if (items == NULL)
            return -1;
        Py_ssize_t n = PyTuple_GET_SIZE(items);
        int status = 0;
        if (n < 1 || n > 3)
            status = launch_error(self, "%s must have 1 to 3 extents, got %zd", what, n);
        for (Py_ssize_t i = 0; i < n && status == 0; i++)
            status = parse_extent(self, PyTuple_GET_ITEM(items, i), what, (int)i, &out[i], ran_python);
        Py_DECREF(items);
        return status;
    }
    return parse_extent(self, value, what, 0, &out[0], ran_python);
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (magnitude >= 0x47800000u)
        return (uint16_t)(sign | 0x7c00u);          /* too large: infinity */
    if (magnitude < 0x38800000u) {                  /* a half subnormal, or zero */
        float a;
        memcpy(&a, &magnitude, sizeof a);
        float scaled = a * 16777216.0f;             /* exact: a power-of-two scale */
        uint32_t m = (uint32_t)scaled;
        float fraction = scaled - (float)m;
        if (fraction > 0.5f || (fraction == 0.5f && (m & 1u)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t h = (magnitude - 0x38000000u) >> 13;  /* rebias 127 -> 15, keep 10 bits */
    uint32_t rest = magnitude & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;                                        /* may carry into infinity, correctly */
    return (uint16_t)(sign | h);
}

/* bfloat16 from binary32, rounding to nearest even. */
static uint16_t float_to_bfloat16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);      /* keep NaN a quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Packs a Python or NumPy scalar as parameter `index` of type `dtype`. */
static int pack_scalar(mg_function *self, Py_ssize_t index, mg_dtype *dtype, PyObject *value, uint64_t *slot)
{
    *slot = 0;
    if (dtype->kind == 'i' || dtype->kind == 'u' || dtype->kind == 'b') {
        if (!PyIndex_Check(value) && !PyArray_IsScalar(value, Bool))
            goto wrong_type;
        if (dtype->kind == 'b') {
            int truth = PyObject_IsTrue(value);
            if (truth < 0)
                return -1;
            *(uint8_t *)slot = (uint8_t)truth;
            return 0;
        }
        PyObject *integer = PyNumber_Index(value);
        if (integer == NULL)
            return -1;
        int overflow = 0, out_of_range;
        if (dtype->kind == 'u') {
            unsigned long long u = PyLong_AsUnsignedLongLong(integer);
            out_of_range = u == (unsigned long long)-1 && PyErr_Occurred();
            if (out_of_range)
                PyErr_Clear();
            else if (dtype->bits < 64)
                out_of_range = u >> dtype->bits != 0;
            *slot = u;   /* little-endian: the low bytes come first */
        }
        else {
            long long s = PyLong_AsLongLongAndOverflow(integer, &overflow);
            out_of_range = overflow != 0;
            if (!out_of_range && dtype->bits < 64) {
                long long limit = 1LL << (dtype->bits - 1);
                out_of_range = s < -limit || s >= limit;
            }
            memcpy(slot, &s, sizeof s);
        }
        Py_DECREF(integer);
        if (out_of_range)
            return launch_error(self, "argument %zd = %R does not fit in %s", index, value, dtype->name);
        return 0;
    }
    if (dtype->id == MG_DT_F8E4M3 || dtype->id == MG_DT_F8E5M2)
        return launch_error(self, "argument %zd: an 8-bit float scalar cannot be passed: pass it as f32", index);
    /* f16, bf16, f32, f64 */
    if (!PyFloat_Check(value) && !PyLong_Check(value) && !PyArray_IsScalar(value, Number))
        goto wrong_type;
    double d = PyFloat_AsDouble(value);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        goto wrong_type;
    }
    switch (dtype->id) {
    case MG_DT_F64: memcpy(slot, &d, sizeof d); break;
    case MG_DT_F32: { float f = (float)d; memcpy(slot, &f, sizeof f); break; }
    case MG_DT_F16: { uint16_t h = float_to_half((float)d); memcpy(slot, &h, sizeof h); break; }
    case MG_DT_BF16: { uint16_t h = float_to_bfloat16((float)d); memcpy(slot, &h, sizeof h); break; }
    default: break;   /* no other float reaches here */
    }
    return 0;
wrong_type:
    return launch_error(self, "argument %zd is a %s scalar, got %.100s", index, dtype->name, Py_TYPE(value)->tp_name);
}

/* A NumPy scalar without a signature: its own dtype says how wide it is. */
static int pack_numpy_scalar(mg_function *self, Py_ssize_t index, PyObject *value, uint64_t *slot)
{
    PyArray_Descr *descr = PyArray_DescrFromScalar(value);
    if (descr == NULL)
        return -1;
    Py_ssize_t itemsize = PyDataType_ELSIZE(descr);
    const char *type_name = descr->typeobj->tp_name;
    size_t length = strlen(type_name);
    int packable = (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8) &&
                   (strchr("biuf", descr->kind) != NULL ||
                    (itemsize == 2 && length >= 8 && strcmp(type_name + length - 8, "bfloat16") == 0));
    *slot = 0;
    if (packable)
        PyArray_ScalarAsCtype(value, slot);
    Py_DECREF(descr);
    if (!packable)
        return launch_error(self, "argument %zd: cannot pass a %.100s scalar to a kernel", index, type_name);
    return 0;
}

/* Any other argument: a torch, CuPy or JAX array read through its
 * attributes, a NumPy scalar, or an object exposing __cuda_array_interface__
 * or __dlpack__ (a view, which *view receives and the caller keeps alive
 * until the launch returned). A producer stream the launch must wait for is
 * added to `waits`. 1 for an array, 0 for a scalar, -1 with an error set. */
static int pack_other(mg_function *self, Py_ssize_t index, int kind, PyObject *value, uint64_t *slot,
                      PyObject **view, CUstream *waits, int *nwaits, int *ndim, Py_ssize_t *shape,
                      mg_foreign_memo *memo)
{
    mg_foreign info;
    /* The shape too where the kernel takes extents of this array. */
    int full = self->nparams >= 0 && self->extents[index];
    /* A torch, CuPy or JAX array is read at once, skipping the scalar checks. */
    int found = mg_array_library_read(value, &info, full, memo);
    if (found == MG_NOT_LIBRARY) {
        int numpy_scalar = PyArray_IsScalar(value, Generic);
        if (kind == KIND_PTR && (numpy_scalar || PyLong_Check(value) || PyFloat_Check(value)))
            return launch_error(self, "argument %zd is a pointer: expected a device array, got %.100s",
                                index, Py_TYPE(value)->tp_name);
        if (numpy_scalar)
            return pack_numpy_scalar(self, index, value, slot);
        found = full ? mg_array_foreign_info(value, &info, memo) : mg_array_foreign_pointer(value, &info, memo);
    }
    if (found < 0)
        return -1;
    if (found == 0) {
        if (PyLong_Check(value) || PyFloat_Check(value))
            return launch_error(self,
                "argument %zd is a Python %.20s: a scalar argument needs a signature "
                "(get_function(name, params=[...])) or a NumPy scalar such as numpy.float32(x)",
                index, Py_TYPE(value)->tp_name);
        return launch_error(self, "argument %zd: cannot pass %.100s (not a device array, "
                            "__cuda_array_interface__ or __dlpack__ object, or NumPy scalar)",
                            index, Py_TYPE(value)->tp_name);
    }
    if (info.host) {
        mg_foreign_release(&info);
        return launch_error(self, "argument %zd is a host array: use mlirgpu.to_device", index);
    }
    if (info.readonly && self->stores >> index & 1) {
        mg_foreign_release(&info);
        return stored_readonly(self, index);
    }
    *slot = (uint64_t)info.ptr;
    *ndim = info.ndim;
    memcpy(shape, info.shape, sizeof info.shape);
    *view = info.view;   /* the reference moves to the caller */
    if (info.wait)
        waits[(*nwaits)++] = info.producer;
    return 1;
}

_Static_assert(sizeof(mg_cu_extents) == MG_MAX_NDIM * sizeof(Py_ssize_t), "mg_cu_extents holds MG_MAX_NDIM extents");

/* Appends the extents (bit d: dimension d) of argument i, an array of `ndim`
 * dimensions: the dynamic sizes the kernel reads, as i64 (index) parameters. */
static int push_extents(mg_function *self, Py_ssize_t i, unsigned extents, int ndim, const Py_ssize_t *shape,
                        uint64_t *slots, void **params, int *nslots)
{
    for (int d = 0; d < MG_MAX_NDIM; d++) {
        if (!(extents >> d & 1))
            continue;
        if (d >= ndim)
            return launch_error(self, "argument %zd: the kernel takes the extent of dimension %d, but the array "
                                "has %d dimensions", i, d, ndim);
        slots[*nslots] = (uint64_t)shape[d];
        params[*nslots] = &slots[*nslots];
        (*nslots)++;
    }
    return 0;
}

/* Makes `stream` wait for each producer once (several arrays of one producer are common). */
static int order_after_producers(CUstream stream, const CUstream *waits, int nwaits)
{
    for (int i = 0; i < nwaits; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = waits[j] == waits[i];
        if (!seen && mg_cu_stream_order(waits[i], stream) < 0)
            return -1;
    }
    return 0;
}

/* A captured launch's kernel and arrays must outlive the graph's replays. */
static int retain_for_graph(PyObject *function, PyObject *const *args, Py_ssize_t nargs, uint64_t arrays)
{
    if (mg_graph_retain(function) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (arrays >> i & 1 && mg_graph_retain(args[i]) < 0)
            return -1;
    return 0;
}

enum { KW_GRID, KW_BLOCK, KW_SHARED_MEM, KW_CLUSTER, KW_STREAM, KW_OTHER };

/* Which launch keyword `key` is. Keywords from call sites are interned:
 * identity settles it, before any string is compared. */
static int launch_keyword(PyObject *key)
{
    PyObject *const names[] = {str_grid, str_block, str_shared_mem, str_cluster, str_stream};
    for (int i = 0; i < KW_OTHER; i++)
        if (key == names[i])
            return i;
    for (int i = 0; i < KW_OTHER; i++)
        if (PyUnicode_Compare(key, names[i]) == 0)
            return i;
    return KW_OTHER;
}

int mg_cu_is_launch_keyword(PyObject *key)
{
    return launch_keyword(key) != KW_OTHER;
}

PyObject *mg_cu_function_launch(PyObject *function, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return mg_cu_function_launch_known(function, args, nargs, kwnames, NULL, NULL);
}

/* The packed arguments: per argument its slot, and after an array's the
 * extents the kernel takes of it. */
typedef struct {
    void *params[MG_CU_MAX_ARGS * (1 + MG_MAX_NDIM)];
    uint64_t slots[MG_CU_MAX_ARGS * (1 + MG_MAX_NDIM)];   /* every parameter fits in 8 bytes */
    int nslots;
    PyObject *views[MG_CU_MAX_ARGS];          /* strong: DLPack views, released after the launch */
    int nviews;
    CUstream waits[MG_CU_MAX_ARGS];           /* producers of foreign arrays, for the launch's stream */
    int nwaits;
    uint64_t arrays;                          /* bit i: argument i is an array */
} launch_packing;

/* grid=, block=, shared_mem=, cluster= and stream= into `c` (`self` names
 * the kernel in errors; NULL before it is known): 0, or -1 with the error set. */
static int parse_launch_keywords(mg_function *self, PyObject *const *values, PyObject *kwnames, mg_cu_launch_config *c)
{
    *c = (mg_cu_launch_config){.grid = {1, 1, 1}, .block = {1, 1, 1}, .cluster = {1, 1, 1}};
    int have_grid = 0, have_block = 0;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = values[i];
        int keyword = launch_keyword(key);
        if (keyword == KW_GRID) {
            if (parse_dims(self, value, "grid", c->grid, &c->ran_python) < 0)
                return -1;
            have_grid = 1;
        }
        else if (keyword == KW_BLOCK) {
            if (parse_dims(self, value, "block", c->block, &c->ran_python) < 0)
                return -1;
            have_block = 1;
        }
        else if (keyword == KW_SHARED_MEM) {
            int overflow = 0;
            long long n = PyLong_Check(value) ? PyLong_AsLongLongAndOverflow(value, &overflow) : -1;
            if (!PyLong_Check(value) || overflow || n < 0 || n > (long long)UINT32_MAX)
                return launch_error(self, "shared_mem must be an int of bytes in [0, 2**32), got %R", value);
            c->shared_mem = (unsigned long long)n;
        }
        else if (keyword == KW_CLUSTER) {
            if (value != Py_None) {
                if (parse_dims(self, value, "cluster", c->cluster, &c->ran_python) < 0)
                    return -1;
                c->have_cluster = 1;
            }
        }
        else if (keyword == KW_STREAM) {
            c->ran_python |= value != Py_None && !PyObject_TypeCheck(value, mg_cu_Stream_type) && !PyLong_Check(value);
            if (!mg_cu_stream_converter(value, &c->stream))
                return -1;
            c->stream_obj = value == Py_None ? NULL : value;
        }
        else {
            PyErr_Format(PyExc_TypeError, "%R is an invalid keyword argument for a launch of kernel '%S'",
                         key, self != NULL ? self->name : Py_None);
            return -1;
        }
    }
    if (!have_grid || !have_block)
        return launch_error(self, "grid= and block= are required");
    for (int axis = 0; axis < 3 && c->have_cluster; axis++)
        if (c->grid[axis] % c->cluster[axis] != 0)
            return launch_error(self, "the grid (%u, %u, %u) is not a whole number of clusters (%u, %u, %u)",
                                c->grid[0], c->grid[1], c->grid[2], c->cluster[0], c->cluster[1], c->cluster[2]);
    return 0;
}

int mg_cu_launch_config_parse(PyObject *const *values, PyObject *kwnames, mg_cu_launch_config *config)
{
    return parse_launch_keywords(NULL, values, kwnames, config);
}

/* The number of arguments and the stream's device against the kernel's: 0, or -1 with LaunchError. */
static int check_launch_arguments(mg_function *self, Py_ssize_t nargs, const mg_cu_launch_config *c, int device)
{
    if (nargs > MG_CU_MAX_ARGS)
        return launch_error(self, "at most %d arguments can be passed, got %zd", MG_CU_MAX_ARGS, nargs);
    if (self->nparams >= 0 && nargs != self->nparams)
        return launch_error(self, "the signature has %d parameters, %zd arguments given", self->nparams, nargs);
    if (c->stream_obj != NULL && mg_cu_stream_device(c->stream_obj) != device &&
        PyObject_TypeCheck(c->stream_obj, mg_cu_Stream_type))
        return launch_error(self, "the stream belongs to device %d, the kernel is loaded on device %d",
                            mg_cu_stream_device(c->stream_obj), device);
    return 0;
}

/* Packs argument i, a TensorMap for a tensor-map parameter (or for any
 * parameter of a kernel without a signature): 1 when packed, 0 when `arg`
 * is not for a tensor map, -1 with LaunchError. */
static int pack_tensor_map(mg_function *self, Py_ssize_t i, int kind, PyObject *arg, launch_packing *p)
{
    int is_map = Py_IS_TYPE(arg, mg_cu_TensorMap_type);   /* TensorMap has no subclasses */
    if (kind == KIND_TENSOR_MAP || (kind == KIND_ANY && is_map)) {
        if (!is_map)
            return launch_error(self, "argument %zd is a tensor map: expected an mlirgpu.TensorMap, got %.100s",
                                i, Py_TYPE(arg)->tp_name);
        if (((mg_tensor_map *)arg)->host)
            return launch_error(self, "argument %zd is a tensor map made for the CPU backend: make it with "
                                "mg.tensor_map of a device array while the backend is 'cuda'", i);
        /* The driver copies the 128 bytes before cuLaunchKernel returns; a
         * captured graph keeps the map (and so its array) alive. */
        p->params[p->nslots - 1] = ((mg_tensor_map *)arg)->map;
        p->arrays |= (uint64_t)1 << i;
        return 1;
    }
    if (is_map)
        return launch_error(self, "argument %zd is not a tensor map parameter, got an mlirgpu.TensorMap", i);
    return 0;
}

/* Packs argument i, a DeviceArray in device memory: 0, or -1 with LaunchError. */
static int pack_device_array(mg_function *self, Py_ssize_t i, int kind, unsigned extents, PyObject *arg, int device,
                             launch_packing *p, uint64_t *slot)
{
    const mg_array *a = (const mg_array *)arg;
    if (kind >= 0)
        return launch_error(self, "argument %zd is a %s scalar, got a DeviceArray", i, mg_dtype_get(kind)->name);
    if (a->readonly && self->stores >> i & 1)
        return stored_readonly(self, i);
    if (a->device != device)
        return launch_error(self, "argument %zd is an array on device %d, the kernel is loaded on device %d",
                            i, a->device, device);
    *slot = (uint64_t)mg_array_ptr(arg);
    p->arrays |= (uint64_t)1 << i;
    if (extents && push_extents(self, i, extents, a->ndim, a->shape, p->slots, p->params, &p->nslots) < 0)
        return -1;
    return 0;
}

/* Packs every argument into `p`: arrays the caller read (`read`, or NULL)
 * from that record, the others as they come. 0, or -1 with the error set
 * (views already made stay in `p` for the caller to release). */
static int pack_arguments(mg_function *self, PyObject *const *args, Py_ssize_t nargs, const mg_cu_read_args *read,
                          int device, launch_packing *p, mg_foreign_memo *memo)
{
    uint64_t known = read != NULL ? read->known : 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = args[i];
        int kind = self->nparams >= 0 ? self->kinds[i] : KIND_ANY;
        unsigned extents = self->nparams >= 0 ? self->extents[i] : 0;
        uint64_t *slot = &p->slots[p->nslots];
        p->params[p->nslots] = slot;
        p->nslots++;
        int map = pack_tensor_map(self, i, kind, arg, p);
        if (map != 0) {
            if (map < 0)
                return -1;
            continue;
        }
        if (known >> i & 1) {
            if (kind >= 0)
                return launch_error(self, "argument %zd is a %s scalar, got an array", i, mg_dtype_get(kind)->name);
            if (read->readonly >> i & self->stores >> i & 1)
                return stored_readonly(self, i);
            *slot = (uint64_t)read->pointers[i];
            /* The caller read the shape, and its signature checked the rank. */
            if (extents && push_extents(self, i, extents, MG_MAX_NDIM, read->shapes[i], p->slots, p->params,
                                        &p->nslots) < 0)
                return -1;
            continue;
        }
        if (mg_array_check_device(arg)) {
            if (pack_device_array(self, i, kind, extents, arg, device, p, slot) < 0)
                return -1;
            continue;
        }
        if (kind >= 0) {
            if (pack_scalar(self, i, mg_dtype_get(kind), arg, slot) < 0)
                return -1;
            continue;
        }
        PyObject *view = NULL;
        int ndim = 0;
        Py_ssize_t shape[MG_MAX_NDIM];
        int packed = pack_other(self, i, kind, arg, slot, &view, p->waits, &p->nwaits, &ndim, shape, memo);
        if (packed < 0)
            return -1;
        if (packed == 0)
            continue;
        if (view != NULL)
            p->views[p->nviews++] = view;
        p->arrays |= (uint64_t)1 << i;
        if (extents && push_extents(self, i, extents, ndim, shape, p->slots, p->params, &p->nslots) < 0)
            return -1;
    }
    return 0;
}

/* Before a cooperative launch: checks its grid fits at once and, where
 * `serialize`, makes `stream` wait for the module's previous cooperative
 * launch (they share its grid barrier's counter). 0, or -1 with the error set. */
static int prepare_cooperative(mg_function *self, mg_module *module, const mg_cu_launch_config *c, int serialize)
{
    if (check_cooperative_grid(self, c->grid, c->block, c->shared_mem) < 0)
        return -1;
    if (serialize && module->after_cooperative == NULL &&
        mg_cu_check(mg_cu.cuEventCreate(&module->after_cooperative, CU_EVENT_DISABLE_TIMING), "cuEventCreate") < 0)
        return -1;
    if (serialize && mg_cu_check(mg_cu.cuStreamWaitEvent(c->stream, module->after_cooperative, 0),
                                 "cuStreamWaitEvent") < 0)
        return -1;
    return 0;
}

/* The driver call itself; clusters and cooperative launches need the
 * extended launch and its attributes. */
static inline CUresult launch_kernel(mg_function *self, const mg_cu_launch_config *c, void **params)
{
    if (!c->have_cluster && !self->cooperative)
        return mg_cu.cuLaunchKernel(self->handle, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1],
                                    c->block[2], (unsigned int)c->shared_mem, c->stream, params, NULL);
    CUlaunchAttribute attributes[2];
    unsigned int nattributes = 0;
    memset(attributes, 0, sizeof attributes);
    if (c->have_cluster) {
        attributes[nattributes].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attributes[nattributes].value.clusterDim.x = c->cluster[0];
        attributes[nattributes].value.clusterDim.y = c->cluster[1];
        attributes[nattributes].value.clusterDim.z = c->cluster[2];
        nattributes++;
    }
    if (self->cooperative) {
        attributes[nattributes].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attributes[nattributes].value.cooperative = 1;
        nattributes++;
    }
    CUlaunchConfig config = {
        .gridDimX = c->grid[0], .gridDimY = c->grid[1], .gridDimZ = c->grid[2],
        .blockDimX = c->block[0], .blockDimY = c->block[1], .blockDimZ = c->block[2],
        .sharedMemBytes = (unsigned int)c->shared_mem, .hStream = c->stream, .attrs = attributes,
        .numAttrs = nattributes,
    };
    return mg_cu.cuLaunchKernelEx(&config, self->handle, params, NULL);
}

/* CudaError for a failed launch, naming the kernel and its configuration. */
static void raise_launch_failure(mg_function *self, CUresult r, const mg_cu_launch_config *c)
{
    char detail[200];
    PyOS_snprintf(detail, sizeof detail, "grid=(%u, %u, %u) block=(%u, %u, %u) shared_mem=%llu",
                  c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1], c->block[2], c->shared_mem);
    char what[160];
    const char *name = PyUnicode_AsUTF8(self->name);
    PyOS_snprintf(what, sizeof what, "%s of '%.100s'",
                  c->have_cluster || self->cooperative ? "cuLaunchKernelEx" : "cuLaunchKernel", name ? name : "?");
    PyErr_Clear();   /* only if the name could not be encoded */
    mg_cu_raise(r, what, detail);
}

/* After a launch: notes it for fault messages, and has the arrays and a
 * capturing graph remember it. 0, or -1 with the error set. */
static int after_launch(mg_function *self, PyObject *const *args, Py_ssize_t nargs, const mg_cu_launch_config *c,
                        uint64_t arrays, CUresult recorded)
{
    const char *kernel = PyUnicode_AsUTF8(self->name);
    if (kernel == NULL)
        PyErr_Clear(); /* a name that cannot be encoded is not worth failing a launch over */
    mg_cu_note_launch(c->stream, kernel != NULL ? kernel : "?");
    if (mg_cu_check(recorded, "cuEventRecord") < 0)
        return -1;
    /* Later host copies and exports order themselves after this launch. */
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (mg_array_check_device(args[i]))
            mg_array_set_stream(args[i], c->stream, c->stream_obj);
    if (mg_graph_capturing() && retain_for_graph((PyObject *)self, args, nargs, arrays) < 0)
        return -1;
    return 0;
}

PyObject *mg_cu_function_launch_known(PyObject *function, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames, const mg_cu_launch_config *config,
                                      const mg_cu_read_args *read)
{
    mg_function *self = (mg_function *)function;
    mg_cu_launch_config c;
    launch_packing p;
    p.nslots = p.nviews = p.nwaits = 0;
    mg_foreign_memo memo = {0};               /* what the array readers learn once per call */
    int device = ((mg_module *)self->module)->device;
    PyObject *result = NULL;

    if (config != NULL)
        c = *config;
    else if (parse_launch_keywords(self, args + nargs, kwnames, &c) < 0)
        goto error;
    if (check_launch_arguments(self, nargs, &c, device) < 0)
        goto error;
    if (config == NULL && c.ran_python)
        /* The caller's pointers were read before that code ran, which may have
         * freed or moved what they point to: read every argument again. */
        read = NULL;
    p.arrays = read != NULL ? read->known : 0;
    if (pack_arguments(self, args, nargs, read, device, &p, &memo) < 0)
        goto error;
    for (int i = 0; read != NULL && i < read->nwaits; i++)
        p.waits[p.nwaits++] = read->waits[i];

    /* The kernel runs in the context its module was loaded into: its device's. */
    int pushed;
    if (mg_cu_push(device, &pushed) < 0)
        goto error;
    if (order_after_producers(c.stream, p.waits, p.nwaits) < 0) {
        mg_cu_pop(pushed);
        goto error;
    }
    /* Cooperative launches of one module share its grid barrier's counter:
     * each waits for the one before (a graph being captured orders its own). */
    mg_module *module = (mg_module *)self->module;
    int serialize = self->cooperative && !mg_cu_stream_capturing(c.stream);
    if (self->cooperative && prepare_cooperative(self, module, &c, serialize) < 0) {
        mg_cu_pop(pushed);
        goto error;
    }
    /* A cooperative launch keeps the GIL from its wait to its record, so that
     * another thread's launch of the kernel cannot slip in between. */
    PyThreadState *released = self->cooperative ? NULL : PyEval_SaveThread();
    CUresult r = launch_kernel(self, &c, p.params);
    if (released != NULL)
        PyEval_RestoreThread(released);
    CUresult recorded = r == CUDA_SUCCESS && serialize ? mg_cu.cuEventRecord(module->after_cooperative, c.stream)
                                                       : CUDA_SUCCESS;
    mg_cu_pop(pushed);
    if (r != CUDA_SUCCESS) {
        raise_launch_failure(self, r, &c);
        goto error;
    }
    if (after_launch(self, args, nargs, &c, p.arrays, recorded) < 0)
        goto error;
    result = Py_NewRef(Py_None);
error:
    for (int i = 0; i < p.nviews; i++)
        Py_DECREF(p.views[i]);
    return result;
}

static PyObject *function_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return mg_cu_function_launch(callable, args, PyVectorcall_NARGS(nargsf), kwnames);
}

static PyObject *function_launch_method(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return mg_cu_function_launch(self, args, nargs, kwnames);
}

/* max_cooperative_grid_blocks(block, shared_mem=0) */
static PyObject *function_max_cooperative_grid_blocks(mg_function *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"block", "shared_mem", NULL};
    PyObject *block_obj;
    unsigned long long shared_mem = 0;
    unsigned int block[3] = {1, 1, 1};
    int ran_python = 0, pushed, fit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|K:max_cooperative_grid_blocks", keywords, &block_obj,
                                     &shared_mem) ||
        parse_dims(self, block_obj, "block", block, &ran_python) < 0)
        return NULL;
    if ((unsigned long long)block[0] * block[1] * block[2] > 1024)
        return PyErr_Format(mg_st->LaunchError, "block (%u, %u, %u) has more than 1024 threads", block[0], block[1],
                            block[2]);
    if (mg_cu_push(((mg_module *)self->module)->device, &pushed) < 0)
        return NULL;
    int status = cooperative_blocks(self, (int)(block[0] * block[1] * block[2]), shared_mem, &fit);
    mg_cu_pop(pushed);
    return status < 0 ? NULL : PyLong_FromLong(fit);
}

static PyObject *function_repr(mg_function *self)
{
    return PyUnicode_FromFormat("<mlirgpu.Function '%U'>", self->name);
}

static PyMethodDef function_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))function_launch_method, METH_FASTCALL | METH_KEYWORDS,
     "launch(*args, grid, block, shared_mem=0, stream=None): same as calling the function."},
    {"set_max_dynamic_shared_memory", (PyCFunction)function_set_max_dynamic_shared_memory, METH_O,
     "Allows launches with up to `nbytes` of dynamic shared memory."},
    {"max_cooperative_grid_blocks", (PyCFunction)(void (*)(void))function_max_cooperative_grid_blocks,
     METH_VARARGS | METH_KEYWORDS,
     "max_cooperative_grid_blocks(block, shared_mem=0): the most blocks of that shape and dynamic shared memory "
     "the device holds at once (occupancy per multiprocessor times multiprocessors): the largest grid a "
     "cooperative launch may have."},
    {NULL},
};

static PyObject *function_get_cooperative(mg_function *self, void *closure)
{
    return PyBool_FromLong(self->cooperative);
}

#define FUNCTION_INT(name, attribute, doc) \
    {name, (getter)function_get_attribute, NULL, doc, (void *)(intptr_t)(attribute)}

static PyGetSetDef function_getset[] = {
    FUNCTION_INT("num_regs", CU_FUNC_ATTRIBUTE_NUM_REGS, "Registers per thread."),
    FUNCTION_INT("shared_size_bytes", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "Static shared memory per block."),
    FUNCTION_INT("local_size_bytes", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "Local memory per thread."),
    FUNCTION_INT("max_threads_per_block", CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                 "Largest block this kernel can launch with."),
    {"cooperative", (getter)function_get_cooperative, NULL,
     "Whether the kernel calls mg.grid.sync(), and so is launched cooperatively (every block resident at once).",
     NULL},
    {NULL},
};

static PyMemberDef function_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(mg_function, vectorcall), READONLY},
    {"name", T_OBJECT, offsetof(mg_function, name), READONLY, NULL},
    {"params", T_OBJECT, offsetof(mg_function, params), READONLY, "The signature, or None."},
    {"module", T_OBJECT, offsetof(mg_function, module), READONLY, NULL},
    {NULL},
};

static PyType_Slot function_slots[] = {
    {Py_tp_doc, "A kernel of a loaded Module. Call it to launch: f(*args, grid=, block=, shared_mem=0, stream=None)."},
    {Py_tp_dealloc, function_dealloc},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_repr, function_repr},
    {Py_tp_methods, function_methods},
    {Py_tp_getset, function_getset},
    {Py_tp_members, function_members},
    {0, NULL},
};

static PyType_Spec function_spec = {
    .name = "mlirgpu.cuda.Function",
    .basicsize = sizeof(mg_function),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = function_slots,
};

int mg_cu_function_device(PyObject *function)
{
    return ((mg_module *)((mg_function *)function)->module)->device;
}


/* ---------------------------------------------------------------------- */
/* Module-level functions                                                  */
/* ---------------------------------------------------------------------- */

static PyObject *cu_load_module(PyObject *module, PyObject *image)
{
    return mg_cu_module_load(image);
}

static PyMethodDef launch_functions[] = {
    {"load_module", cu_load_module, METH_O,
     "load_module(image): a Module from PTX (str, or bytes) or a cubin (ELF bytes)."},
    {NULL},
};

static int intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

int mg_launch_init(PyObject *module)
{
    if (intern(&str_grid, "grid") < 0 || intern(&str_block, "block") < 0 ||
        intern(&str_shared_mem, "shared_mem") < 0 || intern(&str_stream, "stream") < 0 ||
        intern(&str_cluster, "cluster") < 0)
        return -1;
    /* Strong refs kept in statics: the module exists once per process. */
    if ((mg_cu_Module_type = mg_add_type_as(module, &module_spec, NULL, "CudaModule")) == NULL ||
        (mg_cu_Function_type = mg_add_type(module, &function_spec, NULL)) == NULL ||
        mg_tensor_map_init(module) < 0)
        return -1;
    return PyModule_AddFunctions(module, launch_functions);
}
