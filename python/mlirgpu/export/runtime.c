/* The fixed runtime of a library that mlirgpu.export writes.
 *
 * The generated source (one typed C function per kernel, and its tables:
 * variants, images, CPU entry points) includes this file, so that everything
 * here stays inside the library: static, or (the calls the CPU builds make)
 * hidden by the export's version script.
 *
 * What it does: picks a backend once (the CUDA driver, opened with dlopen,
 * or the CPU builds where there is no driver or MLIRGPU_BACKEND=cpu), picks
 * the variant of a kernel that serves a call's sizes, loads that variant's
 * image on the calling device the first time (the cubin for its chip, else
 * PTX the driver compiles for it), encodes the call's tensor maps (kept for
 * the next call on the same arrays), and launches on the caller's stream.
 * Errors are a status and a message per thread. It needs only libc and, at
 * run time, the CUDA driver. */
#define _GNU_SOURCE   /* pthreads, dlopen and ucontext under -std=c11 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "cpu_tma.h"

#define MGX_MAX_DEVICES 64
#define MGX_ALIGNMENT 16   /* a variant may assume its arrays start at a multiple of this many bytes */
#define MGX_SUCCESS 0
#define MGX_INVALID_VALUE 1
#define MGX_NO_VARIANT 2
#define MGX_NO_IMAGE 3
#define MGX_NO_BACKEND 4
#define MGX_CUDA_ERROR 5
#define MGX_KERNEL_FAULT 6
#define MGX_TENSOR_MAP_BYTES 128   /* a CUtensorMap */
#define MGX_MAP_CACHE 256          /* tensor maps kept encoded, per library */

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

/* What an export fixes of a kernel's tensor-map parameter (the element type, box, swizzle and
 * fill its code assumes), in the driver's terms and order (innermost first); the call gives
 * the array's address and geometry. */
typedef struct {
    const char *name;
    int data_type;                 /* CUtensorMapDataType */
    int rank, element_size;
    unsigned box[5], element_strides[5];
    int swizzle, l2_promotion, oob_fill;
} mgx_map;

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
    int cpu_fibers;                /* its CPU build synchronizes threads: each runs as a fiber */
    int64_t cpu_static_shared;     /* bytes of its CPU build's static shared arrays */
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
    /* NULL with a driver older than CUDA 12: only kernels with tensor maps need it. */
    mgx_curesult (*TensorMapEncodeTiled)(void *, int, unsigned, void *, const uint64_t *, const uint64_t *,
                                         const unsigned *, const unsigned *, int, int, int, int);
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
    *(void **)&mgx_cu.TensorMapEncodeTiled = dlsym(lib, "cuTensorMapEncodeTiled");
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
/* Tensor maps, encoded per call's array and kept                            */

_Static_assert(sizeof(mg_cpu_tensor_map) <= MGX_TENSOR_MAP_BYTES, "a CPU tensor map fits a CUtensorMap");

/* An encoded map and what it was encoded from. A map holds only its array's address and
 * geometry, so an entry is never stale: memory freed and allocated again at the same address
 * with the same geometry gets the same map. */
typedef struct {
    int used, device;
    const mgx_map *map;
    uintptr_t address;
    uint64_t dims[5], strides[5];
    _Alignas(64) unsigned char bytes[MGX_TENSOR_MAP_BYTES];
} mgx_map_entry;

static mgx_map_entry mgx_map_cache[MGX_MAP_CACHE];   /* direct-mapped: a new map takes its slot's place */
static pthread_mutex_t mgx_map_lock = PTHREAD_MUTEX_INITIALIZER;

/* Encodes `m` for the array at `pointer` of `shape` (the array's order) and row `strides` (in
 * elements, of every dimension but the last; NULL: the row-major array's) into `out`: for the
 * driver (cuTensorMapEncodeTiled) on the current device, or as the CPU builds read it. */
static int mgx_encode_map(const mgx_kernel *k, const mgx_map *m, const void *pointer, const int64_t *shape,
                          const int64_t *strides, unsigned char *out)
{
    uintptr_t address = (uintptr_t)pointer;
    uint64_t dims[5] = {0}, bytes[5] = {0};   /* innermost first, as the driver takes them */
    if (address % 16)
        return mgx_fail(MGX_INVALID_VALUE, "%s: %s is at %p: a tensor map's array starts at a multiple of 16 bytes",
                        k->name, m->name, pointer);
    int64_t running = 1;   /* elements of the row-major array inside dimension d */
    for (int d = m->rank - 1; d >= 0; d--) {
        int i = m->rank - 1 - d;
        if (shape[d] < 1 || shape[d] > ((int64_t)1 << 32))
            return mgx_fail(MGX_INVALID_VALUE, "%s: %s's extent %d is %lld: a tensor map takes 1 to 2**32", k->name,
                            m->name, d, (long long)shape[d]);
        int64_t stride = i == 0 ? 1 : strides != NULL ? strides[d] : running;
        if (i > 0 && (stride < 1 || stride > ((int64_t)1 << 40) / m->element_size ||
                      stride * m->element_size % 16 != 0))
            return mgx_fail(MGX_INVALID_VALUE, "%s: %s's stride %d is %lld elements: a tensor map needs a positive "
                            "multiple of 16 bytes below 2**40 (pad the rows)", k->name, m->name, d, (long long)stride);
        dims[i] = (uint64_t)shape[d];
        bytes[i] = (uint64_t)(stride * m->element_size);
        running = running > ((int64_t)1 << 40) / shape[d] ? ((int64_t)1 << 40) + 1 : running * shape[d];
    }
    int device = -1, status = MGX_SUCCESS;
    if (mgx_backend_is_cuda() && (status = mgx_current_device(&device)) != MGX_SUCCESS)
        return status;
    uint64_t hash = (uint64_t)address ^ (uint64_t)(uintptr_t)m * 31 ^ (uint64_t)(device + 1) * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < m->rank; i++)
        hash = (hash ^ dims[i] ^ bytes[i] << 17) * 0x100000001b3ull;
    mgx_map_entry *entry = &mgx_map_cache[(hash ^ hash >> 29) % MGX_MAP_CACHE];
    pthread_mutex_lock(&mgx_map_lock);
    if (!(entry->used && entry->device == device && entry->map == m && entry->address == address &&
          memcmp(entry->dims, dims, sizeof dims) == 0 && memcmp(entry->strides, bytes, sizeof bytes) == 0)) {
        _Alignas(64) unsigned char encoded[MGX_TENSOR_MAP_BYTES] = {0};
        if (device < 0) {
            mg_cpu_tensor_map h = mg_cpu_tensor_map_make(m->data_type, m->rank, address, dims, bytes + 1, m->box,
                                                         m->element_strides, m->swizzle, m->oob_fill, 0);
            memcpy(encoded, &h, sizeof h);
        } else if (mgx_cu.TensorMapEncodeTiled == NULL) {
            status = mgx_fail(MGX_CUDA_ERROR, "%s: encoding %s: the CUDA driver lacks cuTensorMapEncodeTiled (CUDA 12 "
                              "or later encodes tensor maps)", k->name, m->name);
        } else {
            mgx_curesult result = mgx_cu.TensorMapEncodeTiled(encoded, m->data_type, (unsigned)m->rank,
                                                              (void *)address, dims, bytes + 1, m->box,
                                                              m->element_strides, 0, m->swizzle, m->l2_promotion,
                                                              m->oob_fill);
            if (result != 0) {
                char what[256];
                snprintf(what, sizeof what, "%s: encoding the tensor map %s of the array at %p "
                         "(cuTensorMapEncodeTiled)", k->name, m->name, pointer);
                status = mgx_cuda_fail(result, what);
            }
        }
        if (status == MGX_SUCCESS) {
            *entry = (mgx_map_entry){.used = 1, .device = device, .map = m, .address = address};
            memcpy(entry->dims, dims, sizeof dims);
            memcpy(entry->strides, bytes, sizeof bytes);
            memcpy(entry->bytes, encoded, sizeof encoded);
        }
    }
    if (status == MGX_SUCCESS)
        memcpy(out, entry->bytes, MGX_TENSOR_MAP_BYTES);
    pthread_mutex_unlock(&mgx_map_lock);
    return status;
}

/* ------------------------------------------------------------------------ */
/* CPU builds whose threads work together: a block's threads as fibers       */
/*                                                                           */
/* The runtime calls of a CPU build (mlirgpu's CPU backend: barriers, shared */
/* memory, mbarriers, TMA copies) that the export keeps; a build calling any */
/* other is left out of the library.                                         */

#define MGX_FIBER_STACK (64 * 1024)
#define MGX_SHARED_ALIGN 1024   /* the 128-byte swizzle's period: swizzles see the GPU's address bits */
#define MGX_MAX_BLOCK_THREADS 1024
enum { MGX_READY, MGX_AT_BARRIER, MGX_WAITING, MGX_DONE, MGX_FAILED };

typedef struct {
    ucontext_t context;
    int state;
    const uint64_t *wait_on;       /* MGX_WAITING: the mbarrier, until its phase parity changes */
    uint64_t parity;
} mgx_fiber;

typedef struct {
    ucontext_t scheduler;
    mgx_fiber *fibers;
    char *stacks;
    int threads, current, failed;
    const char *kernel;
    mgx_cpu_entry entry;
    void **params;
    int64_t ix[12];                /* the block's indices, block_dim and grid_dim; each fiber its thread's */
    char *shared;                  /* static, then dynamic shared memory */
    size_t static_bytes, shared_bytes;
} mgx_block;

static _Thread_local mgx_block *mgx_running;

/* The 1-d memref of `func.func private @mg_cpu_shared(i32) -> memref<?xi8>`'s C interface. */
typedef struct {
    void *allocated, *aligned;
    int64_t offset, size, stride;
} mgx_memref_1d;

static void mgx_fiber_main(void)
{
    mgx_block *b = mgx_running;
    int t = b->current;
    int64_t ix[12];
    memcpy(ix, b->ix, sizeof ix);
    ix[0] = t % ix[6];
    ix[1] = t / ix[6] % ix[7];
    ix[2] = t / (ix[6] * ix[7]);
    b->entry(b->params, ix);
    b->fibers[t].state = MGX_DONE;   /* back to the scheduler through uc_link */
}

/* The running thread's misuse of shared memory, an mbarrier or a tensor map: the launch fails with
 * a message; the fiber is abandoned, never resumed. */
__attribute__((format(printf, 2, 3))) static void mgx_cpu_fault(int32_t line, const char *format, ...)
{
    mgx_block *b = mgx_running;
    char what[512];
    va_list args;
    va_start(args, format);
    vsnprintf(what, sizeof what, format, args);
    va_end(args);
    int t = b->current;
    mgx_fail(MGX_KERNEL_FAULT, "%s: %s, by thread (%lld, %lld, %lld) of block (%lld, %lld, %lld) at line %d of its "
             "source", b->kernel, what, (long long)(t % b->ix[6]), (long long)(t / b->ix[6] % b->ix[7]),
             (long long)(t / (b->ix[6] * b->ix[7])), (long long)b->ix[3], (long long)b->ix[4], (long long)b->ix[5],
             (int)line);
    b->failed = 1;
    b->fibers[t].state = MGX_FAILED;
    swapcontext(&b->fibers[t].context, &b->scheduler);
    __builtin_unreachable();
}

/* Runs the block whose indices b->ix holds: each fiber until it returns or waits, round after round. */
static int mgx_run_block(mgx_block *b)
{
    for (int t = 0; t < b->threads; t++) {
        mgx_fiber *f = &b->fibers[t];
        getcontext(&f->context);
        f->context.uc_stack.ss_sp = b->stacks + (size_t)t * MGX_FIBER_STACK;
        f->context.uc_stack.ss_size = MGX_FIBER_STACK;
        f->context.uc_link = &b->scheduler;
        makecontext(&f->context, mgx_fiber_main, 0);
        f->state = MGX_READY;
    }
    for (;;) {
        int progress = 0, live = 0, at_barrier = 0;
        for (int t = 0; t < b->threads; t++) {
            mgx_fiber *f = &b->fibers[t];
            if (f->state == MGX_WAITING && (*f->wait_on >> 63) != f->parity)
                f->state = MGX_READY;
            if (f->state == MGX_READY) {
                b->current = t;
                swapcontext(&b->scheduler, &f->context);
                if (b->failed)
                    return MGX_KERNEL_FAULT;
                progress = 1;
            }
            live += f->state != MGX_DONE;
            at_barrier += f->state == MGX_AT_BARRIER;
        }
        if (live == 0)
            return MGX_SUCCESS;
        if (at_barrier == live) {
            for (int t = 0; t < b->threads; t++)
                if (b->fibers[t].state == MGX_AT_BARRIER)
                    b->fibers[t].state = MGX_READY;
        } else if (!progress) {
            return mgx_fail(MGX_KERNEL_FAULT, "%s: the threads of block (%lld, %lld, %lld) wait forever: %d of %d at a "
                            "barrier that the others never reach, the others on mbarrier phases that never complete",
                            b->kernel, (long long)b->ix[3], (long long)b->ix[4], (long long)b->ix[5], at_barrier, live);
        }
    }
}

/* A launch of a CPU build that synchronizes its threads: block after block, each thread a fiber. */
static int mgx_cpu_run_fibers(const mgx_kernel *k, const mgx_variant *v, void **params, const unsigned grid[3],
                              const unsigned block[3], unsigned shared_mem)
{
    int64_t threads = (int64_t)block[0] * block[1] * block[2];
    if (threads > MGX_MAX_BLOCK_THREADS)
        return mgx_fail(MGX_INVALID_VALUE, "%s: a block holds at most %d threads, not %lld", k->name,
                        MGX_MAX_BLOCK_THREADS, (long long)threads);
    mgx_block b = {.threads = (int)threads, .kernel = k->name, .entry = v->cpu, .params = params,
                   .static_bytes = (size_t)v->cpu_static_shared};
    b.shared_bytes = b.static_bytes + shared_mem;
    size_t shared_size = (b.shared_bytes + MGX_SHARED_ALIGN - 1) / MGX_SHARED_ALIGN * MGX_SHARED_ALIGN;
    b.fibers = calloc((size_t)threads, sizeof *b.fibers);
    b.stacks = malloc((size_t)threads * MGX_FIBER_STACK);
    b.shared = aligned_alloc(MGX_SHARED_ALIGN, shared_size ? shared_size : MGX_SHARED_ALIGN);
    int status = MGX_SUCCESS;
    if (b.fibers == NULL || b.stacks == NULL || b.shared == NULL)
        status = mgx_fail(MGX_INVALID_VALUE, "%s: out of memory for %lld threads' stacks", k->name, (long long)threads);
    else
        memset(b.shared, 0, shared_size);
    for (int d = 0; d < 3; d++) {
        b.ix[6 + d] = block[d];
        b.ix[9 + d] = grid[d];
    }
    mgx_block *outer = mgx_running;
    mgx_running = &b;
    for (b.ix[5] = 0; status == MGX_SUCCESS && b.ix[5] < grid[2]; b.ix[5]++)
        for (b.ix[4] = 0; status == MGX_SUCCESS && b.ix[4] < grid[1]; b.ix[4]++)
            for (b.ix[3] = 0; status == MGX_SUCCESS && b.ix[3] < grid[0]; b.ix[3]++)
                status = mgx_run_block(&b);
    mgx_running = outer;
    free(b.fibers);
    free(b.stacks);
    free(b.shared);
    return status;
}

/* Byte `offset` of the block's shared memory, `bytes` of it, or a fault of `what`. */
static char *mgx_shared_at(size_t offset, size_t bytes, const char *what, int32_t line)
{
    mgx_block *b = mgx_running;
    if (offset + bytes > b->shared_bytes)
        mgx_cpu_fault(line, "%s: %zu bytes at byte %zu of shared memory, past the block's %zu", what, bytes, offset,
                      b->shared_bytes);
    return b->shared + offset;
}

/* A u32 shared address as mg.shared.address gives it (the low 32 bits of the host address) as an
 * offset in the block's shared memory. */
static size_t mgx_shared_offset(int32_t address)
{
    return (uint32_t)((uint32_t)address - (uint32_t)(uintptr_t)mgx_running->shared);
}

void _mlir_ciface_mg_cpu_shared(mgx_memref_1d *result, int32_t which)
{
    mgx_block *b = mgx_running;
    char *base = b->shared + (which ? b->static_bytes : 0);
    int64_t size = (int64_t)(which ? b->shared_bytes - b->static_bytes : b->static_bytes);
    *result = (mgx_memref_1d){base, base, 0, size, 1};
}

void mg_cpu_barrier(int32_t line)
{
    mgx_block *b = mgx_running;
    mgx_fiber *f = &b->fibers[b->current];
    (void)line;
    f->state = MGX_AT_BARRIER;
    swapcontext(&f->context, &b->scheduler);
}

/* The library's faults and shared memory, for cpu_tma.h (it checks no reads of unwritten bytes). */
static const mg_hopper_hooks mgx_hooks = {mgx_cpu_fault, mgx_shared_at, NULL};

static uint64_t *mgx_mbarrier_at(int32_t address, const char *what, int32_t line)
{
    return mg_hopper_mbarrier_at(&mgx_hooks, mgx_shared_offset(address), what, line);
}

void mg_cpu_mbarrier_init(int32_t address, int32_t count, int32_t line)
{
    mg_hopper_mbarrier_init(&mgx_hooks, mgx_mbarrier_at(address, "mbarrier.init", line), count, line);
}

/* arrive (transaction_bytes 0) or arrive.expect_tx: the bytes first, then the arrival. */
void mg_cpu_mbarrier_arrive(int32_t address, int32_t transaction_bytes, int32_t line)
{
    mg_hopper_mbarrier_update(&mgx_hooks, mgx_mbarrier_at(address, "mbarrier.arrive", line), 1, transaction_bytes,
                              line);
}

/* try_wait.parity until it succeeds: the phase of parity `parity` has completed once the current
 * phase has the other parity; until then the other threads run. */
void mg_cpu_mbarrier_wait(int32_t address, int32_t parity, int32_t line)
{
    mgx_block *b = mgx_running;
    uint64_t *m = mgx_mbarrier_at(address, "mbarrier.try_wait", line);
    if ((*m >> 63) != (uint64_t)(parity & 1))
        return;
    mgx_fiber *f = &b->fibers[b->current];
    f->state = MGX_WAITING;
    f->wait_on = m;
    f->parity = (uint64_t)(parity & 1);
    swapcontext(&f->context, &b->scheduler);
}

void mg_cpu_tma_load(void *map, int32_t destination, int32_t barrier, int32_t rank, int32_t c0, int32_t c1,
                     int32_t c2, int32_t c3, int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    const mg_cpu_tensor_map *m = mg_hopper_tensor_map_of(&mgx_hooks, map, rank, "mg.tma.load", line);
    uint64_t *bar = mgx_mbarrier_at(barrier, "mg.tma.load's mbarrier", line);
    size_t bytes = mg_hopper_tma_copy(&mgx_hooks, m, mgx_shared_offset(destination), coords, MG_HOPPER_TMA_LOAD,
                                      "mg.tma.load", line);
    mg_hopper_mbarrier_update(&mgx_hooks, bar, 0, -(int64_t)bytes, line);   /* complete-tx: the bytes have landed */
}

void mg_cpu_tma_store(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                      int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    const mg_cpu_tensor_map *m = mg_hopper_tensor_map_of(&mgx_hooks, map, rank, "mg.tma.store", line);
    mg_hopper_tma_copy(&mgx_hooks, m, mgx_shared_offset(source), coords, MG_HOPPER_TMA_STORE, "mg.tma.store",
                       line);
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
        if (v->cpu_fibers)
            return mgx_cpu_run_fibers(k, v, params, grid, block, shared_mem);
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
