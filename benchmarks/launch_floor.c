/* The floor under any launch path: cuLaunchKernel called from C in a loop,
 * timed the way benchmarks/launch_overhead.py times the Python paths, and
 * beside it, in the same run, a function that mg.export wrote.
 *
 *   launch_floor CUBIN FUNCTION LAUNCHES REPEATS BATCH [LIBRARY KERNEL]
 *
 * Launches FUNCTION(a, b, c) (three 1024-float buffers, grid 4, block 256)
 * and prints, for each stream (the legacy default stream, the per-thread
 * default stream, a stream of its own), a line "NAME HOST SYNCED": medians
 * in microseconds per launch of the host time of the launch calls in batches
 * of BATCH (the queue never fills; synchronised between batches, untimed),
 * and of LAUNCHES launches followed by one synchronise. With LIBRARY (an
 * exported lib<name>.so) and KERNEL (the kernel of the same work in it:
 * int <name>_KERNEL(void *stream, const float *a, const float *b, float *c,
 * int64_t L), exported with its own launch shape, called with L = 1024), the lines
 * "exported-NAME HOST SYNCED" follow: the same loops through the library,
 * each path taking turns with the bare one, run after run. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != CUDA_SUCCESS) {                                                \
            const char *name_ = "?";                                             \
            cuGetErrorName(r_, &name_);                                          \
            fprintf(stderr, "%s failed: %s\n", #call, name_);                   \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return v[n / 2];
}

/* An exported function of the work, and its library's last error. */
typedef int (*exported_add)(void *stream, const float *a, const float *b, float *c, int64_t length);
typedef const char *(*exported_error)(void);

static CUfunction function;
static CUdeviceptr a, b, c;
static exported_add exported;
static exported_error exported_last_error;

/* One launch of the work on `stream`: through cuLaunchKernel (path 0) or the exported function (path 1). */
static void launch(int path, CUstream stream)
{
    if (path == 0) {
        void *params[] = {&a, &b, &c};
        CHECK(cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    } else if (exported(stream, (const float *)(uintptr_t)a, (const float *)(uintptr_t)b, (float *)(uintptr_t)c,
                        1024) != 0) {
        fprintf(stderr, "the exported function failed: %s\n", exported_last_error());
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 6 && argc != 8) {
        fprintf(stderr, "usage: %s CUBIN FUNCTION LAUNCHES REPEATS BATCH [LIBRARY KERNEL]\n", argv[0]);
        return 2;
    }
    int launches = atoi(argv[3]), repeats = atoi(argv[4]), batch = atoi(argv[5]);
    FILE *f = fopen(argv[1], "rb");
    if (f == NULL || repeats < 1 || repeats > 1000 || launches < 1 || batch < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *image = malloc((size_t)size);
    if (image == NULL || fread(image, 1, (size_t)size, f) != (size_t)size)
        return 2;
    fclose(f);
    int paths = 1;
    if (argc == 8) {
        /* lib<name>.so's functions are <name>_<kernel> and <name>_last_error. */
        const char *file = strrchr(argv[6], '/') ? strrchr(argv[6], '/') + 1 : argv[6];
        int prefix = (int)strlen(file) - 6;   /* "lib" and ".so" */
        char symbol[256], error_symbol[256];
        snprintf(symbol, sizeof symbol, "%.*s_%s", prefix, file + 3, argv[7]);
        snprintf(error_symbol, sizeof error_symbol, "%.*s_last_error", prefix, file + 3);
        void *library = prefix > 0 ? dlopen(argv[6], RTLD_NOW | RTLD_LOCAL) : NULL;
        if (library == NULL || (*(void **)&exported = dlsym(library, symbol)) == NULL ||
            (*(void **)&exported_last_error = dlsym(library, error_symbol)) == NULL) {
            fprintf(stderr, "%s: not a library with %s and %s\n", argv[6], symbol, error_symbol);
            return 2;
        }
        paths = 2;
    }

    CUdevice device;
    CUcontext context;
    CUmodule module;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, image));
    CHECK(cuModuleGetFunction(&function, module, argv[2]));
    CHECK(cuMemAlloc(&a, 4096));
    CHECK(cuMemAlloc(&b, 4096));
    CHECK(cuMemAlloc(&c, 4096));
    CUstream own;
    CHECK(cuStreamCreate(&own, CU_STREAM_DEFAULT));
    const char *names[] = {"legacy", "per-thread", "own"};
    CUstream streams[] = {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, own};

    /* The paths and streams take turns, run after run, so drift falls on all alike. */
    static double batched[2][3][1000], synced[2][3][1000];
    for (int p = 0; p < paths; p++)
        for (int s = 0; s < 3; s++) {
            for (int i = 0; i < 100; i++)
                launch(p, streams[s]);
            CHECK(cuCtxSynchronize());
        }
    for (int r = 0; r < repeats; r++) {
        for (int p = 0; p < paths; p++)
            for (int s = 0; s < 3; s++) {
                double host = 0;
                for (int done = 0; done < launches; done += batch) {
                    double start = now_us();
                    for (int i = 0; i < batch; i++)
                        launch(p, streams[s]);
                    host += now_us() - start;
                    CHECK(cuCtxSynchronize());
                }
                batched[p][s][r] = host / ((launches + batch - 1) / batch * batch);
                double start = now_us();
                for (int i = 0; i < launches; i++)
                    launch(p, streams[s]);
                CHECK(cuCtxSynchronize());
                synced[p][s][r] = (now_us() - start) / launches;
            }
    }
    for (int p = 0; p < paths; p++)
        for (int s = 0; s < 3; s++)
            printf("%s%s %.3f %.3f\n", p ? "exported-" : "", names[s], median(batched[p][s], repeats),
                   median(synced[p][s], repeats));
    return 0;
}
