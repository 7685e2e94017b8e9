/* mlirgpu.cuda.Device and the mlirgpu.cuda functions (cuda/device.c). */
#ifndef MG_CUDA_DEVICE_H
#define MG_CUDA_DEVICE_H

#include "cuda/driver.h"

/* "O&" converter for device arguments: an int ordinal or an
 * mlirgpu.cuda.Device, checked to exist. */
int mg_cu_device_converter(PyObject *obj, int *out);

/* Adds Device and the mlirgpu.cuda functions, after Stream and Event
 * (cuda/stream.c). */
int mg_cu_init(PyObject *module);

#endif
