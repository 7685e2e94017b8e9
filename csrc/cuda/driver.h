/* The CUDA driver, opened with dlopen on first use: the function table,
 * error conversion, per-thread primary contexts, and the Python types
 * Device, Stream and Event (cuda/driver.c, cuda/stream.c, cuda/device.c).
 *
 * <cuda.h> is included for its types only. Its #defines map names such as
 * cuMemAlloc to the versioned symbol (cuMemAlloc_v2); the table below is
 * written with the plain names, so both the field and the dlsym'd symbol get
 * the versioned name, exactly as a program linked against libcuda would. */
#ifndef MG_DRIVER_H
#define MG_DRIVER_H

#include "base/state.h"
#include <cuda.h>
#include <stdint.h>

/* X(name, parameter list) for every driver entry point mlirgpu calls. */
#define MG_CU_FUNCTIONS(X) \
    X(cuInit, (unsigned int flags)) \
    X(cuDriverGetVersion, (int *version)) \
    X(cuGetErrorName, (CUresult error, const char **name)) \
    X(cuGetErrorString, (CUresult error, const char **text)) \
    X(cuDeviceGet, (CUdevice *device, int ordinal)) \
    X(cuDeviceGetCount, (int *count)) \
    X(cuDeviceGetName, (char *name, int length, CUdevice device)) \
    X(cuDeviceGetAttribute, (int *value, CUdevice_attribute attribute, CUdevice device)) \
    X(cuDeviceTotalMem, (size_t *bytes, CUdevice device)) \
    X(cuDevicePrimaryCtxRetain, (CUcontext *context, CUdevice device)) \
    X(cuCtxSetCurrent, (CUcontext context)) \
    X(cuCtxGetCurrent, (CUcontext *context)) \
    X(cuCtxPushCurrent, (CUcontext context)) \
    X(cuCtxPopCurrent, (CUcontext *context)) \
    X(cuCtxSynchronize, (void)) \
    X(cuDeviceCanAccessPeer, (int *can_access, CUdevice device, CUdevice peer)) \
    X(cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags)) \
    X(cuMemGetInfo, (size_t *free_bytes, size_t *total_bytes)) \
    X(cuMemAlloc, (CUdeviceptr *pointer, size_t bytes)) \
    X(cuMemFree, (CUdeviceptr pointer)) \
    X(cuMemAllocManaged, (CUdeviceptr *pointer, size_t bytes, unsigned int flags)) \
    X(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)) \
    X(cuMemcpyHtoDAsync, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)) \
    X(cuMemcpyDtoHAsync, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream)) \
    X(cuMemcpyDtoDAsync, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)) \
    X(cuMemcpyPeerAsync, (CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src, CUcontext src_context, \
                          size_t bytes, CUstream stream)) \
    X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream)) \
    X(cuMemsetD16Async, (CUdeviceptr dst, unsigned short value, size_t count, CUstream stream)) \
    X(cuMemsetD32Async, (CUdeviceptr dst, unsigned int value, size_t count, CUstream stream)) \
    X(cuMemHostAlloc, (void **pointer, size_t bytes, unsigned int flags)) \
    X(cuMemFreeHost, (void *pointer)) \
    X(cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr pointer)) \
    X(cuStreamCreate, (CUstream *stream, unsigned int flags)) \
    X(cuStreamDestroy, (CUstream stream)) \
    X(cuStreamSynchronize, (CUstream stream)) \
    X(cuStreamQuery, (CUstream stream)) \
    X(cuStreamWaitEvent, (CUstream stream, CUevent event, unsigned int flags)) \
    X(cuStreamBeginCapture, (CUstream stream, CUstreamCaptureMode mode)) \
    X(cuStreamEndCapture, (CUstream stream, CUgraph *graph)) \
    X(cuStreamIsCapturing, (CUstream stream, CUstreamCaptureStatus *status)) \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *exec, CUgraph graph, unsigned long long flags)) \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream)) \
    X(cuGraphGetNodes, (CUgraph graph, CUgraphNode *nodes, size_t *count)) \
    X(cuGraphExecDestroy, (CUgraphExec exec)) \
    X(cuGraphDestroy, (CUgraph graph)) \
    X(cuEventCreate, (CUevent *event, unsigned int flags)) \
    X(cuEventDestroy, (CUevent event)) \
    X(cuEventRecord, (CUevent event, CUstream stream)) \
    X(cuEventSynchronize, (CUevent event)) \
    X(cuEventQuery, (CUevent event)) \
    X(cuEventElapsedTime, (float *milliseconds, CUevent start, CUevent end)) \
    X(cuModuleLoadData, (CUmodule *module, const void *image)) \
    X(cuModuleLoadDataEx, (CUmodule *module, const void *image, unsigned int count, \
                           CUjit_option *options, void **values)) \
    X(cuModuleUnload, (CUmodule module)) \
    X(cuModuleGetFunction, (CUfunction *function, CUmodule module, const char *name)) \
    X(cuFuncGetAttribute, (int *value, CUfunction_attribute attribute, CUfunction function)) \
    X(cuFuncSetAttribute, (CUfunction function, CUfunction_attribute attribute, int value)) \
    X(cuModuleGetGlobal, (CUdeviceptr *pointer, size_t *bytes, CUmodule module, const char *name)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, (int *blocks, CUfunction function, int block_threads, \
                                                    size_t dynamic_shared_bytes)) \
    X(cuLaunchKernel, (CUfunction function, unsigned int grid_x, unsigned int grid_y, \
                       unsigned int grid_z, unsigned int block_x, unsigned int block_y, \
                       unsigned int block_z, unsigned int shared_bytes, CUstream stream, \
                       void **params, void **extra)) \
    X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction function, void **params, void **extra)) \
    X(cuMemHostRegister, (void *pointer, size_t bytes, unsigned int flags)) \
    X(cuMemHostUnregister, (void *pointer)) \
    X(cuTensorMapEncodeTiled, (CUtensorMap *map, CUtensorMapDataType data_type, cuuint32_t rank, \
                               void *address, const cuuint64_t *dims, const cuuint64_t *strides, \
                               const cuuint32_t *box, const cuuint32_t *element_strides, \
                               CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, \
                               CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill))

#define MG_CU_FIELD(name, params) CUresult (CUDAAPI *name) params;
typedef struct {
    MG_CU_FUNCTIONS(MG_CU_FIELD)
} mg_cu_driver;
#undef MG_CU_FIELD

/* The table. Valid only after mg_cu_ensure_context() (or mg_cu_load())
 * returned 0 on some thread; every field is then non-NULL. */
extern mg_cu_driver mg_cu;

/* The symbol of mg.grid.sync()'s counter (python/mlirgpu/language/grid.py's
 * COUNTER): a module that defines it holds a kernel launched cooperatively. */
#define MG_CU_GRID_BARRIER "__mg_grid_barrier"

/* Most devices mlirgpu tracks a primary context for. */
#define MG_CU_MAX_DEVICES 64

/* After mg_cu_load failed: 1 when libcuda loaded but cuInit refused it (its
 * answer in *result), 0 when there is no usable library. */
int mg_cu_init_refused(CUresult *result);

/* The number of devices the driver sees (0 before it is loaded). */
int mg_cu_device_count(void);

/* Makes `device` the calling thread's device. 0, or -1 with CudaError. */
int mg_cu_set_device(int device);

/* Opens libcuda.so.1 and calls cuInit once per process. 0, or -1 with
 * CudaError set (code -1 and the dlerror text when there is no driver). */
int mg_cu_load(void);

/* 0 when r is CUDA_SUCCESS; else -1 with CudaError set, naming `what`. */
int mg_cu_check(CUresult r, const char *what);

/* Like mg_cu_check for a failure, with `detail` (may be NULL) appended. */
int mg_cu_raise(CUresult r, const char *what, const char *detail);
/* The same for a call on `stream`: a fault (the context is dead) names the
 * kernel last launched on it; mg_cu_raise names the last launched anywhere. */
int mg_cu_raise_on(CUresult r, const char *what, const char *detail, const CUstream *stream);
/* Notes the kernel just launched on `stream`, for mg_cu_raise_on. Needs no GIL. */
void mg_cu_note_launch(CUstream stream, const char *kernel);

/* The calling thread's context and device, cached so that the launch path
 * costs one thread-local load when the context is already current. */
extern _Thread_local CUcontext mg_cu_tls_context;
extern _Thread_local int mg_cu_tls_device;

int mg_cu_ensure_context_slow(void);

/* Makes the thread's device (0 unless set_device was called) current with
 * its primary context, loading the driver on first use. 0 ok, -1 with
 * CudaError set. */
static inline int mg_cu_ensure_context(void)
{
    if (mg_cu_tls_context != NULL)
        return 0;
    return mg_cu_ensure_context_slow();
}

/* The device the calling thread works on (valid after mg_cu_ensure_context). */
static inline int mg_cu_current_device(void) { return mg_cu_tls_device; }

/* Pushes the primary context of `device` if it is not the thread's current
 * one; *pushed says whether mg_cu_pop must pop it. 0 or -1 with CudaError. */
int mg_cu_push(int device, int *pushed);
void mg_cu_pop(int pushed);

/* For destructors: makes `device`'s context current without raising.
 * 1 if pushed (pop it with mg_cu_pop), 0 if already current, -1 if the
 * driver is unusable (then skip the driver call). */
int mg_cu_push_quietly(int device);

/* The ordinal that owns `pointer`, or the thread's device when the driver
 * cannot tell (or is not loaded). Never raises. */
int mg_cu_pointer_device(CUdeviceptr pointer);
/* 0 where the driver is loaded and the process sees one device, which every
 * device pointer is then on (readers of foreign arrays need not ask); else -1. */
int mg_cu_sole_device(void);

/* 1 when `stream` is capturing (or its capture was invalidated). The legacy
 * stream never captures, and is not asked: while a blocking stream captures
 * the driver answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT for it. */
int mg_cu_stream_capturing(CUstream stream);

/* Makes `consumer` wait for the work queued so far on `producer` (an event
 * recorded there, no host block). No-op when they are the same stream, and
 * when `consumer` is capturing a graph that `producer` is not part of: a
 * replay runs long after, ordered by its caller. 0, or -1 with CudaError. */
int mg_cu_stream_order(CUstream producer, CUstream consumer);

/* The same across devices: `producer` is a stream of `producer_device`
 * and `consumer` one of `consumer_device` (NULL: that device's legacy
 * default stream). The event is recorded in the producer's context and
 * waited for from the consumer's. 0, or -1 with CudaError. */
int mg_cu_stream_order_across(CUstream producer, int producer_device, CUstream consumer, int consumer_device);

/* `nbytes` from `src` (memory of `src_device`) to `dst` (of `dst_device`)
 * on `stream`, a stream of `dst_device` (cuMemcpyPeerAsync). Where
 * cuDeviceCanAccessPeer allows, peer access is enabled first (once per
 * pair), so the copy goes directly between the devices; otherwise the
 * driver stages it through host memory. 0, or -1 with CudaError. */
int mg_cu_copy_peer(CUdeviceptr dst, int dst_device, CUdeviceptr src, int src_device, size_t nbytes,
                    CUstream stream);

/* 0 when `device` is an ordinal of this machine, else -1 with ValueError
 * (CudaError where the driver is missing). */
int mg_cu_check_device(int device);






#endif
