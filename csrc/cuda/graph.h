/* CUDA graphs captured from a stream: mlirgpu.Graph, the C half of
 * `with mg.graph(stream) as g: ...; g.replay()` (python/mlirgpu/streams.py).
 * While a thread captures, the launches and asynchronous copies it makes
 * keep their kernels and arrays alive in the graph, and the memory it frees
 * is freed once the capture ended. */
#ifndef MG_GRAPH_H
#define MG_GRAPH_H

#include "base/state.h"
#include <cuda.h>
#include <stdint.h>

/* Adds mlirgpu.Graph. */
int mg_graph_init(PyObject *module);

/* What a graph asks of the layers above cuda/: a callback table, since
 * graphs sit below the arrays they keep alive. */
typedef struct {
    /* After a replay on `stream` (owned by `stream_obj`, may be NULL), for
     * each object the graph retained: arrays/ records the stream on its
     * device arrays, so later host copies and exports order themselves
     * after the replay. */
    void (*replayed)(PyObject *retained, CUstream stream, PyObject *stream_obj);
} mg_graph_hooks;

/* Called once by arrays/ at init; the table is copied. */
void mg_graph_register_hooks(const mg_graph_hooks *hooks);

/* The innermost graph the calling thread is capturing into (strong), or NULL. */
extern _Thread_local PyObject *mg_graph_tls_capture;

/* 1 while the calling thread captures a graph: one thread-local load, all a
 * launch pays when it does not. */
static inline int mg_graph_capturing(void) { return mg_graph_tls_capture != NULL; }

/* Keeps `obj` alive as long as each graph the calling thread is capturing
 * into: 0, or -1 with MemoryError. */
int mg_graph_retain(PyObject *obj);

/* Frees device memory of `device` from a destructor: never raises, does
 * nothing once the driver is gone. While this thread captures a graph the
 * free waits for the capture's end. */
void mg_cu_free_quietly(CUdeviceptr pointer, int device);

/* The same for page-locked host memory from cuMemHostAlloc. */
void mg_cu_free_host_quietly(void *pointer, int device);

/* Puts off freeing `pointer` (device memory of `device`, or page-locked host
 * memory with `pinned`) until the calling thread's capture ends: during a
 * capture the driver refuses frees and invalidates the capture. 1 when put
 * off; 0 when the caller must free it now. Never raises. */
int mg_graph_defer_free(uintptr_t pointer, int device, int pinned);

#endif
