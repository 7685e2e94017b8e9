// A stand-in for libcuda.so.1 so that CI (no GPU) can test what the launch
// path hands the driver: host memory plays device memory, and the few kernels
// the tests load are emulated by name (record_params copies the packed
// parameters out). Built by the fake_libcuda fixture in tests/conftest.py.
//
// Devices: one, or FAKE_CUDA_DEVICES of them, each with its own primary
// context; FAKE_CUDA_PEER=0 says they cannot access each other's memory.
// Allocations remember their device (cuPointerGetAttribute answers it), a
// launch or copy made from another device than 0 says device=N in the log.
// A kernel named illegal_address faults as a real one that reads out of
// bounds does: its launch succeeds, and every later call that touches the
// context (synchronising, copying, allocating, launching) returns
// CUDA_ERROR_ILLEGAL_ADDRESS, as the driver's "sticky" errors do. A kernel
// named fault is one whose fault the driver has not noticed yet when the
// next launch comes: only synchronising reports it.
//
// Streams can capture into graphs as the driver's do: work submitted to a
// capturing stream is queued (not run) and runs on each cuGraphLaunch; an
// unsafe call (allocating, freeing, synchronising the capturing stream) from
// the capturing thread, or legacy-stream work while a blocking stream
// captures, fails and invalidates the capture. Tests read what was handed to
// the driver from fake_log() (one line per call) through ctypes.
#include <cuda.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

static size_t allocated;
// Set by the emulated kernel `fault`: like a kernel's illegal address, every later wait and allocation reports it.
static CUresult sticky;
static int faulted;   // an illegal_address kernel ran: the context is dead, launches fail too
static const size_t TOTAL = (size_t)80 << 30;
static __thread CUcontext current;
typedef struct { double t; int recorded; } ev_t;
typedef struct { char *text; } mod_t;
typedef struct { char name[64]; } fn_t;

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6; }
#define API __attribute__((visibility("default")))
#define H(x) ((unsigned long)(uintptr_t)(x))

// The call log: "name key=value ..." lines, handles as decimal ints.
static char log_text[1 << 20]; static size_t log_used;
static void note(const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    int n = vsnprintf(log_text + log_used, sizeof log_text - log_used - 1, fmt, ap); va_end(ap);
    if (n > 0 && log_used + n + 2 < sizeof log_text) { log_used += n; log_text[log_used++] = '\n'; }
    log_text[log_used] = 0; }
API const char *fake_log(void) { return log_text; }
API void fake_log_clear(void) { log_used = 0; log_text[0] = 0; }
static long pinned_live;
API long fake_pinned_live(void) { return pinned_live; }

// Work a stream runs, or a graph holds: a kernel (parameters copied by value,
// 8 bytes each, as mlirgpu packs them), a copy or a memset.
enum { OP_LAUNCH, OP_COPY, OP_SET };
typedef struct { int kind; CUfunction fn; unsigned long long threads; int nparams; uint64_t params[72];
                 void *dst; const void *src; size_t n; int value; } op_t;
typedef struct { int n, cap; op_t *ops; } graph_t;
typedef struct { int blocking, capturing, invalid, mode; const void *owner; graph_t *graph; } st_t;
static st_t *streams[256]; static int nstreams;
static __thread char thread_marker;   // its address tells threads apart
static st_t *lookup(CUstream s) { for (int i = 0; i < nstreams; i++) if (streams[i] == (st_t *)s) return streams[i]; return NULL; }
static int is_legacy(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY; }
static st_t *blocking_capture(void) { for (int i = 0; i < nstreams; i++) if (streams[i]->capturing && streams[i]->blocking) return streams[i]; return NULL; }
// An unsafe call from a thread with a (non-relaxed) capture under way: refused, and the capture is invalidated.
static CUresult unsafe(void) {
    CUresult r = 0;
    for (int i = 0; i < nstreams; i++)
        if (streams[i]->capturing && streams[i]->owner == &thread_marker && streams[i]->mode != CU_STREAM_CAPTURE_MODE_RELAXED) { streams[i]->invalid = 1; r = 900; }
    return r; }
// Legacy-stream work waits for every blocking stream: impossible while one captures.
static CUresult legacy_use(CUstream s) { st_t *c; if (is_legacy(s) && (c = blocking_capture())) { c->invalid = 1; return 906; } return 0; }
static void run_kernel(op_t *op);
static void run(op_t *op) {
    if (op->kind == OP_LAUNCH) run_kernel(op);
    else if (op->kind == OP_COPY) memcpy(op->dst, op->src, op->n);
    else memset(op->dst, op->value, op->n); }
static void append(graph_t *g, const op_t *op) {
    if (g->n == g->cap) { g->cap = g->cap ? 2 * g->cap : 8; g->ops = realloc(g->ops, g->cap * sizeof *g->ops); }
    g->ops[g->n++] = *op; }
// Runs `op` now, or queues it when `s` captures.
static CUresult submit(CUstream s, op_t op) {
    if (faulted) return 700;
    CUresult r = legacy_use(s); if (r) return r;
    st_t *st = lookup(s);
    if (st && st->capturing) { if (st->invalid) return 901; append(st->graph, &op); return 0; }
    run(&op); return 0; }
API CUresult cuInit(unsigned f) { return 0; }
API CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
API CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) { case 1: *s = "CUDA_ERROR_INVALID_VALUE"; break; case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break; case 218: *s = "CUDA_ERROR_INVALID_PTX"; break;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; break; case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case 600: *s = "CUDA_ERROR_NOT_READY"; break; case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case 900: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
    case 901: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break; case 906: *s = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"; break;
    case 908: *s = "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"; break; case 713: *s = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"; break;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break; case 401: *s = "CUDA_ERROR_ILLEGAL_STATE"; break;
    default: *s = NULL; return 1; } return 0; }
API CUresult cuGetErrorString(CUresult e, const char **s) { *s = "mock error text"; return 0; }
static int device_count(void) { const char *n = getenv("FAKE_CUDA_DEVICES"); int c = n ? atoi(n) : 1; return c > 0 && c <= 8 ? c : 1; }
#define CONTEXT0 0x1234
static int context_device(CUcontext c) { return c ? (int)((uintptr_t)c - CONTEXT0) : -1; }
API CUresult cuDeviceGet(CUdevice *d, int o) { if (o < 0 || o >= device_count()) return 101; *d = o; return 0; }
API CUresult cuDeviceGetCount(int *c) { *c = device_count(); return 0; }
API CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
    const char *p = getenv("FAKE_CUDA_PEER"); *can = d != peer && !(p && !strcmp(p, "0")); return 0; }
API CUresult cuDeviceGetName(char *n, int l, CUdevice d) { snprintf(n, l, "Mock H100 80GB HBM3"); return 0; }
API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    switch (a) { case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break; case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break; case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 49152; break; case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break; default: *v = 32; } return 0; }
API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { *b = TOTAL; return 0; }
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)(uintptr_t)(CONTEXT0 + d); return 0; }
API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    note("cuCtxEnablePeerAccess device=%d peer=%d", context_device(current), context_device(peer)); return 0; }
API CUresult cuCtxSetCurrent(CUcontext c) { current = c; return 0; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return 0; }
API CUresult cuCtxGetDevice(CUdevice *d) { if (!current) return 201; *d = context_device(current); return 0; }
static CUcontext stack[16]; static __thread int depth;
API CUresult cuCtxPushCurrent_v2(CUcontext c) { stack[depth++] = current; current = c; return 0; }
API CUresult cuCtxPopCurrent_v2(CUcontext *c) { *c = current; current = stack[--depth]; return 0; }
API CUresult cuCtxSynchronize(void) { if (faulted) return 700; CUresult r = unsafe(); if (r) return r; if (sticky) return sticky; return current ? 0 : 201; }
API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = TOTAL - allocated; *t = TOTAL; return 0; }
// Live allocations and their devices, for cuPointerGetAttribute.
typedef struct { CUdeviceptr p; size_t n; int device; } alloc_t;
static alloc_t allocs[4096]; static int nallocs;
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!current) return 201; if (sticky) return sticky; if (faulted) return 700; if (n == 0) return 1; CUresult r = unsafe(); if (r) return r;
    size_t *b = n < ((size_t)1 << 40) ? malloc(n + 16) : NULL; if (!b) return 2;
    b[0] = n; allocated += n; *p = (CUdeviceptr)(b + 2);
    if (nallocs < 4096) allocs[nallocs++] = (alloc_t){*p, n, context_device(current)};
    return 0; }
API CUresult cuMemFree_v2(CUdeviceptr p) { if (!current) return 201; CUresult r = unsafe(); if (r) return r; note("cuMemFree ptr=%lu", H(p));
    for (int i = 0; i < nallocs; i++) if (allocs[i].p == p) { allocs[i] = allocs[--nallocs]; break; }
    size_t *b = (size_t *)p - 2; allocated -= b[0]; memset(b + 2, 0xAB, b[0]); free(b); return 0; }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    note("cuMemcpyHtoDAsync dst=%lu src=%lu bytes=%zu stream=%lu", H(d), H(s), n, H(st));
    return submit(st, (op_t){OP_COPY, .dst = (void *)d, .src = s, .n = n}); }
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) {
    note("cuMemcpyDtoHAsync dst=%lu src=%lu bytes=%zu stream=%lu", H(d), H(s), n, H(st));
    return submit(st, (op_t){OP_COPY, .dst = d, .src = (void *)s, .n = n}); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    note("cuMemcpyDtoDAsync dst=%lu src=%lu bytes=%zu stream=%lu", H(d), H(s), n, H(st));
    return submit(st, (op_t){OP_COPY, .dst = (void *)d, .src = (void *)s, .n = n}); }
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    note("cuMemsetD8Async dst=%lu value=%d bytes=%zu stream=%lu", H(d), v, n, H(st));
    return submit(st, (op_t){OP_SET, .dst = (void *)d, .value = v, .n = n}); }
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    if (!current) return 201; if (n == 0) return 1; CUresult r = unsafe(); if (r) return r;
    *p = malloc(n); pinned_live++; note("cuMemHostAlloc ptr=%lu bytes=%zu flags=%u", H(*p), n, flags); return 0; }
API CUresult cuMemFreeHost(void *p) {
    if (!current) return 201; CUresult r = unsafe(); if (r) return r;
    note("cuMemFreeHost ptr=%lu", H(p)); free(p); pinned_live--; return 0; }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { CUresult r = cuMemAlloc_v2(p, n); if (!r) note("cuMemAllocManaged ptr=%lu bytes=%zu", H(*p), n); return r; }
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { memcpy((void *)d, (void *)s, n); return 0; }
API CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream st) { for (size_t i = 0; i < n; i++) ((unsigned short *)d)[i] = v; return 0; }
API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream st) { for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v; return 0; }
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p) {
    *(int *)data = 0;
    for (int i = 0; i < nallocs; i++) if (p >= allocs[i].p && p < allocs[i].p + allocs[i].n) *(int *)data = allocs[i].device;
    return 0; }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    note("cuMemcpyPeerAsync dst=%lu dst_device=%d src=%lu src_device=%d bytes=%zu stream=%lu", H(d), context_device(dc),
         H(s), context_device(sc), n, H(st));
    return submit(st, (op_t){OP_COPY, .dst = (void *)d, .src = (void *)s, .n = n}); }
API CUresult cuStreamCreate(CUstream *s, unsigned f) {
    st_t *st = calloc(1, sizeof *st); st->blocking = !(f & CU_STREAM_NON_BLOCKING); streams[nstreams++] = st;
    *s = (CUstream)st; note("cuStreamCreate stream=%lu flags=%u", H(st), f); return 0; }
API CUresult cuStreamDestroy_v2(CUstream s) {
    for (int i = 0; i < nstreams; i++) if (streams[i] == (st_t *)s) streams[i] = streams[--nstreams];
    note("cuStreamDestroy stream=%lu", H(s)); free(s); return 0; }
API CUresult cuStreamSynchronize(CUstream s) {
    note("cuStreamSynchronize stream=%lu", H(s)); if (sticky) return sticky; if (faulted) return 700; CUresult r = legacy_use(s); if (r) return r;
    st_t *st = lookup(s); if (st && st->capturing) { st->invalid = 1; return 900; } return 0; }
API CUresult cuStreamQuery(CUstream s) { CUresult r = legacy_use(s); if (r) return r; st_t *st = lookup(s); if (st && st->capturing) { st->invalid = 1; return 900; } return 0; }
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { note("cuStreamWaitEvent stream=%lu event=%lu flags=%u", H(s), H(e), f); return legacy_use(s); }
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    note("cuStreamBeginCapture stream=%lu mode=%d", H(s), (int)mode);
    st_t *st = lookup(s); if (is_legacy(s) || !st) return 1; if (st->capturing) return 401;
    st->capturing = 1; st->invalid = 0; st->mode = mode; st->owner = &thread_marker; st->graph = calloc(1, sizeof(graph_t)); return 0; }
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    note("cuStreamEndCapture stream=%lu", H(s));
    st_t *st = lookup(s); if (!st || !st->capturing) return 401;
    if (st->mode != CU_STREAM_CAPTURE_MODE_RELAXED && st->owner != &thread_marker) return 908;
    st->capturing = 0;
    if (st->invalid) { free(st->graph->ops); free(st->graph); *g = NULL; return 901; }
    *g = (CUgraph)st->graph; return 0; }
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
    if (is_legacy(s) && blocking_capture()) return 906;
    st_t *st = lookup(s);
    *status = !st || !st->capturing ? CU_STREAM_CAPTURE_STATUS_NONE : st->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return 0; }
API CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) { if (nodes) return 1; *n = (size_t)((graph_t *)g)->n; return 0; }
API CUresult cuGraphDestroy(CUgraph g) { note("cuGraphDestroy graph=%lu", H(g)); free(((graph_t *)g)->ops); free(g); return 0; }
// An instantiated graph owns a copy of the work, as the driver's executable graphs do.
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    graph_t *from = (graph_t *)g, *to = calloc(1, sizeof *to);
    for (int i = 0; i < from->n; i++) append(to, &from->ops[i]);
    *e = (CUgraphExec)to; note("cuGraphInstantiateWithFlags exec=%lu graph=%lu nodes=%d flags=%llu", H(to), H(g), from->n, flags); return 0; }
API CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    note("cuGraphLaunch exec=%lu stream=%lu", H(e), H(s)); CUresult r = legacy_use(s); if (r) return r;
    graph_t *g = (graph_t *)e; for (int i = 0; i < g->n && !r; i++) r = submit(s, g->ops[i]); return r; }
API CUresult cuGraphExecDestroy(CUgraphExec e) { note("cuGraphExecDestroy exec=%lu", H(e)); free(((graph_t *)e)->ops); free(e); return 0; }
API CUresult cuEventCreate(CUevent *e, unsigned f) { *e = calloc(1, sizeof(ev_t)); return 0; }
// Never freed: a handle is never reused, so the call log names one event per handle.
API CUresult cuEventDestroy_v2(CUevent e) { return 0; }
API CUresult cuEventRecord(CUevent e, CUstream s) {
    note("cuEventRecord event=%lu stream=%lu", H(e), H(s)); CUresult r = legacy_use(s); if (r) return r;
    ((ev_t *)e)->t = now(); ((ev_t *)e)->recorded = 1; return 0; }
API CUresult cuEventSynchronize(CUevent e) { return 0; }
API CUresult cuEventQuery(CUevent e) { return 0; }
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { *ms = (float)(((ev_t *)b)->t - ((ev_t *)a)->t) + 1e-3f; return 0; }
static CUresult load(CUmodule *m, const void *image, char *err, size_t errn) {
    const char *text = image;
    if (strstr(text, "%f9")) { if (err) snprintf(err, errn, "ptxas application ptx input, line 27; error   : Unknown symbol '%%f9'"); return 218; }
    mod_t *md = malloc(sizeof *md); md->text = strdup(text); *m = (CUmodule)md;
    note("cuModuleLoad module=%lu", H(md)); return 0; }
API CUresult cuModuleLoadData(CUmodule *m, const void *image) { return load(m, image, NULL, 0); }
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
    char *err = NULL, *info = NULL; size_t errn = 0, infon = 0;
    for (unsigned i = 0; i < n; i++) { if (o[i] == CU_JIT_ERROR_LOG_BUFFER) err = v[i]; if (o[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) errn = (size_t)(uintptr_t)v[i];
        if (o[i] == CU_JIT_INFO_LOG_BUFFER) info = v[i]; if (o[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES) infon = (size_t)(uintptr_t)v[i]; }
    CUresult r = load(m, image, err, errn);
    // The driver's info log, as its JIT words it.
    if (!r && info && infon) snprintf(info, infon, "ptxas info    : Compiling entry function for 'sm_90'\nptxas info    : Used 12 registers");
    return r; }
API CUresult cuModuleUnload(CUmodule m) { note("cuModuleUnload module=%lu", H(m)); free(((mod_t *)m)->text); free(m); return 0; }
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    char pattern[80]; snprintf(pattern, sizeof pattern, ".entry %s(", name);
    if (!strstr(((mod_t *)m)->text, pattern)) return 500;
    fn_t *fn = malloc(sizeof *fn); snprintf(fn->name, sizeof fn->name, "%s", name); *f = (CUfunction)fn; return 0; }
// An H100's occupancy, roughly: 2048 threads and 32 blocks a multiprocessor, shared memory shared out.
API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int threads, size_t shared) {
    note("cuOccupancyMaxActiveBlocksPerMultiprocessor threads=%d shared=%zu", threads, shared);
    int by_threads = threads > 0 ? 2048 / threads : 0, by_shared = shared ? (int)(233472 / shared) : 32;
    *n = by_threads < by_shared ? by_threads : by_shared; if (*n > 32) *n = 32; return 0; }
// A module's global: found when the module's text names it (its address is of no use here).
API CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *n, CUmodule m, const char *name) {
    note("cuModuleGetGlobal %s", name);
    if (!strstr(((mod_t *)m)->text, name)) return CUDA_ERROR_NOT_FOUND;
    static unsigned counter; *p = (CUdeviceptr)&counter; *n = sizeof counter; return 0; }
API CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) { *v = a == CU_FUNC_ATTRIBUTE_NUM_REGS ? 12 : a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0; return 0; }
API CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
    if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) note("cuFuncSetAttribute max_dynamic_shared=%d", v);
    return 0; }
// How many parameters the emulated kernel `name` takes (record_params: 2 + its count).
static int param_count(const char *name, void **p) {
    if (!strcmp(name, "add_scalar") || !strcmp(name, "spin_then_set")) return 3;
    if (!strcmp(name, "add_vec") || !strcmp(name, "add3")) return 4;
    if (!strcmp(name, "copy_first")) return 2;
    // Host programs' kernels: memref descriptors of 3 + 2 * rank parameters each.
    if (!strcmp(name, "matmul") || !strcmp(name, "add")) return 3 * 7;
    if (!strcmp(name, "fill")) return 5 + 1;
    if (!strcmp(name, "twice")) return 2 * 5;
    if (!strcmp(name, "set_fault_flags")) return 5 * 5;
    if (!strcmp(name, "record_params")) return 2 + (int)*(unsigned *)p[1];
    return 0; }
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned sh, CUstream s, void **p, void **extra) {
    if ((unsigned long long)bx * by * bz > 1024) return 1;
    if (context_device(current) > 0) note("cuLaunchKernel function=%s stream=%lu device=%d", ((fn_t *)f)->name, H(s), context_device(current));
    else note("cuLaunchKernel function=%s stream=%lu", ((fn_t *)f)->name, H(s));
    op_t op = {OP_LAUNCH, .fn = f, .threads = (unsigned long long)gx * gy * gz * bx * by * bz};
    if (!strcmp(((fn_t *)f)->name, "tensor_map_first")) {  // a tensor map by value: its first 9 bytes
        uint64_t where; memcpy(&where, p[0], 8);
        note("tensor_map_first address=%lu swizzle=%d", (unsigned long)where, ((unsigned char *)p[0])[8]); }
    op.nparams = param_count(((fn_t *)f)->name, p);
    for (int i = 0; i < op.nparams && i < 72; i++) memcpy(&op.params[i], p[i], 8);
    return submit(s, op); }
// The extended launch: the cluster shape and a cooperative launch are logged, the launch is cuLaunchKernel's.
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **extra) {
    for (unsigned i = 0; i < c->numAttrs; i++) {
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            note("cuLaunchKernelEx cluster=%u,%u,%u", c->attrs[i].value.clusterDim.x, c->attrs[i].value.clusterDim.y,
                 c->attrs[i].value.clusterDim.z);
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
            note("cuLaunchKernelEx cooperative=%d grid=%u,%u,%u stream=%lu", c->attrs[i].value.cooperative, c->gridDimX,
                 c->gridDimY, c->gridDimZ, H(c->hStream));
    }
    return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                          c->sharedMemBytes, c->hStream, p, extra); }
// A tensor map's arguments are logged; the map's bytes hold the address and
// the swizzle, so that a test can see which map a launch passed.
API CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                                    const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                    const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
    if ((uintptr_t)map % 64 || (uintptr_t)address % 16 || rank < 1 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
    if (getenv("FAKE_CUDA_TENSOR_MAP_FAILS")) return CUDA_ERROR_INVALID_VALUE;   // a driver refusing the map
    char text[512]; int n = snprintf(text, sizeof text, "cuTensorMapEncodeTiled type=%d rank=%u address=%lu dims=",
                                     (int)type, rank, H(address));
    for (cuuint32_t i = 0; i < rank; i++) n += snprintf(text + n, sizeof text - n, "%s%llu", i ? "," : "", (unsigned long long)dims[i]);
    n += snprintf(text + n, sizeof text - n, " strides=");
    for (cuuint32_t i = 0; i + 1 < rank; i++) n += snprintf(text + n, sizeof text - n, "%s%llu", i ? "," : "", (unsigned long long)strides[i]);
    n += snprintf(text + n, sizeof text - n, " box=");
    for (cuuint32_t i = 0; i < rank; i++) n += snprintf(text + n, sizeof text - n, "%s%u", i ? "," : "", box[i]);
    n += snprintf(text + n, sizeof text - n, " element_strides=");
    for (cuuint32_t i = 0; i < rank; i++) n += snprintf(text + n, sizeof text - n, "%s%u", i ? "," : "", element_strides[i]);
    note("%s interleave=%d swizzle=%d l2=%d oob=%d", text, (int)interleave, (int)swizzle, (int)l2, (int)oob);
    memset(map, 0, sizeof *map);
    uint64_t where = (uint64_t)(uintptr_t)address; memcpy(map, &where, 8); ((unsigned char *)map)[8] = (unsigned char)swizzle;
    return 0; }
// Host memory is device memory here: registration is only logged.
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) { note("cuMemHostRegister ptr=%lu bytes=%zu flags=%u", H(p), n, flags); return 0; }
API CUresult cuMemHostUnregister(void *p) { note("cuMemHostUnregister ptr=%lu", H(p)); return 0; }
static void run_kernel(op_t *op) {
    void *p[72]; for (int i = 0; i < op->nparams; i++) p[i] = &op->params[i];
    const char *name = ((fn_t *)op->fn)->name; unsigned long long threads = op->threads;
    if (!strcmp(name, "add_scalar")) { float *x = *(float **)p[0]; float v = *(float *)p[1]; unsigned n = *(unsigned *)p[2];
        for (unsigned i = 0; i < n && i < threads; i++) x[i] += v; }
    else if (!strcmp(name, "add_vec")) { float *o = *(float **)p[0], *in = *(float **)p[1]; float v = *(float *)p[2]; unsigned n = *(unsigned *)p[3];
        for (unsigned i = 0; i < n && i < threads; i++) o[i] += in[i] + v; }
    else if (!strcmp(name, "spin_then_set")) { float *x = *(float **)p[0]; x[0] = *(float *)p[2]; }
    else if (!strcmp(name, "add3")) { float *a = *(float **)p[0], *b = *(float **)p[1], *c = *(float **)p[2]; unsigned n = *(unsigned *)p[3];
        for (unsigned i = 0; i < n && i < threads; i++) c[i] = a[i] + b[i]; }
    else if (!strcmp(name, "copy_first")) { float *d = *(float **)p[0], *sr = *(float **)p[1]; d[0] = sr[0]; }
    // Host programs' kernels take memref descriptors: a rank-r memref is 3 + 2r
    // parameters {allocated, aligned, offset, sizes, strides}; contiguous here.
    else if (!strcmp(name, "matmul")) { float *a = *(float **)p[1], *b = *(float **)p[8], *c = *(float **)p[15];
        int64_t m = *(int64_t *)p[3], k = *(int64_t *)p[4], n = *(int64_t *)p[11];
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float acc = 0;
                for (int64_t q = 0; q < k; q++)
                    acc += a[i * k + q] * b[q * n + j];
                c[i * n + j] = acc;
            } }
    else if (!strcmp(name, "add")) { float *x = *(float **)p[1], *y = *(float **)p[8], *z = *(float **)p[15];
        int64_t count = *(int64_t *)p[3] * *(int64_t *)p[4]; for (int64_t i = 0; i < count; i++) z[i] = x[i] + y[i]; }
    else if (!strcmp(name, "fill")) { float *a = *(float **)p[1]; int64_t n = *(int64_t *)p[3]; float v = *(float *)p[5];
        for (int64_t i = 0; i < n && i < (int64_t)threads; i++) a[i] = v; }
    else if (!strcmp(name, "twice")) { float *x = *(float **)p[1], *y = *(float **)p[6]; int64_t n = *(int64_t *)p[3];
        for (int64_t i = 0; i < n && i < (int64_t)threads; i++) y[i] = 2 * x[i]; }
    else if (!strcmp(name, "fault")) sticky = 700;
    else if (!strcmp(name, "illegal_address")) faulted = 1;
    // An @mg.vectorize kernel of two contiguous arrays to two each of whose elements faulted: after
    // the four arrays' descriptors, its fault flags' {allocated, aligned, offset, size, stride}, all set.
    else if (!strcmp(name, "set_fault_flags")) memset(*(uint8_t **)p[21], 1, (size_t)*(int64_t *)p[23]);
    else if (!strcmp(name, "record_params")) { uint64_t *d = *(uint64_t **)p[0]; unsigned n = *(unsigned *)p[1]; for (unsigned i = 0; i < n; i++) memcpy(&d[i], p[i + 2], 8); }
}
