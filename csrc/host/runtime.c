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
#include "host/runtime_shared.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
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
    mg_rt_current = s;
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
    allocation *a = mg_rt_find_allocation(s, pointer);
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
        mg_rt_release(&s->allocations[i]);
    for (size_t i = 0; i < s->nevents; i++)
        mg_cu.cuEventDestroy(s->events[i]);
    for (size_t i = 0; i < s->nstreams; i++)
        mg_cu.cuStreamDestroy(s->streams[i]);
    mg_rt_current = NULL;
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
    static const mg_async_hooks async_hooks = {.fail = mg_rt_fail_current};
    mg_async_register_hooks(&async_hooks);
    return 0;
}
