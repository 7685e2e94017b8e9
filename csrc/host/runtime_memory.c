/* The mgpu runtime's memory: device allocations, copies and sets, tensor
 * maps, and host memory registered for kernels or lent by the caller. */
#include "host/runtime.h"
#include "host/async_runtime.h"
#include "cuda/driver.h"
#include "host/runtime_shared.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
/* Memory                                                                    */

static int track_allocation(mg_rt_state *s, void *pointer, size_t bytes, int host)
{
    if (RESERVE(s, allocations) < 0)
        return -1;
    s->allocations[s->nallocations++] = (allocation){pointer, bytes, host};
    return 0;
}

/* Host code may read and write host_shared memory: where the managed
 * allocation failed it gets zeroed host memory of the size instead, mapped
 * lazily (so a huge size costs nothing until touched) and freed at the end. */
static void *stand_in(mg_rt_state *s, size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (track_allocation(s, p, bytes, 1) < 0) {
        munmap(p, bytes);
        return NULL;
    }
    return p;
}

void *mgpuMemAlloc(uint64_t bytes, void *stream, int8_t host_shared)
{
    mg_rt_state *s = mg_rt_current;
    if (s == NULL || bytes == 0)
        return NULL;
    if (!mg_rt_ready(s, "mgpuMemAlloc"))
        return host_shared ? stand_in(s, (size_t)bytes) : NULL;
    CUdeviceptr pointer;
    CUresult r = host_shared ? mg_cu.cuMemAllocManaged(&pointer, (size_t)bytes, CU_MEM_ATTACH_GLOBAL)
                             : mg_cu.cuMemAlloc(&pointer, (size_t)bytes);
    if (r != CUDA_SUCCESS) {
        fail(s, r, host_shared ? "mgpuMemAlloc: cuMemAllocManaged" : "mgpuMemAlloc: cuMemAlloc",
             "%llu bytes%s", (unsigned long long)bytes, host_shared ? " (host_shared)" : "");
        return host_shared ? stand_in(s, (size_t)bytes) : NULL;
    }
    if (track_allocation(s, (void *)(uintptr_t)pointer, (size_t)bytes, 0) < 0) {
        mg_cu.cuMemFree(pointer);
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mlirgpu runtime", "no host memory left to track an allocation");
        return host_shared ? stand_in(s, (size_t)bytes) : NULL;
    }
    return (void *)(uintptr_t)pointer;
}

allocation *mg_rt_find_allocation(const mg_rt_state *s, const void *pointer)
{
    for (size_t i = 0; i < s->nallocations; i++)
        if (s->allocations[i].pointer == pointer)
            return &s->allocations[i];
    return NULL;
}

void mg_rt_release(allocation *a)
{
    if (a->host)
        munmap(a->pointer, a->bytes);
    else
        mg_cu.cuMemFree((CUdeviceptr)(uintptr_t)a->pointer);
}

void mgpuMemFree(void *pointer, void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (pointer == NULL || !mg_rt_ready(s, "mgpuMemFree"))
        return; /* after a failure everything is freed by mg_rt_end */
    allocation *a = mg_rt_find_allocation(s, pointer);
    if (a == NULL) {
        fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuMemFree", "%p was not allocated by this call (freed twice, or "
             "memory the program does not own)", pointer);
        return;
    }
    allocation freed = *a;
    *a = s->allocations[--s->nallocations];
    if (mg_rt_track_handle(s, &s->freed, &s->nfreed, &s->cfreed, freed.pointer) < 0) {
        mg_rt_release(&freed);
        return;
    }
    if (freed.host) {
        mg_rt_release(&freed);
        return;
    }
    CUresult r = mg_cu.cuMemFree((CUdeviceptr)(uintptr_t)freed.pointer);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemFree: cuMemFree", "");
}

void mgpuMemcpy(void *dst, void *src, uint64_t bytes, void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (bytes == 0 || !mg_rt_ready(s, "mgpuMemcpy"))
        return;
    /* Unified addressing: the driver tells host from device pointers. */
    CUresult r = mg_cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, (size_t)bytes, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemcpy: cuMemcpyAsync", "%llu bytes from %p to %p", (unsigned long long)bytes, src, dst);
}

/* What nvgpu.tma.create.descriptor lowers to (MLIR's nvgpu-to-nvvm): a tensor
 * map of the ranked memref `descriptor` ({allocated, aligned, offset,
 * sizes[rank], strides[rank]}) with `box` (sizes in the memref's order),
 * encoded on the host and copied to device memory, whose address the
 * kernels take. `data_type` etc. are the CUtensorMap* enumerations. */
void *mgpuTensorMapEncodeTiledMemref(int64_t rank, void *descriptor, int64_t data_type, int64_t interleave,
                                            int64_t swizzle, int64_t l2_promotion, int64_t oob_fill,
                                            const int64_t *box)
{
    /* Bytes of each CUtensorMapDataType, in the enumeration's order. */
    static const int element_bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
    mg_rt_state *s = mg_rt_current;
    if (s == NULL || !mg_rt_ready(s, "mgpuTensorMapEncodeTiledMemref"))
        return NULL;
    if (rank < 1 || rank > 5 || data_type < 0 || data_type >= (int64_t)(sizeof element_bytes / sizeof *element_bytes)) {
        fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuTensorMapEncodeTiledMemref", "a rank-%lld memref of data type %lld",
             (long long)rank, (long long)data_type);
        return NULL;
    }
    char *aligned = ((char **)descriptor)[1];
    const int64_t *fields = (const int64_t *)((char **)descriptor + 2);   /* offset, sizes, strides */
    const int64_t offset = fields[0], *sizes = fields + 1, *strides = fields + 1 + rank;
    const int size = element_bytes[data_type];
    cuuint64_t dims[5], byte_strides[5] = {0};
    cuuint32_t box_dims[5], element_strides[5];
    for (int64_t r = 0; r < rank; r++) {   /* innermost first, as the driver takes them */
        dims[r] = (cuuint64_t)sizes[rank - 1 - r];
        box_dims[r] = (cuuint32_t)box[rank - 1 - r];
        element_strides[r] = 1;
    }
    for (int64_t r = 0; r + 1 < rank; r++)
        byte_strides[r] = (cuuint64_t)(strides[rank - 2 - r] * size);
    CUtensorMap map;
    CUresult r = mg_cu.cuTensorMapEncodeTiled(&map, (CUtensorMapDataType)data_type, (cuuint32_t)rank,
                                              aligned + offset * size, dims, byte_strides, box_dims, element_strides,
                                              (CUtensorMapInterleave)interleave, (CUtensorMapSwizzle)swizzle,
                                              (CUtensorMapL2promotion)l2_promotion, (CUtensorMapFloatOOBfill)oob_fill);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuTensorMapEncodeTiledMemref: cuTensorMapEncodeTiled", "a rank-%lld memref at %p",
             (long long)rank, (void *)aligned);
        return NULL;
    }
    void *device = mgpuMemAlloc(sizeof map, NULL, 0);
    if (device == NULL)
        return NULL;
    /* From pageable memory: the map is read before this returns. */
    r = mg_cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)device, &map, sizeof map, NULL);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuTensorMapEncodeTiledMemref: cuMemcpyHtoDAsync", "%zu bytes", sizeof map);
    return device;
}

void mgpuMemset32(void *dst, uint32_t value, uint64_t count, void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (count == 0 || !mg_rt_ready(s, "mgpuMemset32"))
        return;
    CUresult r = mg_cu.cuMemsetD32Async((CUdeviceptr)(uintptr_t)dst, value, (size_t)count, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemset32: cuMemsetD32Async", "%llu values at %p", (unsigned long long)count, dst);
}

void mgpuMemset16(void *dst, uint16_t value, uint64_t count, void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (count == 0 || !mg_rt_ready(s, "mgpuMemset16"))
        return;
    CUresult r = mg_cu.cuMemsetD16Async((CUdeviceptr)(uintptr_t)dst, value, (size_t)count, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemset16: cuMemsetD16Async", "%llu values at %p", (unsigned long long)count, dst);
}

/* ------------------------------------------------------------------------ */
/* Host memory for kernels: registration, lent arrays                        */

/* The bytes a memref descriptor {allocated, aligned, offset, sizes[rank],
 * strides[rank]} covers: its first element at *first, *bytes from there
 * (0 when it is empty); -1 when its strides are negative. */
static int memref_span(const int64_t *d, int64_t rank, int64_t element_bytes, char **first, size_t *bytes)
{
    int64_t last = 0;
    *first = (char *)(intptr_t)d[1] + d[2] * element_bytes;
    *bytes = 0;
    for (int64_t k = 0; k < rank; k++) {
        int64_t size = d[3 + k], stride = d[3 + rank + k];
        if (size == 0)
            return 0;
        if (stride < 0)
            return -1;
        last += (size - 1) * stride;
    }
    *bytes = (size_t)((last + 1) * element_bytes);
    return 0;
}

static host_range *find_range(mg_rt_state *s, const void *pointer, int lent)
{
    for (size_t i = 0; i < s->nranges; i++) {
        host_range *r = &s->ranges[i];
        const char *start = r->pointer;
        if ((r->original != NULL) == lent && (const char *)pointer >= start && (const char *)pointer < start + r->bytes)
            return r;
    }
    return NULL;
}

static int track_range(mg_rt_state *s, host_range range)
{
    if (RESERVE(s, ranges) < 0)
        return -1;
    s->ranges[s->nranges++] = range;
    return 0;
}

/* Registration is by pages, and the driver refuses a range that overlaps one
 * registered already: memory the program registers is rounded out to pages,
 * the pages no earlier registration of the call covers are registered
 * (`pinned`), and a pinned range is unregistered once no registered memory
 * of the program lies on its pages. Two small allocations sharing a page are
 * then registered and unregistered independently. */
static uintptr_t page_size(void)
{
    static uintptr_t size;
    if (size == 0) {
        long got = sysconf(_SC_PAGESIZE);
        size = got > 0 ? (uintptr_t)got : 4096;
    }
    return size;
}

static void page_span(const void *pointer, size_t bytes, uintptr_t *start, uintptr_t *end)
{
    uintptr_t page = page_size();
    *start = (uintptr_t)pointer / page * page;
    *end = ((uintptr_t)pointer + bytes + page - 1) / page * page;
}

/* The pinned range holding `at`, or NULL; else *next is where the next one starts (or `limit`). */
static pinned_range *pinned_at(mg_rt_state *s, uintptr_t at, uintptr_t limit, uintptr_t *next)
{
    *next = limit;
    for (size_t i = 0; i < s->npinned; i++) {
        pinned_range *p = &s->pinned[i];
        if (p->start <= at && at < p->end)
            return p;
        if (p->start > at && p->start < *next)
            *next = p->start;
    }
    return NULL;
}

static void register_range(mg_rt_state *s, const char *what, void *pointer, size_t bytes)
{
    if (bytes == 0 || find_range(s, pointer, 1) != NULL)
        return; /* an array lent to the call: device-accessible already */
    if (track_range(s, (host_range){pointer, bytes, NULL, 0}) < 0) {
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mlirgpu runtime", "no host memory left to track a registration");
        return;
    }
    uintptr_t at, end;
    page_span(pointer, bytes, &at, &end);
    while (at < end) {
        uintptr_t next;
        pinned_range *covered = pinned_at(s, at, end, &next);
        if (covered != NULL) {
            at = covered->end;
            continue;
        }
        CUresult r = mg_cu.cuMemHostRegister((void *)at, next - at,
                                             CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
        if (r == CUDA_SUCCESS) {
            if (RESERVE(s, pinned) < 0) {
                mg_cu.cuMemHostUnregister((void *)at);
                fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mlirgpu runtime", "no host memory left to track a registration");
                return;
            }
            s->pinned[s->npinned++] = (pinned_range){at, next};
        } else if (r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
            /* Page-locked outside the call (pinned host memory) is left as it
             * is; so is the driver's own memory (device, managed). */
            CUmemorytype type;
            if (mg_cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)at) != CUDA_SUCCESS) {
                fail(s, r, what, "%zu bytes at %p", bytes, pointer);
                return;
            }
        }
        at = next;
    }
}

/* Unregisters the pinned ranges no registered memory of the program lies on. */
static void release_pins(mg_rt_state *s, const char *what)
{
    for (size_t i = 0; i < s->npinned;) {
        pinned_range p = s->pinned[i];
        int used = 0;
        for (size_t j = 0; j < s->nranges && !used; j++) {
            uintptr_t start, end;
            page_span(s->ranges[j].pointer, s->ranges[j].bytes, &start, &end);
            used = s->ranges[j].original == NULL && start < p.end && p.start < end;
        }
        if (used) {
            i++;
            continue;
        }
        s->pinned[i] = s->pinned[--s->npinned];
        CUresult r = mg_cu.cuMemHostUnregister((void *)p.start);
        if (r != CUDA_SUCCESS)
            fail(s, r, what, "%p", (void *)p.start);
    }
}

static void unregister_range(mg_rt_state *s, const char *what, void *pointer)
{
    if (find_range(s, pointer, 1) != NULL)
        return;
    for (size_t i = 0; i < s->nranges; i++) {
        if (s->ranges[i].original != NULL || s->ranges[i].pointer != pointer)
            continue;
        s->ranges[i] = s->ranges[--s->nranges];
        release_pins(s, what);
        return;
    }
    fail(s, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, what, "%p was not registered by this call", pointer);
}

void mgpuMemHostRegister(void *pointer, uint64_t bytes)
{
    mg_rt_state *s = mg_rt_current;
    if (mg_rt_ready(s, "mgpuMemHostRegister"))
        register_range(s, "mgpuMemHostRegister: cuMemHostRegister", pointer, (size_t)bytes);
}

void mgpuMemHostUnregister(void *pointer)
{
    mg_rt_state *s = mg_rt_current;
    if (mg_rt_ready(s, "mgpuMemHostUnregister"))
        unregister_range(s, "mgpuMemHostUnregister: cuMemHostUnregister", pointer);
}

/* gpu.host_register of a memref (ranked, or unranked: the lowering passes
 * the rank and the ranked descriptor either way). */
void mgpuMemHostRegisterMemRef(int64_t rank, int64_t *descriptor, int64_t element_bytes)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuMemHostRegisterMemRef"))
        return;
    char *first;
    size_t bytes;
    if (memref_span(descriptor, rank, element_bytes, &first, &bytes) < 0) {
        fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuMemHostRegisterMemRef", "a memref with negative strides");
        return;
    }
    register_range(s, "mgpuMemHostRegisterMemRef: cuMemHostRegister", first, bytes);
}

void mgpuMemHostUnregisterMemRef(int64_t rank, int64_t *descriptor, int64_t element_bytes)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuMemHostUnregisterMemRef"))
        return;
    char *first;
    size_t bytes;
    if (memref_span(descriptor, rank, element_bytes, &first, &bytes) == 0 && bytes > 0)
        unregister_range(s, "mgpuMemHostUnregisterMemRef: cuMemHostUnregister", first);
}

void *mg_rt_lend(mg_rt_state *s, void *data, size_t bytes, int writable)
{
    if (!s->context_ready || s->failed || bytes == 0)
        return data;
    CUdeviceptr copy;
    CUresult r = mg_cu.cuMemAllocManaged(&copy, bytes, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "lending an array argument to the GPU: cuMemAllocManaged", "%zu bytes", bytes);
        return data;
    }
    if (track_range(s, (host_range){(void *)(uintptr_t)copy, bytes, data, writable}) < 0) {
        mg_cu.cuMemFree(copy);
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mlirgpu runtime", "no host memory left to lend an array");
        return data;
    }
    memcpy((void *)(uintptr_t)copy, data, bytes);
    s->used = 1;
    return (void *)(uintptr_t)copy;
}

/* ------------------------------------------------------------------------ */
