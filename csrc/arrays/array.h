/* Element types (mlirgpu.DType singletons) and device arrays
 * (mlirgpu.DeviceArray): allocation, host copies, and zero-copy exchange
 * through __cuda_array_interface__ (v3) and DLPack (1.x and legacy). */
#ifndef MG_ARRAY_H
#define MG_ARRAY_H

#include "base/state.h"
#include <cuda.h>
#include <stdint.h>

typedef enum {
    MG_DT_BOOL, MG_DT_I8, MG_DT_I16, MG_DT_I32, MG_DT_I64,
    MG_DT_U8, MG_DT_U16, MG_DT_U32, MG_DT_U64,
    MG_DT_F16, MG_DT_BF16, MG_DT_F32, MG_DT_F64, MG_DT_INDEX,
    MG_DT_F8E4M3, MG_DT_F8E5M2,
    MG_DT_COUNT
} mg_dtype_id;

/* One immutable singleton per id; compare pointers or ids. */
typedef struct {
    PyObject_HEAD
    mg_dtype_id id;
    const char *name;       /* the MLIR spelling: "f32", "index", "bool" for bool_ */
    int itemsize;           /* bytes */
    char kind;              /* NumPy kind: 'b', 'i', 'u', 'f' ('V' for bf16 and the 8-bit floats) */
    uint8_t dlpack_code;    /* a DLDataTypeCode */
    uint8_t bits;
    const char *typestr;    /* __cuda_array_interface__ typestr; NULL for bf16 and the 8-bit floats */
    int npy_type;           /* NumPy type number; -1 for the types of ml_dtypes */
    Py_hash_t hash;         /* cached; -1 until first asked */
} mg_dtype;

/* Borrowed singleton of `id`. */
mg_dtype *mg_dtype_get(mg_dtype_id id);

static inline int mg_dtype_itemsize(const mg_dtype *dt) { return dt->itemsize; }
static inline int mg_dtype_dlpack_code(const mg_dtype *dt) { return dt->dlpack_code; }
static inline const char *mg_dtype_typestr(const mg_dtype *dt) { return dt->typestr; }

/* "O&" converter: DType, numpy dtype, numpy scalar type, Python type or a
 * name ("f32", "float32", "bfloat16", "index"...) -> borrowed singleton.
 * ValueError for an unknown name, TypeError for anything else. */
int mg_dtype_converter(PyObject *obj, mg_dtype **out);

/* New reference to the numpy dtype of `dt` (ml_dtypes' for bf16 and the
 * 8-bit floats), or NULL with TypeError when ml_dtypes is missing. */
PyObject *mg_dtype_numpy(const mg_dtype *dt);

extern PyTypeObject *mg_DType_type;
extern PyTypeObject *mg_array_type;

#define MG_MAX_NDIM 8

typedef struct {
    PyObject_HEAD
    CUdeviceptr ptr;        /* the first element (a view's offset included) */
    int ndim;
    int device;             /* CUDA ordinal */
    int owns;               /* 1: ptr came from cuMemAlloc (or, when `host`, malloc) and is freed here */
    int host;               /* 1: host memory (the CPU backend); ptr is a host address, device -1 */
    int readonly;           /* 1: a read-only producer's memory (CAI data[1], DLPack's flag): never written */
    Py_ssize_t size;        /* elements */
    Py_ssize_t shape[MG_MAX_NDIM];
    Py_ssize_t strides[MG_MAX_NDIM];   /* bytes, like NumPy */
    mg_dtype *dtype;        /* strong ref */
    PyObject *owner;        /* strong ref keeping a view's memory alive, or NULL */
    void *dl_managed;       /* a consumed DLPack tensor whose deleter runs at dealloc */
    int dl_versioned;       /* which of the two DLPack structs dl_managed is */
    CUstream stream;        /* the stream the array was last used on (NULL: legacy default) */
    PyObject *stream_obj;   /* strong ref to the Python object owning `stream`, or NULL */
    PyObject *weakrefs;
} mg_array;

/* 1 when `obj` is exactly an mlirgpu.DeviceArray (the launch fast path). */
static inline int mg_array_check_exact(PyObject *obj) { return Py_IS_TYPE(obj, mg_array_type); }

/* 1 when `obj` is exactly an mlirgpu.DeviceArray in device memory: what a
 * CUDA launch may pass as a pointer. Host DeviceArrays (the CPU backend's)
 * take the foreign path, which reports them as host arrays. */
static inline int mg_array_check_device(PyObject *obj)
{
    return mg_array_check_exact(obj) && !((mg_array *)obj)->host;
}

/* Accessors; `obj` must pass mg_array_check_exact. */
static inline CUdeviceptr mg_array_ptr(PyObject *obj) { return ((mg_array *)obj)->ptr; }
static inline int mg_array_ndim(PyObject *obj) { return ((mg_array *)obj)->ndim; }
static inline const Py_ssize_t *mg_array_shape(PyObject *obj) { return ((mg_array *)obj)->shape; }
static inline const Py_ssize_t *mg_array_strides(PyObject *obj) { return ((mg_array *)obj)->strides; }
static inline mg_dtype *mg_array_dtype(PyObject *obj) { return ((mg_array *)obj)->dtype; }
int mg_array_is_c_contiguous(PyObject *obj);

/* Records that the array was used on `stream` (`stream_obj` may be NULL). */
void mg_array_set_stream(PyObject *obj, CUstream stream, PyObject *stream_obj);

/* What a launch needs to know of one array argument, read without building
 * a view where the producer is known: DeviceArray (from its struct), NumPy
 * arrays (host), PyTorch tensors (is_cuda, data_ptr(), dtype, shape,
 * is_contiguous(), get_device(): torch's __cuda_array_interface__ builds a
 * dict in Python), CuPy arrays (data.ptr, data.device_id, dtype, shape,
 * _c_contiguous, and CuPy's current stream, which its CAI names), any other
 * __cuda_array_interface__ (read from the dict, no view), and DLPack
 * objects (a view of the consumed capsule). */
typedef struct {
    CUdeviceptr ptr;          /* first element; a host address when `host` */
    mg_dtype *dtype;          /* borrowed singleton; NULL: a host array of a dtype mlirgpu lacks */
    int ndim;
    int device;               /* CUDA ordinal; -1 for host arrays, and where a pointer-only read did not need it */
    int contiguous;           /* C-contiguous (size-1 extents and empty arrays included) */
    int host;                 /* a NumPy array or CPU tensor: never passed as a pointer */
    int readonly;             /* the memory must not be written (a kernel storing to it is refused) */
    Py_ssize_t shape[MG_MAX_NDIM];
    Py_ssize_t strides[MG_MAX_NDIM];   /* bytes */
    PyObject *view;           /* strong: the DeviceArray view of a DLPack object, or NULL */
    int wait;                 /* 1: a launch's stream must first wait for `producer` */
    CUstream producer;        /* a CAI v3 `stream`; the legacy default stream for DLPack views */
} mg_foreign;

/* What the readers of one call learn once for all its arguments: CuPy's
 * current stream is the `stream` of every CuPy array's CAI in the call.
 * Zero it before the call's first argument. */
typedef struct {
    int cupy_stream_read;
    int cupy_wait;
    CUstream cupy_stream;
} mg_foreign_memo;

/* Fills `out` for a device or host array: 1; 0 when `obj` is no array
 * (it has neither __cuda_array_interface__ nor __dlpack__, and is not a
 * NumPy array or tensor), nothing set; -1 with the protocol's error
 * (a malformed CAI dict, a non-CUDA DLPack device...). A library reader
 * that meets something unexpected falls back to the protocols, so the
 * answer never depends on the fast path. On 1, release `out` with
 * mg_foreign_release once the pointer is no longer needed; the caller
 * holds `obj` (which keeps the memory alive) until then. */
int mg_array_foreign_info(PyObject *obj, mg_foreign *out, mg_foreign_memo *memo);

/* The same, but only ptr, host, view and wait/producer are filled (and
 * device, dtype and shape only where they come free): what a Function
 * launch needs. Neither orders any stream: the launch, which knows its
 * stream, waits for `producer` where `wait` is set. */
int mg_array_foreign_pointer(PyObject *obj, mg_foreign *out, mg_foreign_memo *memo);

/* mg_array_foreign_info (`full`) or mg_array_foreign_pointer (not `full`)
 * for an array of a type seen to be torch's, CuPy's or JAX's, read without
 * the checks other objects need; MG_NOT_LIBRARY for anything else (a
 * DeviceArray, a NumPy array or scalar, a Python scalar, an unknown type),
 * with nothing set and no Python code run. */
#define MG_NOT_LIBRARY (-2)
int mg_array_library_read(PyObject *obj, mg_foreign *out, int full, mg_foreign_memo *memo);

static inline void mg_foreign_release(mg_foreign *info) { Py_CLEAR(info->view); }

/* The dtype of a NumPy scalar: 1 with *out set, 0 when `obj` is not a NumPy
 * scalar or has no mlirgpu dtype (nothing set), never -1. */
int mg_dtype_of_scalar(PyObject *obj, mg_dtype **out);

/* mlirgpu.asarray: a DeviceArray for a DeviceArray (new ref to itself), a
 * __cuda_array_interface__ object or a CUDA DLPack object (zero-copy views).
 * TypeError for host arrays and anything else. (asarray(obj, host=True), the
 * CPU backend's, views host DLPack objects instead: see array.c.) With
 * `synchronize`, the producer orders its pending work before the legacy
 * default stream (DLPack's stream 1, a CAI v3 stream); without, it orders
 * nothing (DLPack's -1), for a caller that uses the view on the producer's
 * own current stream. */
PyObject *mg_array_asarray(PyObject *obj, int synchronize);

/* Adds DType, DeviceArray and the array functions. */
int mg_array_init(PyObject *module);

#endif
