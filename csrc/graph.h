/* CUDA graphs captured from a stream: mlirgpu.Graph, the C half of
 * `with mg.graph(stream) as g: ...; g.replay()` (python/mlirgpu/streams.py).
 * While a thread captures, the launches and asynchronous copies it makes
 * keep their kernels and arrays alive in the graph, and the memory it frees
 * is freed once the capture ended. */
#ifndef MG_GRAPH_H
#define MG_GRAPH_H

#include "module.h"
#include <stdint.h>

/* Adds mlirgpu.Graph (called from mg_cu_init: graphs belong to the CUDA area). */
int mg_graph_init(PyObject *module);

/* The innermost graph the calling thread is capturing into (strong), or NULL. */
extern _Thread_local PyObject *mg_graph_tls_capture;

/* 1 while the calling thread captures a graph: one thread-local load, all a
 * launch pays when it does not. */
static inline int mg_graph_capturing(void) { return mg_graph_tls_capture != NULL; }

/* Keeps `obj` alive as long as each graph the calling thread is capturing
 * into: 0, or -1 with MemoryError. */
int mg_graph_retain(PyObject *obj);

/* Puts off freeing `pointer` (device memory of `device`, or page-locked host
 * memory with `pinned`) until the calling thread's capture ends: during a
 * capture the driver refuses frees and invalidates the capture. 1 when put
 * off; 0 when the caller must free it now. Never raises. */
int mg_graph_defer_free(uintptr_t pointer, int device, int pinned);

#endif
