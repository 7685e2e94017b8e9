/* mlirgpu's mgpu* runtime (see runtime.h and docs/design/host_runtime.md).
 *
 * The signatures are those MLIR 22's lowering declares (gpu-to-llvm for
 * streams, events, memory; gpu.binary's translation for modules and
 * launches). Every function but the module ones runs inside an invocation:
 * the JIT'd code called from ExecutionEngine.invoke, without the GIL, on the
 * thread whose primary context mg_rt_begin made current. None may call
 * Python. Kernel images are loaded lazily, at a program's first
 * mgpuModuleGetFunction, so that global constructors need no driver: an
 * engine can be built, and pure host functions run, without a GPU. */
#include "host/runtime.h"
#include "host/async_runtime.h"
#include "cuda/driver.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* The invocation running on this thread. */
static _Thread_local mg_rt_state *current;

/* ------------------------------------------------------------------------ */
/* Failures and bookkeeping                                                  */

/* Errors a kernel leaves behind: the context is lost, and every later
 * driver call (whatever it is) reports the same code. */
static int is_fault(CUresult code)
{
    switch (code) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
        return 1;
    default:
        return 0;
    }
}

static const char *last_on(const mg_rt_state *s, CUstream stream)
{
    for (size_t i = 0; i < s->nlasts; i++)
        if (s->lasts[i].stream == stream)
            return s->lasts[i].name;
    return NULL;
}

static void fail_on(mg_rt_state *s, CUstream stream, CUresult code, const char *what, const char *format, ...)
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
    if (!is_fault(code))
        return;
    /* The driver reports a fault at whatever call comes next: the kernel
     * named is the last one queued on the stream being waited for, else the
     * last one the call launched; without one, a kernel of an earlier call. */
    const char *kernel = stream != NULL ? last_on(s, stream) : NULL;
    if (s->nlasts == 0)
        snprintf(s->fault, sizeof s->fault, "a kernel faulted before this call of @%s", s->function);
    else if (kernel == NULL)
        snprintf(s->fault, sizeof s->fault, "kernel '%s' (the last one launched) faulted in @%s",
                 s->lasts[s->nlasts - 1].name, s->function);
    else
        snprintf(s->fault, sizeof s->fault, "kernel '%s' (the last one launched on stream %p) faulted in @%s",
                 kernel, stream, s->function);
}

#define fail(s, code, what, ...) fail_on(s, NULL, code, what, __VA_ARGS__)

/* Fails the invocation running on this thread (if any) with `code`, naming
 * `what`: the async runtime's hook. */
static void fail_current(CUresult code, const char *what, const char *detail)
{
    if (current != NULL)
        fail(current, code, what, "%s", detail);
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
    char *log;         /* what the driver's JIT reported compiling the PTX (malloc), or NULL */
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
    const char *name = kernel_name(s, function);
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
        fail_on(s, stream, r, cluster == NULL ? "mgpuLaunchKernel: cuLaunchKernel"
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

static void mgpuLaunchKernel(void *function, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by,
                             int64_t bz, int32_t shared_bytes, void *stream, void **params, void **extra,
                             int64_t nparams)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuLaunchKernel"))
        return;
    const int64_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    launch_kernel(s, "mgpuLaunchKernel", function, NULL, grid, block, shared_bytes, stream, params, extra);
}

static void mgpuLaunchClusterKernel(void *function, int64_t cx, int64_t cy, int64_t cz, int64_t gx, int64_t gy,
                                    int64_t gz, int64_t bx, int64_t by, int64_t bz, int32_t shared_bytes,
                                    void *stream, void **params, void **extra)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuLaunchClusterKernel"))
        return;
    const int64_t cluster[3] = {cx, cy, cz}, grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    launch_kernel(s, "mgpuLaunchClusterKernel", function, cluster, grid, block, shared_bytes, stream, params,
                  extra);
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
        fail_on(s, stream, r, "mgpuStreamSynchronize: cuStreamSynchronize", "");
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

static void mgpuStreamWaitEvent(void *stream, void *event)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuStreamWaitEvent"))
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
            fail_on(s, event, r, "mgpuStreamWaitEvent: cuEventRecord/cuStreamWaitEvent", "waiting for stream %p",
                    event);
        return;
    }
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
    if (is_stream(s, event))
        return; /* a region's stream (see mgpuStreamWaitEvent): destroyed at the end of the call */
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
    if (is_stream(s, event)) {
        CUresult r = mg_cu.cuStreamSynchronize(event);
        if (r != CUDA_SUCCESS)
            fail_on(s, event, r, "mgpuEventSynchronize: cuStreamSynchronize", "");
        return;
    }
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

static void mgpuMemHostRegister(void *pointer, uint64_t bytes)
{
    mg_rt_state *s = current;
    if (ready(s, "mgpuMemHostRegister"))
        register_range(s, "mgpuMemHostRegister: cuMemHostRegister", pointer, (size_t)bytes);
}

static void mgpuMemHostUnregister(void *pointer)
{
    mg_rt_state *s = current;
    if (ready(s, "mgpuMemHostUnregister"))
        unregister_range(s, "mgpuMemHostUnregister: cuMemHostUnregister", pointer);
}

/* gpu.host_register of a memref (ranked, or unranked: the lowering passes
 * the rank and the ranked descriptor either way). */
static void mgpuMemHostRegisterMemRef(int64_t rank, int64_t *descriptor, int64_t element_bytes)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuMemHostRegisterMemRef"))
        return;
    char *first;
    size_t bytes;
    if (memref_span(descriptor, rank, element_bytes, &first, &bytes) < 0) {
        fail(s, CUDA_ERROR_INVALID_VALUE, "mgpuMemHostRegisterMemRef", "a memref with negative strides");
        return;
    }
    register_range(s, "mgpuMemHostRegisterMemRef: cuMemHostRegister", first, bytes);
}

static void mgpuMemHostUnregisterMemRef(int64_t rank, int64_t *descriptor, int64_t element_bytes)
{
    mg_rt_state *s = current;
    if (!ready(s, "mgpuMemHostUnregisterMemRef"))
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
    {"mgpuMemHostRegister", (void *)mgpuMemHostRegister},
    {"mgpuMemHostUnregister", (void *)mgpuMemHostUnregister},
    {"mgpuMemHostRegisterMemRef", (void *)mgpuMemHostRegisterMemRef},
    {"mgpuMemHostUnregisterMemRef", (void *)mgpuMemHostUnregisterMemRef},
    {"mgpuLaunchClusterKernel", (void *)mgpuLaunchClusterKernel},
    {"mgpuTensorMapEncodeTiledMemref", (void *)mgpuTensorMapEncodeTiledMemref},
};

void *mg_rt_symbol(const char *name)
{
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++)
        if (strcmp(symbols[i].name, name) == 0)
            return symbols[i].address;
    return NULL;
}

PyObject *mg_rt_names(void)
{
    size_t n = sizeof symbols / sizeof *symbols;
    PyObject *names = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; names != NULL && i < n; i++) {
        PyObject *name = PyUnicode_FromString(symbols[i].name);
        if (name == NULL)
            Py_CLEAR(names);
        else
            PyTuple_SET_ITEM(names, (Py_ssize_t)i, name);
    }
    return names;
}

/* ------------------------------------------------------------------------ */
/* Invocations                                                               */

mg_rt_state *mg_rt_begin(const char *function, int timeline)
{
    mg_rt_state *s = calloc(1, sizeof *s);
    if (s == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    s->function = function;
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
    for (size_t i = 0; i < s->nranges; i++) {
        host_range *r = &s->ranges[i];
        if (r->original == NULL)
            continue;
        if (!s->failed && r->writable)
            memcpy(r->original, r->pointer, r->bytes);
        mg_cu.cuMemFree((CUdeviceptr)(uintptr_t)r->pointer);
    }
    for (size_t i = 0; i < s->npinned; i++)
        mg_cu.cuMemHostUnregister((void *)s->pinned[i].start);
    mg_async_release_all();
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
    } else if (status == 0 && s->failed == FAILED_DRIVER && s->fault[0] != '\0') {
        char detail[sizeof s->detail + sizeof s->fault + 320];
        snprintf(detail, sizeof detail, "%s%s%s; the GPU context is lost: this process cannot use the GPU again "
                 "(every later call raises this error), restart it", s->detail, s->detail[0] ? "; " : "", s->fault);
        status = mg_cu_raise(s->code, s->what, detail);
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
    free(s->ranges);
    free(s->pinned);
    free(s->lasts);
    free(s);
    return status;
}

int mg_rt_init(PyObject *module)
{
    static const mg_async_hooks async_hooks = {.fail = fail_current};
    mg_async_register_hooks(&async_hooks);
    return 0;
}
