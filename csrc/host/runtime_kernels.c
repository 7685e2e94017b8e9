/* The mgpu runtime's modules and kernel launches, streams and events. */
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
/* Modules and launches                                                      */


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

void *mgpuModuleLoad(void *image, uint64_t size)
{
    return new_module(image, (size_t)size, 0, 0);
}

void *mgpuModuleLoadJIT(void *ptx, int32_t opt_level)
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
    free(m->log);
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

/* From an engine's global destructors, which run when the engine is torn
 * down, before mg_rt_release_modules releases what they left: a module no
 * longer listed is not touched. */
void mgpuModuleUnload(void *handle)
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

PyObject *mg_rt_compiler_log(const void *owner)
{
    PyObject *parts = PyList_New(0);
    pthread_mutex_lock(&module_lock);
    for (module *m = modules; parts != NULL && m != NULL; m = m->next) {
        if (m->owner != owner || m->log == NULL)
            continue;
        PyObject *text = PyUnicode_DecodeUTF8(m->log, (Py_ssize_t)strlen(m->log), "replace");
        if (text == NULL || PyList_Append(parts, text) < 0)
            Py_CLEAR(parts);
        Py_XDECREF(text);
    }
    pthread_mutex_unlock(&module_lock);
    if (parts == NULL)
        return NULL;
    PyObject *separator = PyUnicode_FromString("\n"), *joined = NULL;
    if (separator != NULL)
        joined = PyUnicode_Join(separator, parts);
    Py_XDECREF(separator);
    Py_DECREF(parts);
    return joined;
}

static CUmodule load_module(mg_rt_state *s, module *m)
{
    pthread_mutex_lock(&module_lock);
    CUmodule handle = m->handles[s->device];
    if (handle == NULL) {
        CUresult r;
        if (m->ptx) {
            /* The info log, verbose: registers, spills and shared memory per kernel. */
            char log[768] = "", info[8192] = "";
            CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                      CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_INFO_LOG_BUFFER,
                                      CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE};
            void *values[] = {log, (void *)(uintptr_t)sizeof log,
                              (void *)(uintptr_t)(m->opt_level < 0 ? 0 : m->opt_level > 4 ? 4 : m->opt_level),
                              info, (void *)(uintptr_t)sizeof info, (void *)(uintptr_t)1};
            r = mg_cu.cuModuleLoadDataEx(&handle, m->image, 6, options, values);
            if (r == CUDA_SUCCESS && m->log == NULL)
                m->log = strdup(info);
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

void *mgpuModuleGetFunction(void *handle, const char *name)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuModuleGetFunction"))
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

/* Records `name` as the last kernel queued on `stream`. */
static void note_launch(mg_rt_state *s, CUstream stream, const char *name)
{
    for (size_t i = 0; i < s->nlasts; i++)
        if (s->lasts[i].stream == stream) {
            /* Kept in launch order: the last entry is the latest launch. */
            memmove(&s->lasts[i], &s->lasts[i + 1], (s->nlasts - i - 1) * sizeof *s->lasts);
            s->lasts[s->nlasts - 1] = (last_launch){stream, name};
            return;
        }
    if (RESERVE(s, lasts) == 0)
        s->lasts[s->nlasts++] = (last_launch){stream, name};
}

/* One launch, plain (cluster == NULL) or of thread-block clusters. */
static void launch_kernel(mg_rt_state *s, const char *entry, void *function, const int64_t *cluster,
                          const int64_t grid[3], const int64_t block[3], int32_t shared_bytes, void *stream,
                          void **params, void **extra)
{
    const char *name = mg_rt_kernel_name(s, function);
    char config[320], clusters[96] = "";
    if (cluster != NULL)
        snprintf(clusters, sizeof clusters, " cluster=(%lld, %lld, %lld)", (long long)cluster[0],
                 (long long)cluster[1], (long long)cluster[2]);
    snprintf(config, sizeof config, "kernel '%s'%s grid=(%lld, %lld, %lld) block=(%lld, %lld, %lld) shared_mem=%d",
             name, clusters, (long long)grid[0], (long long)grid[1], (long long)grid[2], (long long)block[0],
             (long long)block[1], (long long)block[2], (int)shared_bytes);
    for (int i = 0; i < 9; i++) {
        int64_t d = i < 3 ? grid[i] : i < 6 ? block[i - 3] : cluster != NULL ? cluster[i - 6] : 1;
        if (d < 1 || d > UINT32_MAX) {
            fail(s, CUDA_ERROR_INVALID_VALUE, entry, "%s: a dimension is out of range", config);
            return;
        }
    }
    if (shared_bytes < 0 || function == NULL) {
        fail(s, CUDA_ERROR_INVALID_VALUE, entry, "%s: %s", config,
             function == NULL ? "no function" : "negative shared memory");
        return;
    }
    CUresult r;
    /* Above 48 KB, dynamic shared memory must be asked for (as MLIR's own
     * runtime does before each such launch). */
    if (shared_bytes > 48 * 1024 &&
        (r = mg_cu.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)) !=
            CUDA_SUCCESS) {
        fail(s, r, "cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)", "%s", config);
        return;
    }
    launch timed = {name, stream, NULL, NULL};
    if (s->timeline && (RESERVE(s, launches) < 0 || (timed.start = timing_event(s, stream, name)) == NULL)) {
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, entry, "%s: no host memory left for its timeline", config);
        return;
    }
    if (cluster == NULL) {
        r = mg_cu.cuLaunchKernel(function, (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2],
                                 (unsigned)block[0], (unsigned)block[1], (unsigned)block[2], (unsigned)shared_bytes,
                                 stream, params, extra);
    } else {
        /* Clusters of more than 8 blocks are allowed where the chip has them. */
        r = mg_cu.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        CUlaunchAttribute attribute = {.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION};
        attribute.value.clusterDim.x = (unsigned)cluster[0];
        attribute.value.clusterDim.y = (unsigned)cluster[1];
        attribute.value.clusterDim.z = (unsigned)cluster[2];
        CUlaunchConfig launch_config = {
            .gridDimX = (unsigned)grid[0], .gridDimY = (unsigned)grid[1], .gridDimZ = (unsigned)grid[2],
            .blockDimX = (unsigned)block[0], .blockDimY = (unsigned)block[1], .blockDimZ = (unsigned)block[2],
            .sharedMemBytes = (unsigned)shared_bytes, .hStream = stream, .attrs = &attribute, .numAttrs = 1};
        if (r == CUDA_SUCCESS)
            r = mg_cu.cuLaunchKernelEx(&launch_config, function, params, extra);
    }
    if (r != CUDA_SUCCESS) {
        mg_rt_fail_on(s, stream, r, cluster == NULL ? "mgpuLaunchKernel: cuLaunchKernel"
                                              : "mgpuLaunchClusterKernel: cuLaunchKernelEx", "%s", config);
        if (timed.start != NULL)
            mg_cu.cuEventDestroy(timed.start);
        return;
    }
    note_launch(s, stream, name);
    mg_cu_note_launch(stream, name);
    if (s->timeline) {
        if ((timed.end = timing_event(s, stream, name)) == NULL) {
            mg_cu.cuEventDestroy(timed.start);
            return;
        }
        s->launches[s->nlaunches++] = timed;
    }
}

void mgpuLaunchKernel(void *function, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by,
                             int64_t bz, int32_t shared_bytes, void *stream, void **params, void **extra,
                             int64_t nparams)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuLaunchKernel"))
        return;
    const int64_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    launch_kernel(s, "mgpuLaunchKernel", function, NULL, grid, block, shared_bytes, stream, params, extra);
}

void mgpuLaunchClusterKernel(void *function, int64_t cx, int64_t cy, int64_t cz, int64_t gx, int64_t gy,
                                    int64_t gz, int64_t bx, int64_t by, int64_t bz, int32_t shared_bytes,
                                    void *stream, void **params, void **extra)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuLaunchClusterKernel"))
        return;
    const int64_t cluster[3] = {cx, cy, cz}, grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    launch_kernel(s, "mgpuLaunchClusterKernel", function, cluster, grid, block, shared_bytes, stream, params,
                  extra);
}

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

void *mgpuStreamCreate(void)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuStreamCreate"))
        return NULL;
    CUstream stream;
    /* Non-blocking, as MLIR's own runtime makes them: no implicit order with
     * the legacy default stream. */
    CUresult r = mg_cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuStreamCreate: cuStreamCreate", "");
        return NULL;
    }
    if (mg_rt_track_handle(s, (void ***)&s->streams, &s->nstreams, &s->cstreams, stream) < 0) {
        mg_cu.cuStreamDestroy(stream);
        return NULL;
    }
    return stream;
}

void mgpuStreamDestroy(void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuStreamDestroy"))
        return; /* left to mg_rt_end */
    if (!mg_rt_untrack_handle((void **)s->streams, &s->nstreams, stream)) {
        fail(s, CUDA_ERROR_INVALID_HANDLE, "mgpuStreamDestroy", "stream %p was not made by this call", stream);
        return;
    }
    CUresult r = mg_cu.cuStreamDestroy(stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuStreamDestroy: cuStreamDestroy", "");
}

void mgpuStreamSynchronize(void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuStreamSynchronize"))
        return;
    CUresult r = mg_cu.cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS)
        mg_rt_fail_on(s, stream, r, "mgpuStreamSynchronize: cuStreamSynchronize", "");
}

/* MLIR 22's gpu-to-llvm passes a gpu token that leaves an async.execute
 * region as the region's stream, not as an event recorded on it: the event
 * functions take such a stream for the work queued on it so far. */
static int is_stream(const mg_rt_state *s, void *handle)
{
    for (size_t i = 0; i < s->nstreams; i++)
        if (s->streams[i] == handle)
            return 1;
    return 0;
}

void mgpuStreamWaitEvent(void *stream, void *event)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuStreamWaitEvent"))
        return;
    if (is_stream(s, event)) {
        CUevent recorded;
        CUresult r = mg_cu.cuEventCreate(&recorded, CU_EVENT_DISABLE_TIMING);
        if (r == CUDA_SUCCESS) {
            if ((r = mg_cu.cuEventRecord(recorded, event)) == CUDA_SUCCESS)
                r = mg_cu.cuStreamWaitEvent(stream, recorded, 0);
            mg_cu.cuEventDestroy(recorded);
        }
        if (r != CUDA_SUCCESS)
            mg_rt_fail_on(s, event, r, "mgpuStreamWaitEvent: cuEventRecord/cuStreamWaitEvent", "waiting for stream %p",
                    event);
        return;
    }
    CUresult r = mg_cu.cuStreamWaitEvent(stream, event, 0);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuStreamWaitEvent: cuStreamWaitEvent", "");
}

void *mgpuEventCreate(void)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuEventCreate"))
        return NULL;
    CUevent event;
    CUresult r = mg_cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
        fail(s, r, "mgpuEventCreate: cuEventCreate", "");
        return NULL;
    }
    if (mg_rt_track_handle(s, (void ***)&s->events, &s->nevents, &s->cevents, event) < 0) {
        mg_cu.cuEventDestroy(event);
        return NULL;
    }
    return event;
}

void mgpuEventDestroy(void *event)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuEventDestroy"))
        return;
    if (is_stream(s, event))
        return; /* a region's stream (see mgpuStreamWaitEvent): destroyed at the end of the call */
    if (!mg_rt_untrack_handle((void **)s->events, &s->nevents, event)) {
        fail(s, CUDA_ERROR_INVALID_HANDLE, "mgpuEventDestroy", "event %p was not made by this call", event);
        return;
    }
    CUresult r = mg_cu.cuEventDestroy(event);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuEventDestroy: cuEventDestroy", "");
}

void mgpuEventRecord(void *event, void *stream)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuEventRecord"))
        return;
    CUresult r = mg_cu.cuEventRecord(event, stream);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuEventRecord: cuEventRecord", "");
}

void mgpuEventSynchronize(void *event)
{
    mg_rt_state *s = mg_rt_current;
    if (!mg_rt_ready(s, "mgpuEventSynchronize"))
        return;
    if (is_stream(s, event)) {
        CUresult r = mg_cu.cuStreamSynchronize(event);
        if (r != CUDA_SUCCESS)
            mg_rt_fail_on(s, event, r, "mgpuEventSynchronize: cuStreamSynchronize", "");
        return;
    }
    CUresult r = mg_cu.cuEventSynchronize(event);
    if (r != CUDA_SUCCESS)
        fail(s, r, "mgpuEventSynchronize: cuEventSynchronize", "");
}

/* ------------------------------------------------------------------------ */
