/* mlirgpu's mgpu* runtime (see runtime.h and docs/host_programs.md).
 *
 * The signatures are those MLIR 22's lowering declares (gpu-to-llvm for
 * streams, events, memory; gpu.binary's translation for modules and
 * launches). Every function but the module ones runs inside an invocation:
 * the JIT'd code called from ExecutionEngine.invoke, without the GIL, on the
 * thread whose primary context mg_rt_begin made current. None may call
 * Python. Kernel images are loaded lazily, at a program's first
 * mgpuModuleGetFunction, so that global constructors need no driver: an
 * engine can be built, and pure host functions run, without a GPU. */
#include "runtime.h"
#include "driver.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { FAILED_NOT, FAILED_DRIVER, FAILED_NO_CONTEXT };

typedef struct {
    void *pointer;
    size_t bytes;
    int host; /* a stand-in mapping, not driver memory */
} allocation;

typedef struct {
    CUfunction function;
    const char *name; /* the JIT'd module's constant: lives as long as the engine */
} kernel;

typedef struct {
    const char *name;
    CUstream stream;
    CUevent start, end;
} launch;

struct mg_rt_state {
    int device;
    int context_ready;
    PyObject *no_context[3]; /* the exception mg_cu_ensure_context raised */
    int failed;
    CUresult code;
    char what[160], detail[1024];
    int used;                /* driver work was queued: synchronize at the end */
    int timeline;
    allocation *allocations;
    size_t nallocations, callocations;
    void **freed;            /* what mgpuMemFree released, to tell a result that points there */
    size_t nfreed, cfreed;
    CUstream *streams;
    size_t nstreams, cstreams;
    CUevent *events;
    size_t nevents, cevents;
    kernel *kernels;
    size_t nkernels, ckernels;
    launch *launches;
    size_t nlaunches, claunches;
};

/* The invocation running on this thread. */
static _Thread_local mg_rt_state *current;

/* ------------------------------------------------------------------------ */
/* Failures and bookkeeping                                                  */

static void fail(mg_rt_state *s, CUresult code, const char *what, const char *format, ...)
{
    if (s->failed)
        return;
    s->failed = FAILED_DRIVER;
    s->code = code;
    snprintf(s->what, sizeof s->what, "%s", what);
    va_list args;
    va_start(args, format);
    vsnprintf(s->detail, sizeof s->detail, format, args);
    va_end(args);
}

/* 1 when the call may use the driver: inside an invocation, nothing failed
 * yet, and the context is current (else that failure is recorded). */
static int ready(mg_rt_state *s, const char *what)
{
    if (s == NULL || s->failed)
        return 0;
    if (!s->context_ready) {
        s->failed = FAILED_NO_CONTEXT;
        snprintf(s->what, sizeof s->what, "%s", what);
        return 0;
    }
    s->used = 1;
    return 1;
}

/* Makes room for one more item in a growable array; -1 when out of memory. */
static int reserve(void **items, size_t *capacity, size_t count, size_t size)
{
    if (count < *capacity)
        return 0;
    size_t n = *capacity ? 2 * *capacity : 8;
    void *grown = realloc(*items, n * size);
    if (grown == NULL)
        return -1;
    *items = grown;
    *capacity = n;
    return 0;
}

#define RESERVE(s, field) \
    reserve((void **)&(s)->field, &(s)->c##field, (s)->n##field, sizeof *(s)->field)

static int track_handle(mg_rt_state *s, void ***items, size_t *count, size_t *capacity, void *handle)
{
    if (reserve((void **)items, capacity, *count, sizeof **items) < 0) {
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mlirgpu runtime", "no host memory left to track a stream or event");
        return -1;
    }
    (*items)[(*count)++] = handle;
    return 0;
}

/* Removes `handle` from the array; 0 if it was not there. */
static int untrack_handle(void **items, size_t *count, void *handle)
{
    for (size_t i = 0; i < *count; i++)
        if (items[i] == handle) {
            items[i] = items[--*count];
            return 1;
        }
    return 0;
}

static const char *kernel_name(mg_rt_state *s, CUfunction function)
{
    for (size_t i = 0; i < s->nkernels; i++)
        if (s->kernels[i].function == function)
            return s->kernels[i].name;
    return "?";
}

/* ------------------------------------------------------------------------ */
/* Modules and launches                                                      */

typedef struct module {
    const void *image; /* the JIT'd module's constant: lives as long as the engine */
    size_t size;
    int ptx;           /* mgpuModuleLoadJIT: PTX text for the driver's JIT */
    int opt_level;
    CUmodule handles[MG_CU_MAX_DEVICES]; /* loaded lazily, per device */
    const void *owner; /* the engine whose constructors made it */
    struct module *next;
} module;

/* Loads of one image on two threads would race, and the list of live
 * modules is shared: one lock for all. */
static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;
static module *modules;
/* The engine whose global constructors are running on this thread. */
static _Thread_local const void *adopting;

void mg_rt_adopt_begin(const void *owner) { adopting = owner; }
void mg_rt_adopt_end(void) { adopting = NULL; }

static void *new_module(const void *image, size_t size, int ptx, int opt_level)
{
    module *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    *m = (module){.image = image, .size = size, .ptx = ptx, .opt_level = opt_level, .owner = adopting};
    pthread_mutex_lock(&module_lock);
    m->next = modules;
    modules = m;
    pthread_mutex_unlock(&module_lock);
    return m;
}

static void *mgpuModuleLoad(void *image, uint64_t size)
{
    return new_module(image, (size_t)size, 0, 0);
}

static void *mgpuModuleLoadJIT(void *ptx, int32_t opt_level)
{
    return new_module(ptx, strlen(ptx) + 1, 1, opt_level);
}

/* Unloads `m` from every device it was loaded on and frees it (GIL held). */
static void release_module(module *m)
{
    for (int d = 0; d < MG_CU_MAX_DEVICES; d++) {
        if (m->handles[d] == NULL)
            continue;
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        int pushed;
        /* Nothing to report to: at exit the driver may be gone. */
        if (mg_cu_push(d, &pushed) == 0) {
            mg_cu.cuModuleUnload(m->handles[d]);
            mg_cu_pop(pushed);
        }
        PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    free(m);
}

/* Takes `m` off the list of live modules; 0 if it was not there. */
static int unlist(module *m)
{
    for (module **p = &modules; *p != NULL; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            return 1;
        }
    return 0;
}

/* From an engine's global destructors (engines made with the runtime are
 * never torn down by LLVM, see mg_rt_release_modules, but a module's
 * destructor may still run): a module already released is not touched. */
static void mgpuModuleUnload(void *handle)
{
    module *m = handle;
    pthread_mutex_lock(&module_lock);
    int listed = m != NULL && unlist(m);
    pthread_mutex_unlock(&module_lock);
    if (listed)
        release_module(m);
}

void mg_rt_release_modules(const void *owner)
{
    module *mine = NULL;
    pthread_mutex_lock(&module_lock);
    for (module **p = &modules; *p != NULL;) {
        module *m = *p;
        if (m->owner == owner) {
            *p = m->next;
            m->next = mine;
            mine = m;
        } else {
            p = &m->next;
        }
    }
    pthread_mutex_unlock(&module_lock);
    while (mine != NULL) {
        module *next = mine->next;
        release_module(mine);
        mine = next;
    }
}

static CUmodule load_module(mg_rt_state *s, module *m)
{
    pthread_mutex_lock(&module_lock);
    CUmodule handle = m->handles[s->device];
    if (handle == NULL) {
        CUresult r;
        if (m->ptx) {
            char log[768] = "";
            CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                      CU_JIT_OPTIMIZATION_LEVEL};
            void *values[] = {log, (void *)(uintptr_t)sizeof log,
                              (void *)(uintptr_t)(m->opt_level < 0 ? 0 : m->opt_level > 4 ? 4 : m->opt_level)};
            r = mg_cu.cuModuleLoadDataEx(&handle, m->image, 3, options, values);
            if (r != CUDA_SUCCESS)
                fail(s, r, "mgpuModuleLoadJIT: cuModuleLoadDataEx", "loading the kernels' PTX: %s", log);
        } else {
            r = mg_cu.cuModuleLoadData(&handle, m->image);
            if (r != CUDA_SUCCESS)
                fail(s, r, "mgpuModuleLoad: cuModuleLoadData", "loading the kernels' cubin (%zu bytes)", m->size);
        }
        if (r != CUDA_SUCCESS)
            handle = NULL;
        m->handles[s->device] = handle;
    }
    pthread_mutex_unlock(&module_lock);
    return handle;
}

static void *mgpuModuleGetFunction(void *handle, const char *name)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuModuleGetFunction"))
        return NULL;
    module *m = handle;
    if (m == NULL) {
        fail(s, CUDA_ERROR_INVALID_HANDLE, "mgpuModuleGetFunction", "kernel '%s': its module was not made "
             "(no host memory at engine creation)", name);
        return NULL;
    }
    CUmodule loaded = load_module(s, m);
    if (loaded == NULL)
        return NULL;
    CUfunction function;
    CUresult r = mg_cu.cuModuleGetFunction(&function, loaded, name);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuModuleGetFunction: cuModuleGetFunction", "kernel '%s'", name);
        return NULL;
    }
    for (size_t i = 0; i < s->nkernels; i++)
        if (s->kernels[i].function == function)
            return function;
    if (RESERVE(s, kernels) == 0)
        s->kernels[s->nkernels++] = (kernel){function, name};
    return function;
}

static CUevent timing_event(mg_rt_state *s, CUstream stream, const char *name)
{
    CUevent event;
    CUresult r = mg_cu.cuEventCreate(&event, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS && (r = mg_cu.cuEventRecord(event, stream)) != CUDA_SUCCESS)
        mg_cu.cuEventDestroy(event);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuLaunchKernel: timing it with cuEventCreate/cuEventRecord", "kernel '%s'", name);
        return NULL;
    }
    return event;
}

static void mgpuLaunchKernel(void *function, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by,
                             int64_t bz, int32_t shared_bytes, void *stream, void **params, void **extra,
                             int64_t nparams)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuLaunchKernel"))
        return;
    const char *name = kernel_name(s, function);
    char config[256];
    snprintf(config, sizeof config, "kernel '%s' grid=(%lld, %lld, %lld) block=(%lld, %lld, %lld) shared_mem=%d",
             name, (long long)gx, (long long)gy, (long long)gz, (long long)bx, (long long)by, (long long)bz,
             (int)shared_bytes);
    int64_t dims[6] = {gx, gy, gz, bx, by, bz};
    for (int i = 0; i < 6; i++)
        if (dims[i] < 1 || dims[i] > UINT32_MAX) {
            fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuLaunchKernel", "%s: a dimension is out of range", config);
            return;
        }
    if (shared_bytes < 0 || function == NULL) {
        fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuLaunchKernel", "%s: %s", config,
             function == NULL ? "no function" : "negative shared memory");
        return;
    }
    launch timed = {name, stream, NULL, NULL};
    if (s->timeline && (RESERVE(s, launches) < 0 || (timed.start = timing_event(s, stream, name)) == NULL)) {
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mgpuLaunchKernel", "%s: no host memory left for its timeline", config);
        return;
    }
    CUresult r = mg_cu.cuLaunchKernel(function, (unsigned)gx, (unsigned)gy, (unsigned)gz, (unsigned)bx,
                                      (unsigned)by, (unsigned)bz, (unsigned)shared_bytes, stream, params, extra);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuLaunchKernel: cuLaunchKernel", "%s", config);
        if (timed.start != NULL)
            mg_cu.cuEventDestroy(timed.start);
        return;
    }
    if (s->timeline) {
        if ((timed.end = timing_event(s, stream, name)) == NULL) {
            mg_cu.cuEventDestroy(timed.start);
            return;
        }
        s->launches[s->nlaunches++] = timed;
    }
}

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

static void *mgpuStreamCreate(void)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuStreamCreate"))
        return NULL;
    CUstream stream;
    /* Non-blocking, as MLIR's own runtime makes them: no implicit order with
     * the legacy default stream. */
    CUresult r = mg_cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuStreamCreate: cuStreamCreate", "");
        return NULL;
    }
    if (track_handle(s, (void ***)&s->streams, &s->nstreams, &s->cstreams, stream) < 0) {
        mg_cu.cuStreamDestroy(stream);
        return NULL;
    }
    return stream;
}

static void mgpuStreamDestroy(void *stream)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuStreamDestroy"))
        return; /* left to mg_rt_end */
    if (!untrack_handle((void **)s->streams, &s->nstreams, stream)) {
        fail(s, CUDA_ERROR_INVALID_HANDLE, "mgpuStreamDestroy", "stream %p was not made by this call", stream);
        return;
    }
    CUresult r = mg_cu.cuStreamDestroy(stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuStreamDestroy: cuStreamDestroy", "");
}

static void mgpuStreamSynchronize(void *stream)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuStreamSynchronize"))
        return;
    CUresult r = mg_cu.cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuStreamSynchronize: cuStreamSynchronize", "");
}

static void mgpuStreamWaitEvent(void *stream, void *event)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuStreamWaitEvent"))
        return;
    CUresult r = mg_cu.cuStreamWaitEvent(stream, event, 0);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuStreamWaitEvent: cuStreamWaitEvent", "");
}

static void *mgpuEventCreate(void)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuEventCreate"))
        return NULL;
    CUevent event;
    CUresult r = mg_cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuEventCreate: cuEventCreate", "");
        return NULL;
    }
    if (track_handle(s, (void ***)&s->events, &s->nevents, &s->cevents, event) < 0) {
        mg_cu.cuEventDestroy(event);
        return NULL;
    }
    return event;
}

static void mgpuEventDestroy(void *event)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuEventDestroy"))
        return;
    if (!untrack_handle((void **)s->events, &s->nevents, event)) {
        fail(s, CUDA_ERROR_INVALID_HANDLE, "mgpuEventDestroy", "event %p was not made by this call", event);
        return;
    }
    CUresult r = mg_cu.cuEventDestroy(event);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuEventDestroy: cuEventDestroy", "");
}

static void mgpuEventRecord(void *event, void *stream)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuEventRecord"))
        return;
    CUresult r = mg_cu.cuEventRecord(event, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuEventRecord: cuEventRecord", "");
}

static void mgpuEventSynchronize(void *event)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuEventSynchronize"))
        return;
    CUresult r = mg_cu.cuEventSynchronize(event);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuEventSynchronize: cuEventSynchronize", "");
}

/* ------------------------------------------------------------------------ */
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

static void *mgpuMemAlloc(uint64_t bytes, void *stream, int8_t host_shared)
{
    mg_rt_state *s = current;
    if (s == NULL || bytes == 0)
        return NULL;
    if (!ready(s, "mgpuMemAlloc"))
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

static allocation *find_allocation(const mg_rt_state *s, const void *pointer)
{
    for (size_t i = 0; i < s->nallocations; i++)
        if (s->allocations[i].pointer == pointer)
            return &s->allocations[i];
    return NULL;
}

static void release(allocation *a)
{
    if (a->host)
        munmap(a->pointer, a->bytes);
    else
        mg_cu.cuMemFree((CUdeviceptr)(uintptr_t)a->pointer);
}

static void mgpuMemFree(void *pointer, void *stream)
{
    mg_rt_state *s = current;
    if (pointer == NULL || !ready(s, "mgpuMemFree"))
        return; /* after a failure everything is freed by mg_rt_end */
    allocation *a = find_allocation(s, pointer);
    if (a == NULL) {
        fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuMemFree", "%p was not allocated by this call (freed twice, or "
             "memory the program does not own)", pointer);
        return;
    }
    allocation freed = *a;
    *a = s->allocations[--s->nallocations];
    if (track_handle(s, &s->freed, &s->nfreed, &s->cfreed, freed.pointer) < 0) {
        release(&freed);
        return;
    }
    if (freed.host) {
        release(&freed);
        return;
    }
    CUresult r = mg_cu.cuMemFree((CUdeviceptr)(uintptr_t)freed.pointer);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemFree: cuMemFree", "");
}

static void mgpuMemcpy(void *dst, void *src, uint64_t bytes, void *stream)
{
    mg_rt_state *s = current;
    if (bytes == 0 || !ready(s, "mgpuMemcpy"))
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
static void *mgpuTensorMapEncodeTiledMemref(int64_t rank, void *descriptor, int64_t data_type, int64_t interleave,
                                            int64_t swizzle, int64_t l2_promotion, int64_t oob_fill,
                                            const int64_t *box)
{
    /* Bytes of each CUtensorMapDataType, in the enumeration's order. */
    static const int element_bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
    mg_rt_state *s = current;
    if (s == NULL || !ready(s, "mgpuTensorMapEncodeTiledMemref"))
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

static void mgpuMemset32(void *dst, uint32_t value, uint64_t count, void *stream)
{
    mg_rt_state *s = current;
    if (count == 0 || !ready(s, "mgpuMemset32"))
        return;
    CUresult r = mg_cu.cuMemsetD32Async((CUdeviceptr)(uintptr_t)dst, value, (size_t)count, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemset32: cuMemsetD32Async", "%llu values at %p", (unsigned long long)count, dst);
}

static void mgpuMemset16(void *dst, uint16_t value, uint64_t count, void *stream)
{
    mg_rt_state *s = current;
    if (count == 0 || !ready(s, "mgpuMemset16"))
        return;
    CUresult r = mg_cu.cuMemsetD16Async((CUdeviceptr)(uintptr_t)dst, value, (size_t)count, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuMemset16: cuMemsetD16Async", "%llu values at %p", (unsigned long long)count, dst);
}

/* ------------------------------------------------------------------------ */
/* The symbol table                                                          */

static const struct {
    const char *name;
    void *address;
} symbols[] = {
    {"mgpuModuleLoad", (void *)mgpuModuleLoad},
    {"mgpuModuleLoadJIT", (void *)mgpuModuleLoadJIT},
    {"mgpuModuleUnload", (void *)mgpuModuleUnload},
    {"mgpuModuleGetFunction", (void *)mgpuModuleGetFunction},
    {"mgpuLaunchKernel", (void *)mgpuLaunchKernel},
    {"mgpuStreamCreate", (void *)mgpuStreamCreate},
    {"mgpuStreamDestroy", (void *)mgpuStreamDestroy},
    {"mgpuStreamSynchronize", (void *)mgpuStreamSynchronize},
    {"mgpuStreamWaitEvent", (void *)mgpuStreamWaitEvent},
    {"mgpuEventCreate", (void *)mgpuEventCreate},
    {"mgpuEventDestroy", (void *)mgpuEventDestroy},
    {"mgpuEventRecord", (void *)mgpuEventRecord},
    {"mgpuEventSynchronize", (void *)mgpuEventSynchronize},
    {"mgpuMemAlloc", (void *)mgpuMemAlloc},
    {"mgpuMemFree", (void *)mgpuMemFree},
    {"mgpuMemcpy", (void *)mgpuMemcpy},
    {"mgpuMemset32", (void *)mgpuMemset32},
    {"mgpuMemset16", (void *)mgpuMemset16},
    {"mgpuTensorMapEncodeTiledMemref", (void *)mgpuTensorMapEncodeTiledMemref},
};

void *mg_rt_symbol(const char *name)
{
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++)
        if (strcmp(symbols[i].name, name) == 0)
            return symbols[i].address;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Invocations                                                               */

mg_rt_state *mg_rt_begin(int timeline)
{
    mg_rt_state *s = calloc(1, sizeof *s);
    if (s == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    s->timeline = timeline;
    if (mg_cu_ensure_context() == 0) {
        s->context_ready = 1;
        s->device = mg_cu_current_device();
    } else {
        PyErr_Fetch(&s->no_context[0], &s->no_context[1], &s->no_context[2]);
    }
    current = s;
    return s;
}

void mg_rt_synchronize(mg_rt_state *s)
{
    if (!s->used)
        return;
    CUresult r = mg_cu.cuCtxSynchronize();
    if (r != CUDA_SUCCESS)
        fail(s, r, "cuCtxSynchronize", "waiting for the program's GPU work at the end of the call");
}

int mg_rt_failed(const mg_rt_state *s)
{
    return s->failed != FAILED_NOT;
}

int mg_rt_memory(const mg_rt_state *s, const void *pointer)
{
    allocation *a = find_allocation(s, pointer);
    if (a != NULL)
        return a->host ? MG_RT_HOST : MG_RT_DEVICE;
    for (size_t i = 0; i < s->nfreed; i++)
        if (s->freed[i] == pointer)
            return MG_RT_FREED;
    return MG_RT_NOT_OURS;
}

/* Appends (kernel, stream, start_ms, end_ms) per launch, in ms from the
 * earliest start. */
static int fill_timeline(mg_rt_state *s, PyObject *timeline)
{
    double *ms = malloc(2 * s->nlaunches * sizeof *ms);
    if (ms == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    double earliest = 0.0;
    for (size_t i = 0; i < s->nlaunches; i++) {
        float start, end;
        CUresult r = mg_cu.cuEventElapsedTime(&start, s->launches[0].start, s->launches[i].start);
        if (r == CUDA_SUCCESS)
            r = mg_cu.cuEventElapsedTime(&end, s->launches[0].start, s->launches[i].end);
        if (r != CUDA_SUCCESS) {
            free(ms);
            fail(s, r, "cuEventElapsedTime", "timing kernel '%s'", s->launches[i].name);
            return 0;
        }
        ms[2 * i] = start;
        ms[2 * i + 1] = end;
        earliest = i == 0 || start < earliest ? start : earliest;
    }
    int status = 0;
    for (size_t i = 0; i < s->nlaunches && status == 0; i++) {
        PyObject *item = Py_BuildValue("(sKdd)", s->launches[i].name,
                                       (unsigned long long)(uintptr_t)s->launches[i].stream,
                                       ms[2 * i] - earliest, ms[2 * i + 1] - earliest);
        status = item == NULL ? -1 : PyList_Append(timeline, item);
        Py_XDECREF(item);
    }
    free(ms);
    return status;
}

int mg_rt_end(mg_rt_state *s, PyObject *timeline)
{
    int status = 0;
    if (timeline != NULL && !s->failed && s->nlaunches > 0)
        status = fill_timeline(s, timeline);
    /* What the program left, and what failed before it could free: every
     * call's resources end with the call. */
    for (size_t i = 0; i < s->nlaunches; i++) {
        mg_cu.cuEventDestroy(s->launches[i].start);
        mg_cu.cuEventDestroy(s->launches[i].end);
    }
    for (size_t i = 0; i < s->nallocations; i++)
        release(&s->allocations[i]);
    for (size_t i = 0; i < s->nevents; i++)
        mg_cu.cuEventDestroy(s->events[i]);
    for (size_t i = 0; i < s->nstreams; i++)
        mg_cu.cuStreamDestroy(s->streams[i]);
    current = NULL;
    if (status == 0 && s->failed == FAILED_NO_CONTEXT) {
        PyErr_Restore(s->no_context[0], s->no_context[1], s->no_context[2]);
        s->no_context[0] = s->no_context[1] = s->no_context[2] = NULL;
        status = -1;
    } else if (status == 0 && s->failed == FAILED_DRIVER) {
        status = mg_cu_raise(s->code, s->what, s->detail);
    }
    for (int i = 0; i < 3; i++)
        Py_XDECREF(s->no_context[i]);
    free(s->allocations);
    free(s->freed);
    free(s->streams);
    free(s->events);
    free(s->kernels);
    free(s->launches);
    free(s);
    return status;
}
