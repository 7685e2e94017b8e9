/* The fast readers of foreign arrays: how each type's arrays are read, found
 * once per type (torch, CuPy, JAX, and the protocols), without building views. */
#include "arrays/array.h"
#include "cuda/driver.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "arrays/dlpack.h"
#include "cuda/graph.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "base/numpy_api.h"
#include "arrays/array_shared.h"
/* ---------------------------------------------------------------------- */
/* Foreign arrays as launch arguments                                      */
/* ---------------------------------------------------------------------- */

PyObject *mg_arrays_str_is_cuda, *mg_arrays_str_is_cpu, *mg_arrays_str_data_ptr, *mg_arrays_str_dtype_attr, *mg_arrays_str_shape, *mg_arrays_str_stride,
                *mg_arrays_str_get_device, *mg_arrays_str_module, *mg_arrays_str_is_contiguous, *mg_arrays_str_data, *mg_arrays_str_ptr, *mg_arrays_str_device_id,
                *mg_arrays_str_c_contiguous, *mg_arrays_str_strides, *mg_arrays_str_get_current_stream, *mg_arrays_str_export_version,
                *mg_arrays_str_cupy_cuda, *mg_arrays_str_cupy_util, *mg_arrays_str_is_ready, *mg_arrays_str_block_until_ready,
                *mg_arrays_str_unsafe_buffer_pointer, *mg_arrays_str_is_deleted, *mg_arrays_str_aval, *mg_arrays_str_ndim,
                *mg_arrays_str_torch_function, *mg_arrays_str_torch_dispatch, *mg_arrays_str_torch_c, *mg_arrays_str_disabled_torch_function,
                *mg_arrays_str_torch_utils_dlpack, *mg_arrays_str_to_dlpack, *mg_arrays_str_dlpack_exchange, *mg_arrays_str_pyx_capi,
                *mg_arrays_str_cupy_backends_stream, *mg_arrays_str_get_current_stream_ptr, *mg_arrays_str_get_stream_ptr,
                *mg_arrays_str_is_ptds_enabled, *mg_arrays_str_memory_pointer;
/* The C signatures CuPy's stream module gives the functions behind its current stream. */
#define CUPY_STREAM_PTR_SIGNATURE "intptr_t (void)"
#define CUPY_DEVICE_STREAM_PTR_SIGNATURE "intptr_t (int)"
#define CUPY_PTDS_SIGNATURE "int (void)"
/* torch.Tensor once an instance was seen (strong): torch is never imported here. */
static PyTypeObject *torch_tensor_type;
/* {torch.dtype: DType, or None where mlirgpu has no such dtype}; filled on first sight. */
PyObject *mg_arrays_torch_dtypes;

static const struct {
    const char *name;   /* str(torch.float32) is "torch.float32": the part after the dot */
    mg_dtype_id id;
} torch_dtype_names[] = {
    {"bool", MG_DT_BOOL}, {"int8", MG_DT_I8}, {"int16", MG_DT_I16}, {"int32", MG_DT_I32},
    {"int64", MG_DT_I64}, {"uint8", MG_DT_U8}, {"uint16", MG_DT_U16}, {"uint32", MG_DT_U32},
    {"uint64", MG_DT_U64}, {"float16", MG_DT_F16}, {"bfloat16", MG_DT_BF16},
    {"float32", MG_DT_F32}, {"float64", MG_DT_F64},
    {"float8_e4m3fn", MG_DT_F8E4M3}, {"float8_e5m2", MG_DT_F8E5M2},
};

/* The __module__ of a type of its MRO: borrowed, from the type's dict (heap
 * types) or the dotted prefix of tp_name (extension types), in `buffer`. */
static const char *type_module(PyTypeObject *type, char *buffer, size_t size)
{
    if (type->tp_dict != NULL && (type->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        PyObject *module = PyDict_GetItemWithError(type->tp_dict, mg_arrays_str_module);   /* borrowed */
        if (module == NULL) {
            PyErr_Clear();
            return NULL;
        }
        return PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : NULL;
    }
    const char *dot = strrchr(type->tp_name, '.');
    if (dot == NULL || (size_t)(dot - type->tp_name) >= size)
        return NULL;
    memcpy(buffer, type->tp_name, (size_t)(dot - type->tp_name));
    buffer[dot - type->tp_name] = '\0';
    return buffer;
}

static const char *type_short_name(PyTypeObject *type)
{
    const char *dot = strrchr(type->tp_name, '.');
    return dot != NULL ? dot + 1 : type->tp_name;
}

/* torch.Tensor or a subclass: some heap type of the MRO is named "Tensor"
 * and has __module__ "torch" (torch.Tensor is a Python class over the C
 * torch._C.TensorBase). Later calls compare against the type found. */
static int is_torch_tensor(PyTypeObject *type)
{
    if (torch_tensor_type != NULL)
        return type == torch_tensor_type || PyType_IsSubtype(type, torch_tensor_type);
    PyObject *mro = type->tp_mro;
    if (mro == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        char buffer[64];
        const char *module;
        if (!(base->tp_flags & Py_TPFLAGS_HEAPTYPE) || strcmp(base->tp_name, "Tensor") != 0 ||
            (module = type_module(base, buffer, sizeof buffer)) == NULL) {
            PyErr_Clear();
            continue;
        }
        if (strcmp(module, "torch") == 0) {
            torch_tensor_type = (PyTypeObject *)Py_NewRef((PyObject *)base);
            return 1;
        }
    }
    return 0;
}

/* cupy.ndarray or a subclass: a type of the MRO named "ndarray" or
 * "_ndarray_base" whose module is cupy or one of its submodules. */
static int is_cupy_ndarray(PyTypeObject *type)
{
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        const char *name = type_short_name(base), *module;
        char buffer[64];
        if (strcmp(name, "ndarray") != 0 && strcmp(name, "_ndarray_base") != 0)
            continue;
        if ((module = type_module(base, buffer, sizeof buffer)) == NULL) {
            PyErr_Clear();
            continue;
        }
        if (strcmp(module, "cupy") == 0 || strncmp(module, "cupy.", 5) == 0)
            return 1;
    }
    return 0;
}

/* jax.Array's implementation: a type of the MRO named "ArrayImpl" in jax or
 * jaxlib (a Python class in older releases, a C++ one in newer). */
static int is_jax_array(PyTypeObject *type)
{
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        const char *module;
        char buffer[64];
        if (strcmp(type_short_name(base), "ArrayImpl") != 0)
            continue;
        if ((module = type_module(base, buffer, sizeof buffer)) == NULL) {
            PyErr_Clear();
            continue;
        }
        if (strncmp(module, "jax", 3) == 0)
            return 1;
    }
    return 0;
}







type_reader mg_arrays_type_readers[TYPE_READERS];
static int type_readers_next;
static int type_readers_last;   /* the slot found last, tried first: a launch's arrays are mostly of one type */

/* The slot of `type`, or -1. */
int mg_arrays_type_slot(PyTypeObject *type)
{
    if (mg_arrays_type_readers[type_readers_last].type == type)
        return type_readers_last;
    for (int i = 0; i < TYPE_READERS; i++)
        if (mg_arrays_type_readers[i].type == type)
            return type_readers_last = i;
    return -1;
}


void mg_arrays_reader_info_release(reader_info *info)
{
    Py_CLEAR(info->plan);
}

static unsigned int type_version(PyTypeObject *type)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyUnstable_Type_AssignVersionTag(type);
#else
    _PyType_Lookup(type, mg_arrays_str_module);   /* assigns a tag where the type has none; runs no Python code */
#endif
    return type->tp_version_tag;
}

/* The data descriptor that attribute lookup finds for `name` on `type`,
 * where calling it is all PyObject_GetAttr would do: a C getter or member
 * (a data descriptor, which an instance's __dict__ cannot hide; not one
 * whose reads raise an audit event) on a type whose attribute lookup is the
 * usual one. Borrowed; NULL otherwise. */
static PyObject *c_descriptor(PyTypeObject *type, PyObject *name)
{
    if (type->tp_getattro == PyObject_GenericGetAttr) {
        PyObject *descr = _PyType_Lookup(type, name);   /* runs no Python code */
        if (descr != NULL && (Py_IS_TYPE(descr, &PyGetSetDescr_Type) ||
                              (Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                               !(((PyMemberDescrObject *)descr)->d_member->flags & READ_RESTRICTED))))
            return descr;
    }
    return NULL;
}

/* `attr` for `name`, whose c_descriptor on the type is `descr` (or NULL):
 * its getter or member, called without the type check the descriptor would
 * make first, which that lookup settled; looked up as usual where there is
 * none, or the getter is missing (a write-only attribute). */
static void plan_attr_set(plan_attr *attr, PyObject *descr, PyObject *name)
{
    *attr = (plan_attr){name, NULL, NULL, NULL};
    if (descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        attr->get = ((PyGetSetDescrObject *)descr)->d_getset->get;
        attr->closure = ((PyGetSetDescrObject *)descr)->d_getset->closure;
    }
    else if (descr != NULL) {
        attr->member = ((PyMemberDescrObject *)descr)->d_member;
    }
}

/* `obj`'s attribute, `obj` being of the type `attr` was found on. */
static inline PyObject *plan_attr_read(const plan_attr *attr, PyObject *obj)
{
    if (attr->get != NULL)
        return attr->get(obj, attr->closure);
    if (attr->member != NULL)
        return PyMember_GetOne((const char *)obj, attr->member);
    return PyObject_GetAttr(obj, attr->name);
}

/* obj.<name>, through its type's C getter or member where it has one: for
 * an object whose type no plan keeps (the lookup costs a little). */
static PyObject *get_attr(PyObject *obj, PyObject *name)
{
    plan_attr attr;
    plan_attr_set(&attr, c_descriptor(Py_TYPE(obj), name), name);
    return plan_attr_read(&attr, obj);
}

/* Attribute `name` of the module `module_name` if that module was imported
 * (nothing is imported here): a new reference; NULL with no error set where
 * the module is not imported, with the error set where it lacks `name`. */
static PyObject *imported_attr(PyObject *module_name, PyObject *name)
{
    PyObject *module = PyImport_GetModule(module_name);
    if (module == NULL)
        return NULL;
    PyObject *value = PyObject_GetAttr(module, name);
    Py_DECREF(module);
    return value;
}

/* Keeps only the exceptions that must propagate: 0 with any Exception
 * cleared, -1 for the rest (KeyboardInterrupt). */
static int clear_exception(void)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
    }
    return 0;
}

#define PLAN_CAPSULE "mlirgpu reader plan"

static void plan_destroy(PyObject *capsule)
{
    reader_plan *plan = PyCapsule_GetPointer(capsule, PLAN_CAPSULE);
    for (int i = 0; i < plan->nkept; i++)
        Py_DECREF(plan->kept[i]);
    PyMem_Free(plan);
}

/* An empty plan: its object (a new reference; NULL on error) and, in *out, what it keeps. */
static PyObject *plan_new(reader_plan **out)
{
    reader_plan *plan = PyMem_Calloc(1, sizeof *plan);
    if (plan == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(plan, PLAN_CAPSULE, plan_destroy);
    if (capsule == NULL)
        PyMem_Free(plan);
    *out = plan;
    return capsule;
}

/* `obj` (a new reference, stolen), kept by `plan`: borrowed, or NULL
 * where `obj` is NULL or None, or the plan is full (nothing is kept). */
static PyObject *plan_keep(reader_plan *plan, PyObject *obj)
{
    if (obj == NULL || obj == Py_None || plan->nkept == PLAN_KEPT) {
        Py_XDECREF(obj);
        return NULL;
    }
    return plan->kept[plan->nkept++] = obj;
}

/* `type`'s attribute `name` as `plan` reads it (see plan_attr). */
static void plan_attr_find(reader_plan *plan, plan_attr *attr, PyTypeObject *type, PyObject *name)
{
    PyObject *descr = c_descriptor(type, name);
    plan_attr_set(attr, descr != NULL && plan_keep(plan, Py_NewRef(descr)) != NULL ? descr : NULL, name);
}

/* Whether `type`'s tensors may be read around torch's Python layer: the
 * type leaves __torch_function__ and __torch_dispatch__ as torch.Tensor has
 * them (or, as torch.nn.Parameter does, torch functions disabled), so that
 * its attributes would read the same tensor. 1 or 0; -1 only for an
 * exception that is not an Exception. */
static int torch_plain(PyTypeObject *type)
{
    PyObject *function = _PyType_Lookup(type, mg_arrays_str_torch_function);   /* borrowed */
    PyObject *dispatch = _PyType_Lookup(type, mg_arrays_str_torch_dispatch);
    if (dispatch != _PyType_Lookup(torch_tensor_type, mg_arrays_str_torch_dispatch))
        return 0;
    if (function == _PyType_Lookup(torch_tensor_type, mg_arrays_str_torch_function))
        return 1;
    PyObject *disabled = imported_attr(mg_arrays_str_torch_c, mg_arrays_str_disabled_torch_function);
    int plain = disabled != NULL && function == disabled;
    Py_XDECREF(disabled);
    return clear_exception() < 0 ? -1 : plain;
}

/* `type`'s DLPack exchange table (its __dlpack_c_exchange_api__ capsule)
 * where mlirgpu can use it: DLPack major version 1, with
 * dltensor_from_py_object_no_sync. A new reference; None otherwise; NULL
 * only for an exception that is not an Exception. */
static PyObject *exchange_table(PyTypeObject *type)
{
    PyObject *capsule = PyObject_GetAttr((PyObject *)type, mg_arrays_str_dlpack_exchange);
    if (capsule != NULL && PyCapsule_IsValid(capsule, MG_DLPACK_EXCHANGE_NAME)) {
        const DLPackExchangeAPI *api = PyCapsule_GetPointer(capsule, MG_DLPACK_EXCHANGE_NAME);
        if (api->header.version.major == MG_DLPACK_MAJOR && api->dltensor_from_py_object_no_sync != NULL)
            return capsule;
    }
    Py_XDECREF(capsule);
    return clear_exception() < 0 ? NULL : Py_NewRef(Py_None);
}

/* READER_TORCH's plan for `type`: a new reference, NULL on an error that
 * must propagate. For a type torch's Python layer leaves alone, the DLPack
 * exchange table recent torch releases give their tensors and
 * torch.utils.dlpack.to_dlpack, where torch.utils.dlpack was imported
 * (nothing is imported here); None where a reader may not use them. */
static PyObject *torch_plan(PyTypeObject *type)
{
    int plain = torch_plain(type);
    PyObject *exchange = plain > 0 ? exchange_table(type) : Py_NewRef(Py_None);
    if (plain < 0 || exchange == NULL) {
        Py_XDECREF(exchange);
        return NULL;
    }
    reader_plan *plan;
    PyObject *object = plan_new(&plan);
    if (object == NULL) {
        Py_DECREF(exchange);
        return NULL;
    }
    torch_reads *t = &plan->torch;
    if ((exchange = plan_keep(plan, exchange)) != NULL)
        t->exchange = PyCapsule_GetPointer(exchange, MG_DLPACK_EXCHANGE_NAME);
    PyObject *exporter = plain ? imported_attr(mg_arrays_str_torch_utils_dlpack, mg_arrays_str_to_dlpack) : NULL;
    if (exporter != NULL && !PyCallable_Check(exporter))
        Py_CLEAR(exporter);
    t->to_dlpack = plan_keep(plan, exporter);
    plan_attr_find(plan, &t->is_cuda, type, mg_arrays_str_is_cuda);
    plan_attr_find(plan, &t->is_cpu, type, mg_arrays_str_is_cpu);
    plan_attr_find(plan, &t->dtype, type, mg_arrays_str_dtype_attr);
    plan_attr_find(plan, &t->shape, type, mg_arrays_str_shape);
    if (clear_exception() < 0) {
        Py_DECREF(object);
        return NULL;
    }
    return object;
}

/* The C function Cython module `module` exports as `name` (its
 * __pyx_capi__, what CuPy's own modules cimport) as a capsule whose name,
 * the C signature, must be `signature`: a new reference, or None; NULL
 * only for an exception that is not an Exception. */
static PyObject *cython_function(PyObject *module, PyObject *name, const char *signature)
{
    PyObject *table = imported_attr(module, mg_arrays_str_pyx_capi), *capsule = NULL;
    if (table != NULL && PyDict_Check(table) && (capsule = PyDict_GetItemWithError(table, name)) != NULL &&
        PyCapsule_IsValid(capsule, signature)) {
        Py_INCREF(capsule);
        Py_DECREF(table);
        return capsule;
    }
    Py_XDECREF(table);
    return clear_exception() < 0 ? NULL : Py_NewRef(Py_None);
}

/* The C function behind `capsule` (from cython_function, stolen), kept by `plan`; NULL where there is none. */
static void *plan_function(reader_plan *plan, PyObject *capsule, const char *signature)
{
    capsule = plan_keep(plan, capsule);
    return capsule != NULL ? PyCapsule_GetPointer(capsule, signature) : NULL;
}

/* READER_CUPY's plan for `type`: CuPy's get_current_stream and settings
 * module (cupy._util), looked up without importing anything; the C
 * functions behind get_current_stream's pointer (the current device's,
 * one device's, and whether the null stream is per thread), where CuPy
 * exports them; how the arrays' attributes are read, and those of
 * cupy.cuda.MemoryPointer, the type of their `data`. A new reference;
 * None where CuPy lacks get_current_stream (its arrays are then read
 * through their protocol); NULL on an error that must propagate. */
static PyObject *cupy_plan(PyTypeObject *type)
{
    PyObject *current_stream = imported_attr(mg_arrays_str_cupy_cuda, mg_arrays_str_get_current_stream);
    PyObject *settings = current_stream != NULL ? PyImport_GetModule(mg_arrays_str_cupy_util) : NULL;
    if (current_stream == NULL || settings == NULL || !PyCallable_Check(current_stream)) {
        Py_XDECREF(current_stream);
        Py_XDECREF(settings);
        return clear_exception() < 0 ? NULL : Py_NewRef(Py_None);
    }
    reader_plan *plan;
    PyObject *object = plan_new(&plan);
    if (object == NULL) {
        Py_DECREF(current_stream);
        Py_DECREF(settings);
        return NULL;
    }
    cupy_reads *c = &plan->cupy;
    c->current_stream = plan_keep(plan, current_stream);
    c->settings = plan_keep(plan, settings);
    /* A module's dict stays the same object for the module's life */
    c->settings_dict = PyModule_CheckExact(settings) ? PyModule_GetDict(settings) : NULL;
    PyObject *stream_ptr = cython_function(mg_arrays_str_cupy_backends_stream, mg_arrays_str_get_current_stream_ptr, CUPY_STREAM_PTR_SIGNATURE);
    PyObject *device_stream_ptr = stream_ptr != NULL ? cython_function(mg_arrays_str_cupy_backends_stream, mg_arrays_str_get_stream_ptr,
                                                                       CUPY_DEVICE_STREAM_PTR_SIGNATURE) : NULL;
    PyObject *ptds = device_stream_ptr != NULL ? cython_function(mg_arrays_str_cupy_backends_stream, mg_arrays_str_is_ptds_enabled,
                                                                 CUPY_PTDS_SIGNATURE) : NULL;
    PyObject *pointer_type = ptds != NULL ? imported_attr(mg_arrays_str_cupy_cuda, mg_arrays_str_memory_pointer) : NULL;
    if (pointer_type == NULL && clear_exception() < 0) {
        Py_XDECREF(stream_ptr);
        Py_XDECREF(device_stream_ptr);
        Py_XDECREF(ptds);
        Py_DECREF(object);
        return NULL;
    }
    c->stream_ptr = plan_function(plan, stream_ptr, CUPY_STREAM_PTR_SIGNATURE);
    c->device_stream_ptr = plan_function(plan, device_stream_ptr, CUPY_DEVICE_STREAM_PTR_SIGNATURE);
    c->ptds = plan_function(plan, ptds, CUPY_PTDS_SIGNATURE);
    if (c->stream_ptr == NULL || c->ptds == NULL) {   /* both or neither: a null stream means one of two */
        c->stream_ptr = NULL;
        c->ptds = NULL;
    }
    plan_attr_find(plan, &c->data, type, mg_arrays_str_data);
    plan_attr_find(plan, &c->dtype, type, mg_arrays_str_dtype_attr);
    plan_attr_find(plan, &c->ndim, type, mg_arrays_str_ndim);
    plan_attr_find(plan, &c->shape, type, mg_arrays_str_shape);
    plan_attr_find(plan, &c->c_contiguous, type, mg_arrays_str_c_contiguous);
    plan_attr_find(plan, &c->strides, type, mg_arrays_str_strides);
    /* A type without a version tag could change unseen: its instances are looked up */
    if (pointer_type != NULL && PyType_Check(pointer_type) &&
        (c->pointer_version = type_version((PyTypeObject *)pointer_type)) != 0)
        pointer_type = plan_keep(plan, pointer_type);
    else
        Py_CLEAR(pointer_type);
    if ((c->pointer_type = (PyTypeObject *)pointer_type) != NULL) {
        plan_attr_find(plan, &c->ptr, c->pointer_type, mg_arrays_str_ptr);
        plan_attr_find(plan, &c->device_id, c->pointer_type, mg_arrays_str_device_id);
    }
    return object;
}


/* 0, or -1 only for an exception that is not an Exception. */
int mg_arrays_reader_of(PyTypeObject *type, reader_info *info)
{
    if (mg_arrays_known_reader(type, info))
        return 0;
    int slot = mg_arrays_type_slot(type);   /* a type that changed since is classified again in its slot */
    int reader = READER_GENERIC;
    PyObject *plan = NULL;   /* NULL: the reader has none */
    unsigned int version = type_version(type);
    if (is_torch_tensor(type)) {
        if ((plan = torch_plan(type)) == NULL)
            return -1;
        reader = READER_TORCH;
    }
    else if (is_jax_array(type)) {
        reader = READER_JAX;
    }
    else if (is_cupy_ndarray(type)) {
        if ((plan = cupy_plan(type)) == NULL)
            return -1;
        if (plan == Py_None)
            Py_CLEAR(plan);   /* a CuPy without get_current_stream: its protocol is read */
        else
            reader = READER_CUPY;
    }
    if (type->tp_version_tag != version) {
        /* The lookups ran code that changed the type: this call reads
         * through the protocols, the next classifies the type again. */
        Py_XDECREF(plan);
        info->reader = READER_GENERIC;
        return 0;
    }
    const reader_plan *reads = plan != NULL ? PyCapsule_GetPointer(plan, PLAN_CAPSULE) : NULL;
    info->reader = reader;
    info->plan = Py_XNewRef(plan);
    info->reads = reads;
    if (version == 0) {   /* CPython ran out of tags: classified on every call */
        Py_XDECREF(plan);
        return 0;
    }
    /* Looking up the plan may have run code that filled slots: look again. */
    if (slot < 0)
        slot = mg_arrays_type_slot(type);
    if (slot < 0) {
        slot = type_readers_next;
        type_readers_next = (type_readers_next + 1) % TYPE_READERS;
    }
    type_reader old = mg_arrays_type_readers[slot];
    mg_arrays_type_readers[slot] = (type_reader){(PyTypeObject *)Py_NewRef((PyObject *)type), version, reader, plan, reads, -1};
    /* Released last: a type's deallocation may run code. */
    Py_XDECREF(old.type);
    Py_XDECREF(old.plan);
    return 0;
}

/* The DType of a torch.dtype: 1, 0 when mlirgpu has none, -1 on error. */
static int torch_dtype(PyObject *dtype, mg_dtype **out)
{
    PyObject *known = PyDict_GetItemWithError(mg_arrays_torch_dtypes, dtype);   /* borrowed */
    if (known == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *text = PyObject_Str(dtype);
        if (text == NULL)
            return -1;
        const char *name = PyUnicode_AsUTF8(text);
        known = Py_None;
        if (name != NULL && strncmp(name, "torch.", 6) == 0)
            for (size_t i = 0; i < sizeof torch_dtype_names / sizeof torch_dtype_names[0]; i++)
                if (strcmp(name + 6, torch_dtype_names[i].name) == 0)
                    known = (PyObject *)mg_arrays_dtypes[torch_dtype_names[i].id];
        Py_DECREF(text);
        if (name == NULL || PyDict_SetItem(mg_arrays_torch_dtypes, dtype, known) < 0)
            return -1;
    }
    if (known == Py_None)
        return 0;
    *out = (mg_dtype *)known;
    return 1;
}

int mg_arrays_foreign_contiguous(const mg_foreign *f)
{
    Py_ssize_t expected = f->dtype->itemsize;
    for (int i = 0; i < f->ndim; i++)
        if (f->shape[i] == 0)
            return 1;
    for (int i = f->ndim - 1; i >= 0; i--) {
        if (f->shape[i] != 1 && f->strides[i] != expected)
            return 0;
        expected *= f->shape[i];
    }
    return 1;
}

/* `count` ints of a tuple (torch.Size included) into `out`: 0, or -1 on
 * anything else (no error set). */
int mg_arrays_read_ints(PyObject *tuple, Py_ssize_t *out, int *count)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > MG_MAX_NDIM)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyLong_Check(item))
            return -1;
        out[i] = PyLong_AsSsize_t(item);
        if (out[i] == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    *count = (int)n;
    return 0;
}

PyObject *mg_arrays_call_method(PyObject *obj, PyObject *name)
{
    return PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* The int `value` (a new reference, consumed; NULL passes an error on): 0,
 * or -1 on anything else with the error (if any) left for the caller's fallback. */
static inline int take_int(PyObject *value, long long *out)
{
    if (value == NULL)
        return -1;
    int ok = PyLong_Check(value);
    if (ok)
        *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return ok && (*out != -1 || !PyErr_Occurred()) ? 0 : -1;
}

/* An int attribute (or, with `call`, method result) of `obj`, as take_int. */
int mg_arrays_read_int(PyObject *obj, PyObject *name, int call, long long *out)
{
    return take_int(call ? mg_arrays_call_method(obj, name) : PyObject_GetAttr(obj, name), out);
}

/* A reader's "take the slow path": 0 with the error cleared, or -1 for a
 * BaseException that must propagate; `out` is reset for the slow path. */
int mg_arrays_reader_fallback(mg_foreign *out)
{
    if (clear_exception() < 0)
        return -1;
    out->host = 0;
    out->dtype = NULL;
    out->ndim = 0;
    out->device = -1;
    out->wait = 0;
    out->producer = NULL;
    return 0;
}

/* What a DLTensor of CUDA or host memory tells, its dtype being `dtype`
 * (whose size its own must match): 1, or 0 where it cannot be read so. */
static int dl_read(const DLTensor *t, mg_dtype *dtype, mg_foreign *out)
{
    if (t->device.device_type == kDLCUDA)
        out->device = t->device.device_id;
    else if (t->device.device_type == kDLCPU)
        out->host = 1;
    else
        return 0;
    if (t->ndim < 0 || t->ndim > MG_MAX_NDIM || t->dtype.lanes != 1 || t->dtype.bits != 8 * dtype->itemsize)
        return 0;
    out->dtype = dtype;
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > PY_SSIZE_T_MAX)
            return 0;
        out->shape[i] = (Py_ssize_t)t->shape[i];
    }
    Py_ssize_t size;
    if (t->strides == NULL) {
        if (mg_arrays_c_strides(out->ndim, out->shape, dtype->itemsize, out->strides, &size) < 0)
            return 0;
    }
    else {
        for (int i = 0; i < t->ndim; i++)
            if (mg_arrays_checked_mul((Py_ssize_t)t->strides[i], dtype->itemsize, &out->strides[i]) < 0)
                return 0;
    }
    out->ptr = (CUdeviceptr)(uintptr_t)t->data + (CUdeviceptr)t->byte_offset;
    out->contiguous = mg_arrays_foreign_contiguous(out);
    return 1;
}

/* A torch tensor through torch.utils.dlpack.to_dlpack, one call that tells
 * pointer, shape, strides and device, and its dtype attribute: DLPack's
 * codes do not tell every torch dtype apart in every torch release, so the
 * dtype is torch's own. 1 filled; 0 read the attributes instead (a tensor
 * to_dlpack refuses, or one neither on a GPU nor on the host), with any
 * error left for reader_fallback. */
static int torch_read_dlpack(PyObject *obj, const torch_reads *t, mg_foreign *out)
{
    PyObject *value = plan_attr_read(&t->dtype, obj);
    mg_dtype *dtype;
    int found = value == NULL ? -1 : torch_dtype(value, &dtype);
    Py_XDECREF(value);
    if (found <= 0)
        return 0;
    PyObject *capsule = PyObject_CallOneArg(t->to_dlpack, obj);
    if (capsule == NULL)
        return 0;
    int status = 0;
    if (PyCapsule_IsValid(capsule, MG_DLPACK_NAME)) {
        DLManagedTensor *managed = PyCapsule_GetPointer(capsule, MG_DLPACK_NAME);
        status = dl_read(&managed->dl_tensor, dtype, out);
    }
    Py_DECREF(capsule);   /* never consumed: its destructor calls the tensor's deleter */
    return status;
}

/* A torch tensor: 1 filled; 0 take the slow path (not CUDA or CPU, a dtype
 * mlirgpu lacks, or anything unexpected, with the error cleared); -1 a
 * BaseException that must propagate. Torch's __cuda_array_interface__ is
 * version 2, without a stream: there is nothing to wait for, as there is
 * nothing when torch's own protocol is read.
 * A tensor whose type keeps torch's own __torch_function__ is read in one C
 * call through torch's DLPack exchange table; where torch has none, for a
 * signature, through to_dlpack and its dtype (a call and an attribute,
 * where its attributes take five). Otherwise through its attributes:
 * is_cuda, data_ptr(), and for a signature dtype, shape, is_contiguous()
 * (stride() only when it is not) and, where the process sees more than one
 * GPU, get_device(). */
int mg_arrays_torch_read(PyObject *obj, const torch_reads *t, mg_foreign *out, int full)
{
    PyObject *value = NULL;
    mg_dtype *dtype = NULL;
    long long number;
    int count;
    if (t->exchange != NULL) {
        DLTensor tensor;
        /* The tensor's shape and strides are torch's own: read before any Python code runs */
        if (t->exchange->dltensor_from_py_object_no_sync(obj, &tensor) == 0 &&
            mg_arrays_dtype_from_dl(tensor.dtype, &dtype) == 0 && dl_read(&tensor, dtype, out))
            return 1;
        if (mg_arrays_reader_fallback(out) < 0)
            return -1;
    }
    else if (full && t->to_dlpack != NULL) {
        if (torch_read_dlpack(obj, t, out))
            return 1;
        if (mg_arrays_reader_fallback(out) < 0)
            return -1;
    }
    if ((value = plan_attr_read(&t->is_cuda, obj)) == NULL)
        goto fallback;
    if (value != Py_True) {
        /* meta, mps, xpu...: the slow path names what they are */
        Py_SETREF(value, plan_attr_read(&t->is_cpu, obj));
        if (value != Py_True)
            goto fallback;
        out->host = 1;
        if (!full)
            goto done;
    }
    if (mg_arrays_read_int(obj, mg_arrays_str_data_ptr, 1, &number) < 0)
        goto fallback;
    out->ptr = (CUdeviceptr)(unsigned long long)number;
    if (!full)
        goto done;
    Py_SETREF(value, plan_attr_read(&t->dtype, obj));
    if (value == NULL || torch_dtype(value, &dtype) <= 0)
        goto fallback;
    out->dtype = dtype;
    Py_SETREF(value, plan_attr_read(&t->shape, obj));
    if (value == NULL || mg_arrays_read_ints(value, out->shape, &out->ndim) < 0)
        goto fallback;
    Py_SETREF(value, mg_arrays_call_method(obj, mg_arrays_str_is_contiguous));
    if (value == Py_True) {
        Py_ssize_t size;
        if (mg_arrays_c_strides(out->ndim, out->shape, dtype->itemsize, out->strides, &size) < 0)
            goto fallback;
    }
    else {
        Py_SETREF(value, mg_arrays_call_method(obj, mg_arrays_str_stride));
        if (value == NULL || mg_arrays_read_ints(value, out->strides, &count) < 0 || count != out->ndim)
            goto fallback;
        for (int i = 0; i < count; i++)
            if (mg_arrays_checked_mul(out->strides[i], dtype->itemsize, &out->strides[i]) < 0)
                goto fallback;
    }
    if (!out->host && (out->device = mg_cu_sole_device()) < 0) {
        if (mg_arrays_read_int(obj, mg_arrays_str_get_device, 1, &number) < 0 || number < 0 || number > INT32_MAX)
            goto fallback;
        out->device = (int)number;
    }
    out->contiguous = mg_arrays_foreign_contiguous(out);
done:
    Py_XDECREF(value);
    return 1;
fallback:
    Py_XDECREF(value);
    return mg_arrays_reader_fallback(out);
}

/* The stream CuPy's __cuda_array_interface__ names: CuPy's current stream
 * (its CAI writes the legacy default stream where that is the null stream),
 * or none when CUDA_ARRAY_INTERFACE_EXPORT_VERSION is 2. Read once per call
 * (memo): every CuPy array of a call names the same stream. 0, or -1 to
 * take the slow path. */
static int cupy_stream(const cupy_reads *c, mg_foreign_memo *memo)
{
    if (memo->cupy_stream_read)
        return 0;
    long long version, handle;
    /* A plain module's attribute is its dict's entry: read there, without the lookup around it */
    PyObject *exported = c->settings_dict != NULL ? PyDict_GetItemWithError(c->settings_dict, mg_arrays_str_export_version) : NULL;
    if (exported == NULL && PyErr_Occurred())
        return -1;
    if (take_int(exported != NULL ? Py_NewRef(exported) : PyObject_GetAttr(c->settings, mg_arrays_str_export_version),
                 &version) < 0)
        return -1;
    memo->cupy_wait = version == 3;
    memo->cupy_stream = NULL;
    if (version == 3 && c->stream_ptr != NULL) {
        /* With one GPU, CuPy's current device is device 0: its stream there is the current
         * one, found without asking the CUDA runtime which device is current */
        intptr_t pointer = c->device_stream_ptr != NULL && mg_cu_sole_device() == 0 ? c->device_stream_ptr(0)
                                                                                     : c->stream_ptr();
        if (PyErr_Occurred())
            return -1;
        /* CuPy's null stream is the per-thread default stream where CuPy was told to use that */
        if (pointer == 0 && c->ptds())
            pointer = (intptr_t)CU_STREAM_PER_THREAD;
        memo->cupy_stream = (CUstream)pointer;
    }
    else if (version == 3) {
        PyObject *stream = PyObject_CallNoArgs(c->current_stream);
        if (stream == NULL)
            return -1;
        int status = mg_arrays_read_int(stream, mg_arrays_str_ptr, 0, &handle);
        Py_DECREF(stream);
        if (status < 0)
            return -1;
        memo->cupy_stream = (CUstream)(uintptr_t)handle;   /* 0 and 1: the legacy stream; 2: per-thread */
    }
    else if (version != 2) {
        return -1;   /* CuPy's CAI raises: the slow path says why */
    }
    memo->cupy_stream_read = 1;
    return 0;
}

/* The DType of `value`, a NumPy dtype read from an array: 0, or -1 (with
 * or without an error set) where it is no dtype or one mlirgpu lacks. The
 * dtype read last is kept (a strong reference: its address names no other
 * object while kept) with its DType, as launch after launch reads the same
 * one; a NumPy dtype never changes what dtype_from_descr reads. */
static PyObject *last_descr;
static mg_dtype *last_descr_dtype;

int mg_arrays_numpy_dtype(PyObject *value, mg_dtype **out)
{
    if (value == last_descr) {
        *out = last_descr_dtype;
        return 0;
    }
    if (!PyArray_DescrCheck(value) || mg_arrays_dtype_from_descr((PyArray_Descr *)value, out) < 0)
        return -1;
    Py_XSETREF(last_descr, Py_NewRef(value));
    last_descr_dtype = *out;
    return 0;
}

/* A CuPy array: data.ptr and the stream, and for a signature dtype, shape
 * (a 1-D array's from len(), which makes no object, where the shape is a
 * tuple built on each read), _c_contiguous (strides only when not) and,
 * with more than one GPU, data.device_id, as the slow path would read them
 * from its __cuda_array_interface__. */
int mg_arrays_cupy_read(PyObject *obj, const cupy_reads *c, mg_foreign *out, int full, mg_foreign_memo *memo)
{
    PyObject *data, *value = NULL;
    long long number;
    int count;
    if ((data = plan_attr_read(&c->data, obj)) == NULL)
        goto fallback;
    /* A MemoryPointer, as CuPy's arrays have, is read as the plan found; anything else is looked up */
    const plan_attr *ptr = Py_IS_TYPE(data, c->pointer_type) && c->pointer_type->tp_version_tag == c->pointer_version
                         ? &c->ptr : NULL;
    if (take_int(ptr != NULL ? plan_attr_read(ptr, data) : get_attr(data, mg_arrays_str_ptr), &number) < 0)
        goto fallback;
    out->ptr = (CUdeviceptr)(unsigned long long)number;
    if (full) {
        if ((out->device = mg_cu_sole_device()) < 0) {
            if (take_int(ptr != NULL ? plan_attr_read(&c->device_id, data) : get_attr(data, mg_arrays_str_device_id),
                         &number) < 0 || number < 0 || number > INT32_MAX)
                goto fallback;
            out->device = (int)number;
        }
        if ((value = plan_attr_read(&c->dtype, obj)) == NULL || mg_arrays_numpy_dtype(value, &out->dtype) < 0)
            goto fallback;
        if (take_int(plan_attr_read(&c->ndim, obj), &number) < 0)
            goto fallback;
        if (number == 1) {
            if ((out->shape[0] = PyObject_Length(obj)) < 0)
                goto fallback;
            out->ndim = 1;
        }
        else {
            Py_SETREF(value, plan_attr_read(&c->shape, obj));
            if (value == NULL || mg_arrays_read_ints(value, out->shape, &out->ndim) < 0)
                goto fallback;
        }
        Py_SETREF(value, plan_attr_read(&c->c_contiguous, obj));
        if (value == Py_True) {
            Py_ssize_t size;
            if (out->ndim == 1)
                out->strides[0] = out->dtype->itemsize;
            else if (mg_arrays_c_strides(out->ndim, out->shape, out->dtype->itemsize, out->strides, &size) < 0)
                goto fallback;
        }
        else {
            Py_SETREF(value, plan_attr_read(&c->strides, obj));
            if (value == NULL || mg_arrays_read_ints(value, out->strides, &count) < 0 || count != out->ndim)
                goto fallback;
        }
        /* C strides are contiguous by construction */
        out->contiguous = value == Py_True || mg_arrays_foreign_contiguous(out);
    }
    if (cupy_stream(c, memo) < 0)
        goto fallback;
    out->wait = memo->cupy_wait;
    out->producer = memo->cupy_stream;
    Py_DECREF(data);
    Py_XDECREF(value);
    return 1;
fallback:
    Py_XDECREF(data);
    Py_XDECREF(value);
    return mg_arrays_reader_fallback(out);
}

/* Whether JAX exports its arrays read-only, which does not change within a
 * JAX version: read from the first array's __cuda_array_interface__ and
 * kept with the type (when the type is still in the table after that code
 * ran). 0 or 1; -1 to take the slow path. */
int mg_arrays_jax_readonly(PyObject *obj, reader_info *info)
{
    if (info->readonly >= 0)
        return info->readonly;
    PyObject *cai = PyObject_GetAttr(obj, mg_arrays_str_cai);
    cai_fields f;
    int status = cai == NULL ? -1 : mg_arrays_cai_parse(cai, &f);
    Py_XDECREF(cai);
    if (status < 0)
        return -1;
    info->readonly = f.readonly;
    for (int i = 0; i < TYPE_READERS; i++)
        if (mg_arrays_type_readers[i].type == info->type && mg_arrays_type_readers[i].version == info->type->tp_version_tag)
            mg_arrays_type_readers[i].readonly = f.readonly;
    return f.readonly;
}


#define JAX_MEMOS 64
static jax_memo jax_memos[JAX_MEMOS];

/* The first of the two entries where `obj` may be kept (the second is its
 * neighbour): a multiplicative hash of the address, as objects allocated
 * together lie at regular distances. */
jax_memo *mg_arrays_jax_memo_pair(PyObject *obj)
{
    uint64_t h = (uint64_t)(uintptr_t)obj * UINT64_C(0x9E3779B97F4A7C15);
    return &jax_memos[(h >> 58) & ~(uint64_t)1];
}

/* What `ref` refers to, NULL once that died: only compared, never used.
 * Runs no Python code. */
PyObject *mg_arrays_weak_target(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return NULL;
    }
    Py_XDECREF(target);   /* alive elsewhere: frees nothing */
    return target;
#else
    PyObject *target = PyWeakref_GET_OBJECT(ref);
    return target == Py_None ? NULL : target;
#endif
}

