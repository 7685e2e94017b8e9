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
typedef struct {
    PyObject_HEAD
    unsigned char map[sizeof(CUtensorMap)];
    PyObject *owner;      /* strong: what owns the memory at the map's address */
    PyObject *info;       /* strong: what the map was computed from (mlirgpu.tma) */
    char host;            /* made for the CPU backend (an mg_cpu_tensor_map, no CUtensorMap); read through T_BOOL */
} mg_tensor_map;

extern PyTypeObject *mg_cu_TensorMap_type;

/* Adds mlirgpu.TensorMap. */
int mg_tensor_map_init(PyObject *module);

#endif
