/* The fixed runtime of a library that mlirgpu.export writes.
 *
 * The generated source (one typed C function per kernel, and its tables:
 * variants, images, CPU entry points) includes this file, so that everything
 * here stays static: the library shows the world its own functions only.
 *
 * What it does: picks a backend once (the CUDA driver, opened with dlopen,
 * or the CPU builds where there is no driver or MLIRGPU_BACKEND=cpu), picks
 * the variant of a kernel that serves a call's sizes, loads that variant's
 * image on the calling device the first time (the cubin for its chip, else
 * PTX the driver compiles for it), and launches on the caller's stream.
 * Errors are a status and a message per thread. It needs only libc and, at
 * run time, the CUDA driver. */
#define _POSIX_C_SOURCE 200809L   /* pthreads and dlopen under -std=c11 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MGX_MAX_DEVICES 64
#define MGX_ALIGNMENT 16   /* a variant may assume its arrays start at a multiple of this many bytes */
#define MGX_SUCCESS 0
#define MGX_INVALID_VALUE 1
#define MGX_NO_VARIANT 2
#define MGX_NO_IMAGE 3
#define MGX_NO_BACKEND 4
#define MGX_CUDA_ERROR 5

/* The few driver types and constants used; the CUDA headers are not needed to build. */
typedef int mgx_curesult;
typedef void *mgx_cucontext, *mgx_cumodule, *mgx_cufunction, *mgx_custream;
typedef int mgx_cudevice;
#define MGX_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define MGX_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define MGX_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define MGX_DEFAULT_SHARED_LIMIT (48 * 1024)

/* One image of a variant: a cubin for one chip, or PTX for that chip and newer ones. */
typedef struct {
    const char *chip;
    int capability;                /* major * 10 + minor */
    int arch_specific;             /* sm_90a: runs on exactly that capability */
    int is_ptx;
    const unsigned char *data;     /* PTX ends with a NUL, as cuModuleLoadData wants */
    size_t size;
} mgx_image;

/* A CPU build: params as the GPU launch takes them, then thread, block, block_dim, grid_dim x/y/z. */
typedef void (*mgx_cpu_entry)(void **params, const int64_t indices[12]);

/* A variant: one compiled specialization, the sizes it serves (per size: a value it needs,
 * > 0; a divisor, < 0; or 0, any), the values of the generics an autotuning table chose for
 * them (which its launch rule may read), whether it needs aligned arrays, and its functions
 * once loaded, per device. */
typedef struct {
    const char *description;
    const char *symbol;
    const int64_t *rules;
    const int64_t *tuned;
    int aligned;
    int nimages;
    const mgx_image *images;
    mgx_cpu_entry cpu;
    mgx_cufunction loaded[MGX_MAX_DEVICES];
} mgx_variant;

typedef struct {
    const char *name;
    int nsizes;
    const char *const *size_names;
    int nvariants;
    mgx_variant *variants;
} mgx_kernel;

static _Thread_local char mgx_message[1024] = "no error";

static int mgx_fail(int status, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(mgx_message, sizeof mgx_message, format, args);
    va_end(args);
    return status;
}

static const char *mgx_last_error(void)
{
    return mgx_message;
}

/* ------------------------------------------------------------------------ */
/* The driver, opened once                                                   */

static struct {
    int cuda;                      /* 1: the driver and a device; 0: the CPU builds */
    const char *why_cpu;           /* why there is no driver, for messages */
    mgx_curesult (*Init)(unsigned);
    mgx_curesult (*DeviceGetCount)(int *);
    mgx_curesult (*DeviceGet)(mgx_cudevice *, int);
    mgx_curesult (*DeviceGetAttribute)(int *, int, mgx_cudevice);
    mgx_curesult (*DevicePrimaryCtxRetain)(mgx_cucontext *, mgx_cudevice);
    mgx_curesult (*CtxGetCurrent)(mgx_cucontext *);
    mgx_curesult (*CtxSetCurrent)(mgx_cucontext);
    mgx_curesult (*CtxGetDevice)(mgx_cudevice *);
    mgx_curesult (*ModuleLoadData)(mgx_cumodule *, const void *);
    mgx_curesult (*ModuleGetFunction)(mgx_cufunction *, mgx_cumodule, const char *);
    mgx_curesult (*FuncSetAttribute)(mgx_cufunction, int, int);
    mgx_curesult (*LaunchKernel)(mgx_cufunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, mgx_custream, void **, void **);
    mgx_curesult (*GetErrorString)(mgx_curesult, const char **);
    mgx_curesult (*MemAlloc)(void **, size_t);
    mgx_curesult (*MemFree)(void *);
    mgx_curesult (*MemcpyHtoDAsync)(void *, const void *, size_t, mgx_custream);
    mgx_curesult (*MemcpyDtoHAsync)(void *, const void *, size_t, mgx_custream);
    mgx_curesult (*StreamSynchronize)(mgx_custream);
} mgx_cu;

static pthread_once_t mgx_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mgx_load_lock = PTHREAD_MUTEX_INITIALIZER;

static void mgx_open_driver(void)
{
    const char *forced = getenv("MLIRGPU_BACKEND");
    if (forced != NULL && strcmp(forced, "cpu") == 0) {
        mgx_cu.why_cpu = "MLIRGPU_BACKEND=cpu";
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        mgx_cu.why_cpu = "the CUDA driver (libcuda.so.1) is not installed";
        return;
    }
#define MGX_LOAD(field, name)                                          \
    if ((*(void **)&mgx_cu.field = dlsym(lib, name)) == NULL) {        \
        mgx_cu.why_cpu = "the CUDA driver lacks " name;                \
        return;                                                        \
    }
    MGX_LOAD(Init, "cuInit")
    MGX_LOAD(DeviceGetCount, "cuDeviceGetCount")
    MGX_LOAD(DeviceGet, "cuDeviceGet")
    MGX_LOAD(DeviceGetAttribute, "cuDeviceGetAttribute")
    MGX_LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
    MGX_LOAD(CtxGetCurrent, "cuCtxGetCurrent")
    MGX_LOAD(CtxSetCurrent, "cuCtxSetCurrent")
    MGX_LOAD(CtxGetDevice, "cuCtxGetDevice")
    MGX_LOAD(ModuleLoadData, "cuModuleLoadData")
    MGX_LOAD(ModuleGetFunction, "cuModuleGetFunction")
    MGX_LOAD(FuncSetAttribute, "cuFuncSetAttribute")
    MGX_LOAD(LaunchKernel, "cuLaunchKernel")
    MGX_LOAD(GetErrorString, "cuGetErrorString")
    MGX_LOAD(MemAlloc, "cuMemAlloc_v2")
    MGX_LOAD(MemFree, "cuMemFree_v2")
    MGX_LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
    MGX_LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
    MGX_LOAD(StreamSynchronize, "cuStreamSynchronize")
#undef MGX_LOAD
    int count = 0;
    if (mgx_cu.Init(0) != 0 || mgx_cu.DeviceGetCount(&count) != 0 || count == 0) {
        mgx_cu.why_cpu = "the CUDA driver finds no GPU";
        return;
    }
    mgx_cu.cuda = 1;
}

static int mgx_backend_is_cuda(void)
{
    pthread_once(&mgx_once, mgx_open_driver);
    return mgx_cu.cuda;
}

static int mgx_cuda_fail(mgx_curesult result, const char *what)
{
    const char *text = NULL;
    if (mgx_cu.GetErrorString(result, &text) != 0 || text == NULL)
        text = "unknown error";
    return mgx_fail(MGX_CUDA_ERROR, "%s: CUDA error %d (%s)", what, result, text);
}

/* The calling thread's device, making device 0's primary context current where none is. */
static int mgx_current_device(int *ordinal)
{
    mgx_cucontext context = NULL;
    mgx_curesult result = mgx_cu.CtxGetCurrent(&context);
    if (result == 0 && context == NULL) {
        mgx_cudevice device;
        if ((result = mgx_cu.DeviceGet(&device, 0)) == 0 &&
            (result = mgx_cu.DevicePrimaryCtxRetain(&context, device)) == 0)
            result = mgx_cu.CtxSetCurrent(context);
    }
    mgx_cudevice device = 0;
    if (result == 0)
        result = mgx_cu.CtxGetDevice(&device);
    if (result != 0)
        return mgx_cuda_fail(result, "finding the current CUDA context");
    if (device < 0 || device >= MGX_MAX_DEVICES)
        return mgx_fail(MGX_INVALID_VALUE, "device %d: this library serves devices 0 to %d", device,
                        MGX_MAX_DEVICES - 1);
    *ordinal = device;
    return MGX_SUCCESS;
}

/* The image a device of `capability` runs: a cubin for it (an arch-specific one only on exactly
 * its chip, another on a later minor version), else the newest PTX not newer than it. */
static const mgx_image *mgx_pick_image(const mgx_variant *v, int capability)
{
    const mgx_image *best = NULL;
    for (int i = 0; i < v->nimages; i++) {
        const mgx_image *image = &v->images[i];
        int fits = image->is_ptx ? image->capability <= capability
                   : image->arch_specific ? image->capability == capability
                   : image->capability / 10 == capability / 10 && image->capability <= capability;
        if (!fits)
            continue;
        /* A cubin beats PTX; among equals, the newer chip. */
        if (best == NULL || (best->is_ptx && !image->is_ptx) ||
            (best->is_ptx == image->is_ptx && image->capability > best->capability))
            best = image;
    }
    return best;
}

/* The variant's function on the current device, loaded the first time. */
static int mgx_function(const mgx_kernel *k, mgx_variant *v, mgx_cufunction *function)
{
    int device;
    int status = mgx_current_device(&device);
    if (status != MGX_SUCCESS)
        return status;
    *function = __atomic_load_n(&v->loaded[device], __ATOMIC_ACQUIRE);
    if (*function != NULL)
        return MGX_SUCCESS;
    pthread_mutex_lock(&mgx_load_lock);
    *function = v->loaded[device];
    if (*function == NULL) {
        mgx_cudevice handle;
        int major = 0, minor = 0;
        mgx_curesult result = mgx_cu.DeviceGet(&handle, device);
        if (result == 0)
            result = mgx_cu.DeviceGetAttribute(&major, MGX_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle);
        if (result == 0)
            result = mgx_cu.DeviceGetAttribute(&minor, MGX_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle);
        const mgx_image *image = result == 0 ? mgx_pick_image(v, major * 10 + minor) : NULL;
        mgx_cumodule module = NULL;
        if (result != 0) {
            status = mgx_cuda_fail(result, "reading the device's compute capability");
        } else if (image == NULL) {
            char chips[256] = "";
            for (int i = 0; i < v->nimages; i++)
                snprintf(chips + strlen(chips), sizeof chips - strlen(chips), "%s%s%s", i ? ", " : "",
                         v->images[i].is_ptx ? "PTX for " : "", v->images[i].chip);
            status = mgx_fail(MGX_NO_IMAGE, "%s: no image runs on device %d (sm_%d%d); the library holds %s",
                              k->name, device, major, minor, chips);
        } else if ((result = mgx_cu.ModuleLoadData(&module, image->data)) != 0 ||
                   (result = mgx_cu.ModuleGetFunction(function, module, v->symbol)) != 0) {
            char what[160];
            snprintf(what, sizeof what, "%s: loading its %s image", k->name, image->chip);
            status = mgx_cuda_fail(result, what);
        } else {
            __atomic_store_n(&v->loaded[device], *function, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mgx_load_lock);
    return status;
}

/* ------------------------------------------------------------------------ */
/* Variants and launches                                                     */

/* Before anything else of a call: every size positive. */
static int mgx_check_sizes(const mgx_kernel *k, const int64_t *sizes)
{
    for (int s = 0; s < k->nsizes; s++)
        if (sizes[s] <= 0)
            return mgx_fail(MGX_INVALID_VALUE, "%s: size %s is %lld; sizes are positive", k->name,
                            k->size_names[s], (long long)sizes[s]);
    return MGX_SUCCESS;
}

/* The first variant whose rules the sizes and the arrays' alignment meet (the generated tables list
 * the most specific first). */
static int mgx_variant_for(const mgx_kernel *k, const int64_t *sizes, int aligned, mgx_variant **variant)
{
    for (int i = 0; i < k->nvariants; i++) {
        if (k->variants[i].aligned && !aligned)
            continue;
        const int64_t *rules = k->variants[i].rules;
        int s = 0;
        while (s < k->nsizes && (rules[s] == 0 || (rules[s] > 0 ? sizes[s] == rules[s] : sizes[s] % -rules[s] == 0)))
            s++;
        if (s == k->nsizes) {
            *variant = &k->variants[i];
            return MGX_SUCCESS;
        }
    }
    char shown[512] = "";
    for (int s = 0; s < k->nsizes; s++)
        snprintf(shown + strlen(shown), sizeof shown - strlen(shown), "%s%s=%lld", s ? ", " : "",
                 k->size_names[s], (long long)sizes[s]);
    return mgx_fail(MGX_NO_VARIANT, "%s: no exported specialization serves %s", k->name, shown);
}

static void mgx_cpu_run(mgx_cpu_entry entry, void **params, const unsigned grid[3], const unsigned block[3])
{
    int64_t ix[12] = {0, 0, 0, 0, 0, 0, block[0], block[1], block[2], grid[0], grid[1], grid[2]};
    for (ix[5] = 0; ix[5] < grid[2]; ix[5]++)
        for (ix[4] = 0; ix[4] < grid[1]; ix[4]++)
            for (ix[3] = 0; ix[3] < grid[0]; ix[3]++)
                for (ix[2] = 0; ix[2] < block[2]; ix[2]++)
                    for (ix[1] = 0; ix[1] < block[1]; ix[1]++)
                        for (ix[0] = 0; ix[0] < block[0]; ix[0]++)
                            entry(params, ix);
}

/* Launches variant `v` of `k` (mgx_variant_for's choice). */
static int mgx_launch(const mgx_kernel *k, mgx_variant *v, void *stream, void **params, const unsigned grid[3],
                      const unsigned block[3], unsigned shared_mem)
{
    for (int d = 0; d < 3; d++)
        if (grid[d] == 0 || block[d] == 0)
            return mgx_fail(MGX_INVALID_VALUE, "%s: the grid and the block need at least 1 in each dimension",
                            k->name);
    int status;
    if (!mgx_backend_is_cuda()) {
        if (v->cpu == NULL)
            return mgx_fail(MGX_NO_BACKEND, "%s: there is no GPU (%s) and the library has no CPU build of %s",
                            k->name, mgx_cu.why_cpu, v->description);
        if (shared_mem != 0)
            return mgx_fail(MGX_INVALID_VALUE, "%s: the CPU build takes no dynamic shared memory", k->name);
        mgx_cpu_run(v->cpu, params, grid, block);
        return MGX_SUCCESS;
    }
    mgx_cufunction function;
    if ((status = mgx_function(k, v, &function)) != MGX_SUCCESS)
        return status;
    mgx_curesult result = 0;
    if (shared_mem > MGX_DEFAULT_SHARED_LIMIT)   /* past 48 KB a kernel must opt in */
        result = mgx_cu.FuncSetAttribute(function, MGX_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         (int)shared_mem);
    if (result == 0)
        result = mgx_cu.LaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                     shared_mem, stream, params, NULL);
    if (result != 0) {
        char what[160];
        snprintf(what, sizeof what, "%s: launching %s", k->name, v->description);
        return mgx_cuda_fail(result, what);
    }
    return MGX_SUCCESS;
}

/* A memref descriptor of the CPU builds ({allocated, aligned, offset, sizes[rank], strides[rank]},
 * every field 8 bytes) for a row-major array at `pointer`. */
static void mgx_descriptor(int64_t *d, void *pointer, int rank, const int64_t *sizes)
{
    memcpy(&d[0], &pointer, sizeof pointer);
    memcpy(&d[1], &pointer, sizeof pointer);
    d[2] = 0;
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        d[3 + i] = sizes[i];
        d[3 + rank + i] = stride;
        stride *= sizes[i];
    }
}

/* ------------------------------------------------------------------------ */
/* Memory, for programs that hold no other way to the device                 */

static int mgx_alloc(void **pointer, size_t bytes)
{
    if (pointer == NULL)
        return mgx_fail(MGX_INVALID_VALUE, "alloc: pointer is NULL");
    if (!mgx_backend_is_cuda()) {
        *pointer = malloc(bytes ? bytes : 1);
        return *pointer ? MGX_SUCCESS : mgx_fail(MGX_INVALID_VALUE, "alloc: out of memory (%zu bytes)", bytes);
    }
    int device;
    int status = mgx_current_device(&device);
    if (status != MGX_SUCCESS)
        return status;
    mgx_curesult result = mgx_cu.MemAlloc(pointer, bytes);
    return result ? mgx_cuda_fail(result, "alloc") : MGX_SUCCESS;
}

static int mgx_free(void *pointer)
{
    if (!mgx_backend_is_cuda()) {
        free(pointer);
        return MGX_SUCCESS;
    }
    mgx_curesult result = pointer ? mgx_cu.MemFree(pointer) : 0;
    return result ? mgx_cuda_fail(result, "free") : MGX_SUCCESS;
}

/* Copies between host and device memory (to_device: host to device) on the default stream, so
 * after the work queued there before, and waits for them. */
static int mgx_copy(void *destination, const void *source, size_t bytes, int to_device)
{
    if (!mgx_backend_is_cuda()) {
        memmove(destination, source, bytes);
        return MGX_SUCCESS;
    }
    mgx_curesult result = to_device ? mgx_cu.MemcpyHtoDAsync(destination, source, bytes, NULL)
                                    : mgx_cu.MemcpyDtoHAsync(destination, source, bytes, NULL);
    if (result == 0)
        result = mgx_cu.StreamSynchronize(NULL);
    return result ? mgx_cuda_fail(result, to_device ? "copy to the device" : "copy to the host") : MGX_SUCCESS;
}
