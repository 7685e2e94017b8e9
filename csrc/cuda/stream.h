/* mlirgpu.Stream and mlirgpu.Event (cuda/stream.c), and how a stream=
 * argument of any library becomes a CUstream. */
#ifndef MG_CUDA_STREAM_H
#define MG_CUDA_STREAM_H

#include "cuda/driver.h"

/* "O&" converter for stream= arguments: None (legacy default stream, 0),
 * mlirgpu.Stream, an int handle (0 and 1 both mean the legacy default
 * stream, 2 the per-thread one), an object with __cuda_stream__()
 * (-> (0, handle)) or a `cuda_stream` attribute (torch), or a CuPy stream
 * (class name ending in "Stream" with an int `ptr`). */
int mg_cu_stream_converter(PyObject *obj, CUstream *out);

/* The device of an mlirgpu.Stream, else (any other stream object, or the
 * legacy default stream) the calling thread's device. */
int mg_cu_stream_device(PyObject *obj);

/* The Python type of mlirgpu.Stream (a strong ref held for the life of the process). */
extern PyTypeObject *mg_cu_Stream_type;

/* Adds Stream, Event and mlirgpu.default_stream. */
int mg_cu_stream_init(PyObject *module);

#endif
