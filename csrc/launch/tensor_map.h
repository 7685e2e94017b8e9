/* mlirgpu.TensorMap (launch/tensor_map.c): what a kernel's TMA parameter
 * takes by value. */
#ifndef MG_LAUNCH_TENSOR_MAP_H
#define MG_LAUNCH_TENSOR_MAP_H

#include "base/state.h"
#include <cuda.h>

/* The 128 bytes a kernel takes by value (a grid-constant parameter) and the
 * array they address, kept alive as long as the map. The bytes are not
 * 64-byte aligned inside a Python object: the map is encoded into an aligned
 * local and copied, and a launch passes a pointer that the driver copies from. */
/* cuTensorMapEncodeTiled's arguments but the address: what a map of another
 * array of the same geometry is encoded from (mg_tensor_map_at). */
typedef struct {
    int data_type, rank, interleave, swizzle, l2_promotion, oob_fill;
    cuuint64_t dims[5], strides[5];
    cuuint32_t box[5], element_strides[5];
} mg_tensor_map_encoding;

typedef struct {
    PyObject_HEAD
    unsigned char map[sizeof(CUtensorMap)];
    mg_tensor_map_encoding encoding;
    CUdeviceptr address;
    PyObject *owner;      /* strong: what owns the memory at the map's address */
    PyObject *info;       /* strong: what the map was computed from (mlirgpu.tma) */
    char host;            /* made for the CPU backend (an mg_cpu_tensor_map, no CUtensorMap); read through T_BOOL */
} mg_tensor_map;

extern PyTypeObject *mg_cu_TensorMap_type;

/* A new GPU TensorMap of `map`'s encoding at `address`, owned by nothing
 * (a kept launch's map of a call's array, which the call holds): NULL with
 * CudaError set where the driver refuses it. */
PyObject *mg_tensor_map_at(PyObject *map, CUdeviceptr address);

/* Adds mlirgpu.TensorMap. */
int mg_tensor_map_init(PyObject *module);

#endif
