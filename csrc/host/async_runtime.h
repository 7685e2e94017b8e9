/* The functions of MLIR's async runtime (mlirAsyncRuntime*) that code
 * lowered from the async dialect calls (convert-async-to-llvm): tokens,
 * values, groups and the execution of coroutines. Written here so that host
 * programs using async.execute need no MLIR library at run time. Every
 * region runs on the calling thread, as soon as what it awaits is ready:
 * inside the invocation of the host function, whose GPU runtime calls it
 * makes (the GPU work of independent regions still overlaps, on their own
 * streams). The ExecutionEngine registers them with runtime=True. */
#ifndef MG_ASYNC_RUNTIME_H
#define MG_ASYNC_RUNTIME_H

#include <cuda.h>

/* How the async runtime reports a failure to the invocation that runs it: a
 * callback, since the mgpu runtime (host/runtime.c), which owns the
 * invocation's error, calls into this file and so sits above it. */
typedef struct {
    void (*fail)(CUresult code, const char *what, const char *detail);
} mg_async_hooks;

/* Called once by host/runtime.c at init; the table is copied. */
void mg_async_register_hooks(const mg_async_hooks *hooks);

/* The async runtime function called `name`, or NULL. */
void *mg_async_symbol(const char *name);

/* Frees the tokens, values and groups the calling thread's invocation left
 * (reference counting gone wrong, a coroutine that never resumed). */
void mg_async_release_all(void);

#endif
