/* The mgpu runtime's per-invocation state: failures (the first one is
 * kept and raised once the host function returns) and the bookkeeping of
 * handles. The bottom of the runtime's files. */
#include "host/runtime.h"
#include "host/async_runtime.h"
#include "cuda/driver.h"
#include "host/runtime_shared.h"

/* The invocation running on this thread. */
_Thread_local mg_rt_state *mg_rt_current;

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

void mg_rt_fail_on(mg_rt_state *s, CUstream stream, CUresult code, const char *what, const char *format, ...)
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


/* Fails the invocation running on this thread (if any) with `code`, naming
 * `what`: the async runtime's hook. */
void mg_rt_fail_current(CUresult code, const char *what, const char *detail)
{
    if (mg_rt_current != NULL)
        fail(mg_rt_current, code, what, "%s", detail);
}

/* 1 when the call may use the driver: inside an invocation, nothing failed
 * yet, and the context is current (else that failure is recorded). */
int mg_rt_ready(mg_rt_state *s, const char *what)
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
int mg_rt_reserve(void **items, size_t *capacity, size_t count, size_t size)
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


int mg_rt_track_handle(mg_rt_state *s, void ***items, size_t *count, size_t *capacity, void *handle)
{
    if (mg_rt_reserve((void **)items, capacity, *count, sizeof **items) < 0) {
        fail(s, CUDA_ERROR_OUT_OF_MEMORY, "mlirgpu runtime", "no host memory left to track a stream or event");
        return -1;
    }
    (*items)[(*count)++] = handle;
    return 0;
}

/* Removes `handle` from the array; 0 if it was not there. */
int mg_rt_untrack_handle(void **items, size_t *count, void *handle)
{
    for (size_t i = 0; i < *count; i++)
        if (items[i] == handle) {
            items[i] = items[--*count];
            return 1;
        }
    return 0;
}

const char *mg_rt_kernel_name(mg_rt_state *s, CUfunction function)
{
    for (size_t i = 0; i < s->nkernels; i++)
        if (s->kernels[i].function == function)
            return s->kernels[i].name;
    return "?";
}

/* ------------------------------------------------------------------------ */
