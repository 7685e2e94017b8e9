/* What the files of arrays/ share with each other (dtype.c, array.c,
 * exchange.c, readers.c, foreign.c, pinned.c, array_type.c), hidden from
 * the world by -fvisibility=hidden. */
#ifndef MG_ARRAYS_SHARED_H
#define MG_ARRAYS_SHARED_H

#include "arrays/array.h"
#include "arrays/dlpack.h"
#include "base/numpy_api.h"

/* Host DeviceArrays (the CPU backend's) are aligned like a cache line, so any
 * vector load a kernel does on them is aligned too. */
#define MG_HOST_ALIGNMENT 64

/* What a __cuda_array_interface__ dict says, checked. */
typedef struct {
    mg_dtype *dtype;          /* borrowed singleton */
    int ndim, has_strides, readonly, has_stream;
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM];
    unsigned long long pointer;
    CUstream stream;          /* the producer's stream, where has_stream */
} cai_fields;

/* ---- How each type's arrays are read, found once per type ----
 *
 * A launch reads its array arguments through what their library exposes
 * (READER_TORCH, READER_CUPY, READER_JAX) or through the protocols (READER_GENERIC:
 * __cuda_array_interface__, then __dlpack__). Which reader a type gets, and
 * for CuPy the functions that tell its current stream, are kept per type
 * along with the type's version tag: CPython gives a type a new tag (or 0)
 * whenever the type or one of its bases is changed, and a type whose tag
 * moved is classified again. Nothing about an object is kept: every call
 * reads pointer, dtype, shape, strides and device anew. */
enum { READER_GENERIC, READER_TORCH, READER_CUPY, READER_JAX };

/* One attribute of a plan's type, read as attribute lookup on that type
 * would read it: through the C getter or member the lookup finds, called
 * directly (without the descriptor's own type check, which the lookup
 * settled), or else looked up as usual. */
typedef struct {
    PyObject *name;            /* one of this file's interned names */
    getter get;                /* a getset descriptor's getter, with its closure */
    void *closure;
    PyMemberDef *member;       /* or a member descriptor's definition */
} plan_attr;

/* READER_TORCH's plan, see torch_plan. */
typedef struct {
    const DLPackExchangeAPI *exchange;   /* or NULL */
    PyObject *to_dlpack;                 /* or NULL */
    plan_attr is_cuda, is_cpu, dtype, shape;
} torch_reads;

/* READER_CUPY's plan, see cupy_plan. */
typedef struct {
    PyObject *current_stream;
    PyObject *settings;
    PyObject *settings_dict;             /* its dict where it is a plain module, else NULL */
    intptr_t (*stream_ptr)(void);        /* NULL where CuPy does not export them */
    intptr_t (*device_stream_ptr)(int);
    int (*ptds)(void);
    plan_attr data, dtype, ndim, shape, c_contiguous, strides;
    PyTypeObject *pointer_type;          /* cupy.cuda.MemoryPointer, and its version tag; or NULL */
    unsigned int pointer_version;
    plan_attr ptr, device_id;
} cupy_reads;

/* What a reader calls, found once per type and kept by a capsule (the
 * plan object), which releases `kept` with it. Every object the fields
 * name is borrowed from `kept`. */
#define PLAN_KEPT 16   /* CuPy's plan keeps 14 */

typedef struct {
    PyObject *kept[PLAN_KEPT];
    int nkept;
    union {
        torch_reads torch;
        cupy_reads cupy;
    };
} reader_plan;

typedef struct {
    PyTypeObject *type;        /* strong; NULL: a free slot */
    unsigned int version;      /* type->tp_version_tag when classified */
    int reader;
    PyObject *plan;            /* strong: READER_TORCH's and READER_CUPY's plan object, else NULL */
    const reader_plan *reads;  /* what `plan` keeps */
    int readonly;              /* JAX: whether its CAI exports arrays read-only; -1 until one was read */
} type_reader;

/* One type's reader, with a new reference to its plan (or NULL): the
 * caller releases it, as reading an array may run code that evicts the slot. */
typedef struct {
    PyTypeObject *type;        /* borrowed from the object being read */
    int reader, readonly;
    PyObject *plan;
    const reader_plan *reads;  /* what `plan` keeps, or NULL */
} reader_info;

/* A JAX array never changes: once ready, its buffer, dtype, shape and
 * device stay what they are until it is deleted (delete(), or donating it
 * to a jitted function), which frees the buffer. What was read of the
 * arrays seen last is kept here, each entry with a weak reference to its
 * array, so that another object at the same address is never taken for it;
 * every launch still asks is_deleted(). */
typedef struct {
    PyObject *ref;             /* strong reference to a weak reference to the array; NULL: a free slot */
    unsigned int version;      /* the array type's tp_version_tag: a changed type is read anew */
    CUdeviceptr ptr;
    mg_dtype *dtype;           /* borrowed singleton */
    int ndim, device, readonly;
    Py_ssize_t shape[MG_MAX_NDIM];
} jax_memo;

typedef struct {
    const char *name;
    int itemsize;
    char kind;
    uint8_t dlpack_code;
    int npy_type;
    const char *typestr;
    const char *ml_dtypes_name;   /* the type of ml_dtypes that is its NumPy dtype, where NumPy has none */
} mg_arrays_dtype_table_entry;

#define TYPE_READERS 16

extern PyTypeObject *mg_DType_type;
extern PyTypeObject *mg_array_type;
extern const mg_arrays_dtype_table_entry mg_arrays_dtype_table[MG_DT_COUNT];
extern mg_dtype *mg_arrays_dtypes[MG_DT_COUNT];
PyObject *mg_dtype_numpy(const mg_dtype *dt);
int mg_arrays_dtype_from_descr(PyArray_Descr *descr, mg_dtype **out);
int mg_dtype_converter(PyObject *obj, mg_dtype **out);
extern PyType_Spec mg_arrays_dtype_spec;
PyObject *mg_arrays_array_dtype_function(PyObject *module, PyObject *obj);
int mg_arrays_checked_mul(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out);
int mg_arrays_parse_shape(PyObject *obj, int *ndim, Py_ssize_t shape[MG_MAX_NDIM]);
int mg_arrays_c_strides(int ndim, const Py_ssize_t *shape, int itemsize, Py_ssize_t *strides, Py_ssize_t *size);
int mg_arrays_byte_extent(const mg_array *a, Py_ssize_t *lo, Py_ssize_t *hi);
int mg_arrays_is_c_contiguous(const mg_array *a);
mg_array *mg_arrays_array_create(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides);
int mg_arrays_array_traverse(mg_array *self, visitproc visit, void *arg);
int mg_arrays_array_clear(mg_array *self);
void mg_arrays_array_dealloc(mg_array *self);
void mg_array_set_stream(PyObject *obj, CUstream stream, PyObject *stream_obj);
mg_array *mg_arrays_host_create(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides);
PyObject *mg_arrays_array_allocate(mg_dtype *dtype, int ndim, const Py_ssize_t *shape,
                                PyObject *stream_arg, int zero, int host);
PyObject *mg_arrays_array_empty(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_zeros(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_to_device(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_get(mg_array *self, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_copy_to_host(mg_array *self, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_copy_from_host(mg_array *self, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_to(mg_array *self, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_copy_from(mg_array *self, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_get_shape(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_strides(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_dtype(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_nbytes(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_ptr(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_host(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_readonly(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_contiguous(mg_array *self, void *closure);
PyObject *mg_arrays_array_get_cai(mg_array *self, void *closure);
PyObject *mg_arrays_array_repr(mg_array *self);
Py_ssize_t mg_arrays_array_length(mg_array *self);
PyObject *mg_arrays_array_dlpack(mg_array *self, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_dlpack_device(mg_array *self, PyObject *unused);
extern PyObject *mg_arrays_str_cai, *mg_arrays_str_dlpack, *mg_arrays_str_dlpack_device, *mg_arrays_str_array_interface, *mg_arrays_str_array;
PyObject *mg_arrays_host_array_error(PyObject *obj);
int mg_arrays_cai_untyped(PyObject *obj, PyObject *cai);
int mg_arrays_cai_parse(PyObject *cai, cai_fields *f);
PyObject *mg_arrays_view_from_cai(PyObject *obj, PyObject *cai, int synchronize);
/* A DeviceArray viewing `ptr` (strides NULL: C-contiguous) on behalf of `owner`, which it keeps
 * alive; `device` -1: the pointer's own, or the current device's for an empty array. */
PyObject *mg_arrays_view_at(mg_dtype *dtype, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                            CUdeviceptr ptr, int readonly, int device, PyObject *owner);
int mg_arrays_dtype_from_dl(DLDataType t, mg_dtype **out);
PyObject *mg_arrays_view_from_capsule_on(PyObject *capsule, int host);
PyObject *mg_arrays_view_from_capsule(PyObject *capsule);
PyObject *mg_arrays_view_from_dlpack(PyObject *obj, int synchronize);
PyObject *mg_arrays_array_asarray_function(PyObject *module, PyObject *args, PyObject *kwargs);
extern PyObject *mg_arrays_str_is_cuda, *mg_arrays_str_is_cpu, *mg_arrays_str_data_ptr, *mg_arrays_str_dtype_attr, *mg_arrays_str_shape, *mg_arrays_str_stride,
                *mg_arrays_str_get_device, *mg_arrays_str_module, *mg_arrays_str_is_contiguous, *mg_arrays_str_data, *mg_arrays_str_ptr, *mg_arrays_str_device_id,
                *mg_arrays_str_c_contiguous, *mg_arrays_str_strides, *mg_arrays_str_get_current_stream, *mg_arrays_str_export_version,
                *mg_arrays_str_cupy_cuda, *mg_arrays_str_cupy_util, *mg_arrays_str_is_ready, *mg_arrays_str_block_until_ready,
                *mg_arrays_str_unsafe_buffer_pointer, *mg_arrays_str_is_deleted, *mg_arrays_str_aval, *mg_arrays_str_ndim,
                *mg_arrays_str_torch_function, *mg_arrays_str_torch_dispatch, *mg_arrays_str_torch_c, *mg_arrays_str_disabled_torch_function,
                *mg_arrays_str_torch_utils_dlpack, *mg_arrays_str_to_dlpack, *mg_arrays_str_dlpack_exchange, *mg_arrays_str_pyx_capi,
                *mg_arrays_str_cupy_backends_stream, *mg_arrays_str_get_current_stream_ptr, *mg_arrays_str_get_stream_ptr,
                *mg_arrays_str_is_ptds_enabled, *mg_arrays_str_memory_pointer;
extern PyObject *mg_arrays_torch_dtypes;
extern type_reader mg_arrays_type_readers[TYPE_READERS];
int mg_arrays_type_slot(PyTypeObject *type);
void mg_arrays_reader_info_release(reader_info *info);
int mg_arrays_reader_of(PyTypeObject *type, reader_info *info);
int mg_arrays_foreign_contiguous(const mg_foreign *f);
int mg_arrays_read_ints(PyObject *tuple, Py_ssize_t *out, int *count);
PyObject *mg_arrays_call_method(PyObject *obj, PyObject *name);
int mg_arrays_read_int(PyObject *obj, PyObject *name, int call, long long *out);
int mg_arrays_reader_fallback(mg_foreign *out);
int mg_arrays_torch_read(PyObject *obj, const torch_reads *t, mg_foreign *out, int full);
int mg_arrays_numpy_dtype(PyObject *value, mg_dtype **out);
int mg_arrays_cupy_read(PyObject *obj, const cupy_reads *c, mg_foreign *out, int full, mg_foreign_memo *memo);
int mg_arrays_jax_readonly(PyObject *obj, reader_info *info);
jax_memo *mg_arrays_jax_memo_pair(PyObject *obj);
PyObject *mg_arrays_weak_target(PyObject *ref);
extern PyTypeObject *mg_arrays_pinned_type;
extern PyType_Spec mg_arrays_pinned_spec;
PyObject *mg_arrays_array_pinned_empty(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *mg_arrays_array_pinned_zeros(PyObject *module, PyObject *args, PyObject *kwargs);

/* The reader of `type` where the type was classified and has not changed
 * since: 1 with `info` filled, else 0 with `info->plan` NULL. */
static inline int mg_arrays_known_reader(PyTypeObject *type, reader_info *info)
{
    info->plan = NULL;
    info->reads = NULL;
    info->type = type;
    info->readonly = -1;
    unsigned int version = type->tp_version_tag;
    int slot = mg_arrays_type_slot(type);
    if (slot < 0 || version == 0 || mg_arrays_type_readers[slot].version != version)
        return 0;
    type_reader *r = &mg_arrays_type_readers[slot];
    info->reader = r->reader;
    info->readonly = r->readonly;
    info->plan = Py_XNewRef(r->plan);
    info->reads = r->reads;
    return 1;
}


#endif
