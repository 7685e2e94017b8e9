// A stand-in for libcuda.so.1 so that CI (no GPU) can test what the launch
// path hands the driver: host memory plays device memory, and the few kernels
// the tests load are emulated by name (record_params copies the packed
// parameters out). Built by the fake_libcuda fixture in tests/conftest.py.
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

static size_t allocated;
static const size_t TOTAL = (size_t)80 << 30;
static __thread CUcontext current;
typedef struct { double t; int recorded; } ev_t;
typedef struct { char *text; } mod_t;
typedef struct { char name[64]; } fn_t;

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6; }
#define API __attribute__((visibility("default")))
API CUresult cuInit(unsigned f) { return 0; }
API CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
API CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) { case 1: *s = "CUDA_ERROR_INVALID_VALUE"; break; case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break; case 218: *s = "CUDA_ERROR_INVALID_PTX"; break;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; break; case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case 600: *s = "CUDA_ERROR_NOT_READY"; break; default: *s = NULL; return 1; } return 0; }
API CUresult cuGetErrorString(CUresult e, const char **s) { *s = "mock error text"; return 0; }
API CUresult cuDeviceGet(CUdevice *d, int o) { if (o != 0) return 101; *d = 0; return 0; }
API CUresult cuDeviceGetCount(int *c) { *c = 1; return 0; }
API CUresult cuDeviceGetName(char *n, int l, CUdevice d) { snprintf(n, l, "Mock H100 80GB HBM3"); return 0; }
API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    switch (a) { case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break; case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break; case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 49152; break; case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break; default: *v = 32; } return 0; }
API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { *b = TOTAL; return 0; }
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)0x1234; return 0; }
API CUresult cuCtxSetCurrent(CUcontext c) { current = c; return 0; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return 0; }
static CUcontext stack[16]; static __thread int depth;
API CUresult cuCtxPushCurrent_v2(CUcontext c) { stack[depth++] = current; current = c; return 0; }
API CUresult cuCtxPopCurrent_v2(CUcontext *c) { *c = current; current = stack[--depth]; return 0; }
API CUresult cuCtxSynchronize(void) { return current ? 0 : 201; }
API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = TOTAL - allocated; *t = TOTAL; return 0; }
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!current) return 201; if (n == 0) return 1;
    size_t *b = n < ((size_t)1 << 40) ? malloc(n + 16) : NULL; if (!b) return 2;
    b[0] = n; allocated += n; *p = (CUdeviceptr)(b + 2); return 0; }
API CUresult cuMemFree_v2(CUdeviceptr p) { if (!current) return 201; size_t *b = (size_t *)p - 2; allocated -= b[0]; memset(b + 2, 0xAB, b[0]); free(b); return 0; }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { return cuMemAlloc_v2(p, n); }
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { memcpy((void *)d, (void *)s, n); return 0; }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { memcpy((void *)d, s, n); return 0; }
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { memcpy(d, (void *)s, n); return 0; }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { memcpy((void *)d, (void *)s, n); return 0; }
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) { memset((void *)d, v, n); return 0; }
API CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream st) { for (size_t i = 0; i < n; i++) ((unsigned short *)d)[i] = v; return 0; }
API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream st) { for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v; return 0; }
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p) { *(int *)data = 0; return 0; }
API CUresult cuStreamCreate(CUstream *s, unsigned f) { *s = malloc(8); return 0; }
API CUresult cuStreamDestroy_v2(CUstream s) { free(s); return 0; }
API CUresult cuStreamSynchronize(CUstream s) { return 0; }
API CUresult cuStreamQuery(CUstream s) { return 0; }
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { return 0; }
API CUresult cuEventCreate(CUevent *e, unsigned f) { *e = calloc(1, sizeof(ev_t)); return 0; }
API CUresult cuEventDestroy_v2(CUevent e) { free(e); return 0; }
API CUresult cuEventRecord(CUevent e, CUstream s) { ((ev_t *)e)->t = now(); ((ev_t *)e)->recorded = 1; return 0; }
API CUresult cuEventSynchronize(CUevent e) { return 0; }
API CUresult cuEventQuery(CUevent e) { return 0; }
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { *ms = (float)(((ev_t *)b)->t - ((ev_t *)a)->t) + 1e-3f; return 0; }
static CUresult load(CUmodule *m, const void *image, char *err, size_t errn) {
    const char *text = image;
    if (strstr(text, "%f9")) { if (err) snprintf(err, errn, "ptxas application ptx input, line 27; error   : Unknown symbol '%%f9'"); return 218; }
    mod_t *md = malloc(sizeof *md); md->text = strdup(text); *m = (CUmodule)md; return 0; }
API CUresult cuModuleLoadData(CUmodule *m, const void *image) { return load(m, image, NULL, 0); }
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
    char *err = NULL; size_t errn = 0;
    for (unsigned i = 0; i < n; i++) { if (o[i] == CU_JIT_ERROR_LOG_BUFFER) err = v[i]; if (o[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) errn = (size_t)(uintptr_t)v[i]; }
    return load(m, image, err, errn); }
API CUresult cuModuleUnload(CUmodule m) { free(((mod_t *)m)->text); free(m); return 0; }
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    char pattern[80]; snprintf(pattern, sizeof pattern, ".entry %s(", name);
    if (!strstr(((mod_t *)m)->text, pattern)) return 500;
    fn_t *fn = malloc(sizeof *fn); snprintf(fn->name, sizeof fn->name, "%s", name); *f = (CUfunction)fn; return 0; }
API CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) { *v = a == CU_FUNC_ATTRIBUTE_NUM_REGS ? 12 : a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0; return 0; }
API CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { return 0; }
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned sh, CUstream s, void **p, void **extra) {
    if ((unsigned long long)bx * by * bz > 1024) return 1;
    const char *name = ((fn_t *)f)->name; unsigned long long threads = (unsigned long long)gx * gy * gz * bx * by * bz;
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
    else if (!strcmp(name, "record_params")) { uint64_t *d = *(uint64_t **)p[0]; unsigned n = *(unsigned *)p[1]; for (unsigned i = 0; i < n; i++) memcpy(&d[i], p[i + 2], 8); }
    return 0; }
