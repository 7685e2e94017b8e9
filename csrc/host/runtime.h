/* mlirgpu's mgpu* runtime: the functions that host code lowered from the gpu
 * dialect (gpu-to-llvm, gpu.binary's translation) calls, over the driver
 * table of cuda.h. The ExecutionEngine registers them with runtime=True.
 *
 * JIT'd code cannot take exceptions, so each call of a host function runs
 * with an invocation state (thread-local while it runs): the first failure
 * is recorded there and every later runtime call of that invocation does
 * nothing harmful; the streams, events and memory the program made and left
 * are released when the call ends, and the failure is raised then.
 * docs/design/host_runtime.md has the rules. */
#ifndef MG_RUNTIME_H
#define MG_RUNTIME_H

#include "base/state.h"
#include <cuda.h>
#include <stddef.h>

/* The runtime function called `name`, or NULL. */
void *mg_rt_symbol(const char *name);

/* The names of the runtime's functions: a new tuple of str, or NULL. */
PyObject *mg_rt_names(void);

/* Registers with the async runtime (host/async_runtime.h) how it fails the
 * invocation running on the calling thread. Adds nothing to the module. */
int mg_rt_init(PyObject *module);

/* Kernel modules belong to the engine whose global constructors load them
 * (mgpuModuleLoad): between mg_rt_adopt_begin(engine) and mg_rt_adopt_end(),
 * around its initialization on this thread, each new module is recorded as
 * the engine's. mg_rt_release_modules(engine) unloads from every device and
 * frees those the engine's global destructors left (GIL held). */
void mg_rt_adopt_begin(const void *owner);
void mg_rt_adopt_end(void);
void mg_rt_release_modules(const void *owner);

/* What the driver's JIT reported (verbose info log) compiling the PTX of the
 * modules of `owner` loaded so far, joined by newlines: a new str ('' when
 * none was compiled from PTX), or NULL with an exception set. */
PyObject *mg_rt_compiler_log(const void *owner);

typedef struct mg_rt_state mg_rt_state;

/* Starts an invocation of the host function `function` (a string that
 * outlives the call, for messages) on the calling thread (GIL held): makes
 * the thread's primary context current, or remembers why it cannot be (the
 * first runtime call then fails with that). With `timeline`, every launch is
 * timed with a pair of events. NULL with MemoryError set. */
mg_rt_state *mg_rt_begin(const char *function, int timeline);

/* Lends `bytes` of host memory at `data` (a NumPy argument) to the call:
 * the pointer kernels and host code should use instead, a managed copy
 * copied back to `data` at the end of a call that did not fail when
 * `writable`. Without a context, or after a failure, `data` itself. */
void *mg_rt_lend(mg_rt_state *state, void *data, size_t bytes, int writable);

/* After the JIT'd function returned, without the GIL: waits for the device
 * work the invocation queued (a failure there is recorded). */
void mg_rt_synchronize(mg_rt_state *state);

/* 1 when a runtime call of the invocation failed (its results are garbage). */
int mg_rt_failed(const mg_rt_state *state);

enum { MG_RT_NOT_OURS, MG_RT_DEVICE, MG_RT_HOST, MG_RT_FREED };

/* Whether `pointer` is memory the invocation allocated and still holds:
 * MG_RT_DEVICE (cuMemAlloc, cuMemAllocManaged: copy it with the driver) or
 * MG_RT_HOST (a stand-in for a failed host_shared allocation), freed by
 * mg_rt_end, never by the caller; or MG_RT_FREED, memory the program
 * allocated and already freed. */
int mg_rt_memory(const mg_rt_state *state, const void *pointer);

/* Ends the invocation (GIL held): appends its launches to `timeline` (a
 * list, or NULL), frees the memory and destroys the streams and events it
 * left, frees `state`. 0, or -1 with the recorded failure raised
 * (CudaError). */
int mg_rt_end(mg_rt_state *state, PyObject *timeline);

#endif
