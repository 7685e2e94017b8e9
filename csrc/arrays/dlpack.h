/* The DLPack ABI (version 1.1: 1.0's structs, and the 8-bit float codes),
 * written from the specification at https://dmlc.github.io/dlpack/latest/c_api.html. Only the layout matters:
 * these structs cross library boundaries inside PyCapsules, so field order
 * and widths follow the spec exactly. */
#ifndef MG_DLPACK_H
#define MG_DLPACK_H

#include <stdint.h>

/* The newest ABI this file describes; consumers refuse a larger major. */
#define MG_DLPACK_MAJOR 1
#define MG_DLPACK_MINOR 1

/* Where a tensor's memory lives (subset used by mlirgpu; values fixed by the spec). */
typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,        /* pinned host memory */
    kDLROCM = 10,
    kDLCUDAManaged = 13,    /* cudaMallocManaged memory: usable as device memory */
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;      /* the CUDA ordinal for kDLCUDA */
} DLDevice;

/* Element kinds; a dtype is (code, bits, lanes). */
typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
    kDLFloat8_e4m3fn = 10,  /* DLPack 1.1: OCP 8-bit floats, 4 exponent bits (no infinities) */
    kDLFloat8_e5m2 = 12,    /* ... and 5 exponent bits (IEEE-like) */
} DLDataTypeCode;

typedef struct {
    uint8_t code;           /* a DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;         /* 1 for scalars; mlirgpu accepts nothing else */
} DLDataType;

typedef struct {
    void *data;             /* base pointer; the first element is at data + byte_offset */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;         /* ndim entries */
    int64_t *strides;       /* ndim entries, in elements; NULL means C-contiguous */
    uint64_t byte_offset;
} DLTensor;

/* The pre-1.0 managed tensor, carried in a capsule named "dltensor". */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;      /* the producer's bookkeeping */
    void (*deleter)(struct DLManagedTensor *self);  /* NULL when nothing to free */
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

/* Bits of DLManagedTensorVersioned.flags. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)

/* The 1.0 managed tensor, carried in a capsule named "dltensor_versioned".
 * The version comes first so a consumer can refuse an ABI it does not know. */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* DLPack 1.3's C exchange table. A producer's array type has the attribute
 * __dlpack_c_exchange_api__: a capsule named "dlpack_exchange_api" holding
 * a pointer to a table that lives as long as the process. A consumer checks
 * the major version; later minors may only append entries. mlirgpu calls
 * dltensor_from_py_object_no_sync, which fills a DLTensor the caller owns,
 * without allocating and without ordering any stream; its shape and strides
 * are the producer's and stay valid only until Python code runs again. The
 * entries mlirgpu does not call are declared as plain pointers: only their
 * places in the table matter here. */
typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api;   /* an older table of the producer's, or NULL */
} DLPackExchangeAPIHeader;

typedef struct {
    DLPackExchangeAPIHeader header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    /* 0 with `out` filled, or -1 with a Python exception set; may be NULL */
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    void *current_work_stream;
} DLPackExchangeAPI;

#define MG_DLPACK_EXCHANGE_NAME "dlpack_exchange_api"

/* Capsule names. A consumer renames the capsule to the "used_" form when it
 * takes ownership, after which it, not the capsule, calls the deleter. */
#define MG_DLPACK_NAME "dltensor"
#define MG_DLPACK_USED_NAME "used_dltensor"
#define MG_DLPACK_VERSIONED_NAME "dltensor_versioned"
#define MG_DLPACK_USED_VERSIONED_NAME "used_dltensor_versioned"

#endif
