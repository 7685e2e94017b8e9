/* What the files of the mgpu runtime share with each other (runtime_state.c,
 * runtime_kernels.c, runtime_memory.c, runtime.c), hidden from the world by
 * -fvisibility=hidden. */
#ifndef MG_HOST_RUNTIME_SHARED_H
#define MG_HOST_RUNTIME_SHARED_H

#include "host/runtime.h"
#include "cuda/driver.h"

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

/* Host memory made device-accessible for the call: a range the program
 * registered (gpu.host_register), or a NumPy array lent to the call in a
 * managed copy. */
typedef struct {
    void *pointer;      /* what the program sees */
    size_t bytes;
    void *original;     /* a lent array's own memory, else NULL */
    int writable;       /* a lent array is copied back */
} host_range;

/* Pages the runtime registered with the driver for the program's host_ranges. */
typedef struct {
    uintptr_t start, end;
} pinned_range;

/* The last kernel queued on a stream, to name the kernel a fault comes from. */
typedef struct {
    CUstream stream;
    const char *name;
} last_launch;

#define fail(s, code, what, ...) mg_rt_fail_on(s, NULL, code, what, __VA_ARGS__)

#define RESERVE(s, field) \
    mg_rt_reserve((void **)&(s)->field, &(s)->c##field, (s)->n##field, sizeof *(s)->field)

typedef struct module {
    const void *image; /* the JIT'd module's constant: lives as long as the engine */
    size_t size;
    int ptx;           /* mgpuModuleLoadJIT: PTX text for the driver's JIT */
    int opt_level;
    CUmodule handles[MG_CU_MAX_DEVICES]; /* loaded lazily, per device */
    char *log;         /* what the driver's JIT reported compiling the PTX (malloc), or NULL */
    const void *owner; /* the engine whose constructors made it */
    struct module *next;
} module;

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
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
    host_range *ranges;
    size_t nranges, cranges;
    pinned_range *pinned;
    size_t npinned, cpinned;
    last_launch *lasts;
    size_t nlasts, clasts;
    const char *function;    /* the host function called (the caller's string) */
    char fault[512];         /* which kernel faulted, where it was noticed */
};

extern _Thread_local mg_rt_state *mg_rt_current;
void mg_rt_fail_on(mg_rt_state *s, CUstream stream, CUresult code, const char *what, const char *format, ...);
void mg_rt_fail_current(CUresult code, const char *what, const char *detail);
int mg_rt_ready(mg_rt_state *s, const char *what);
int mg_rt_reserve(void **items, size_t *capacity, size_t count, size_t size);
int mg_rt_track_handle(mg_rt_state *s, void ***items, size_t *count, size_t *capacity, void *handle);
int mg_rt_untrack_handle(void **items, size_t *count, void *handle);
const char *mg_rt_kernel_name(mg_rt_state *s, CUfunction function);
void *mgpuModuleLoad(void *image, uint64_t size);
void *mgpuModuleLoadJIT(void *ptx, int32_t opt_level);
void mgpuModuleUnload(void *handle);
void *mgpuModuleGetFunction(void *handle, const char *name);
void mgpuLaunchKernel(void *function, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by,
                             int64_t bz, int32_t shared_bytes, void *stream, void **params, void **extra,
                             int64_t nparams);
void mgpuLaunchClusterKernel(void *function, int64_t cx, int64_t cy, int64_t cz, int64_t gx, int64_t gy,
                                    int64_t gz, int64_t bx, int64_t by, int64_t bz, int32_t shared_bytes,
                                    void *stream, void **params, void **extra);
void *mgpuStreamCreate(void);
void mgpuStreamDestroy(void *stream);
void mgpuStreamSynchronize(void *stream);
void mgpuStreamWaitEvent(void *stream, void *event);
void *mgpuEventCreate(void);
void mgpuEventDestroy(void *event);
void mgpuEventRecord(void *event, void *stream);
void mgpuEventSynchronize(void *event);
void *mgpuMemAlloc(uint64_t bytes, void *stream, int8_t host_shared);
allocation *mg_rt_find_allocation(const mg_rt_state *s, const void *pointer);
void mg_rt_release(allocation *a);
void mgpuMemFree(void *pointer, void *stream);
void mgpuMemcpy(void *dst, void *src, uint64_t bytes, void *stream);
void *mgpuTensorMapEncodeTiledMemref(int64_t rank, void *descriptor, int64_t data_type, int64_t interleave,
                                            int64_t swizzle, int64_t l2_promotion, int64_t oob_fill,
                                            const int64_t *box);
void mgpuMemset32(void *dst, uint32_t value, uint64_t count, void *stream);
void mgpuMemset16(void *dst, uint16_t value, uint64_t count, void *stream);
void mgpuMemHostRegister(void *pointer, uint64_t bytes);
void mgpuMemHostUnregister(void *pointer);
void mgpuMemHostRegisterMemRef(int64_t rank, int64_t *descriptor, int64_t element_bytes);
void mgpuMemHostUnregisterMemRef(int64_t rank, int64_t *descriptor, int64_t element_bytes);
int mg_rt_end(mg_rt_state *s, PyObject *timeline);


#endif
