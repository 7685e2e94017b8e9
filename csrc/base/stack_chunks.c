/* Frame chunks kept for reuse (see stack_chunks.h). A thread frees its
 * chunks without the GIL when its state is deleted, so the kept ones sit in
 * atomic slots. */
#include "base/stack_chunks.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

/* CPython's DATA_STACK_CHUNK_SIZE (3.11 to 3.14): obmalloc's arenas, the
 * allocator's other blocks, are 256 KiB or 1 MiB. A larger frame chunk (for
 * a frame over 16 KiB) is rare and goes to the allocator. */
#define CHUNK_BYTES (16 * 1024)
#define KEPT_CHUNKS 4 /* a chunk's end crossed at up to 4 depths at once */

static PyObjectArenaAllocator wrapped;
static void *_Atomic kept[KEPT_CHUNKS];

static void *chunk_alloc(void *ctx, size_t size)
{
    if (size == CHUNK_BYTES)
        for (int i = 0; i < KEPT_CHUNKS; i++) {
            void *chunk = atomic_exchange(&kept[i], NULL);
            if (chunk != NULL)
                return chunk;
        }
    return wrapped.alloc(wrapped.ctx, size);
}

static void chunk_free(void *ctx, void *ptr, size_t size)
{
    if (size == CHUNK_BYTES)
        for (int i = 0; i < KEPT_CHUNKS; i++) {
            void *empty = NULL;
            if (atomic_compare_exchange_strong(&kept[i], &empty, ptr))
                return;
        }
    wrapped.free(wrapped.ctx, ptr, size);
}

void mg_stack_chunks_keep(void)
{
    /* Once: a second exec of the module (another interpreter) would wrap the wrapper. */
    static atomic_flag wrapping = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&wrapping))
        return;
    PyObject_GetArenaAllocator(&wrapped);
    PyObjectArenaAllocator keeping = {NULL, chunk_alloc, chunk_free};
    PyObject_SetArenaAllocator(&keeping);
}
