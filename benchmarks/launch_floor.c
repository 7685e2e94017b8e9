/* The floor under any launch path: cuLaunchKernel called from C in a loop,
 * timed the way benchmarks/launch_overhead.py times the Python paths.
 *
 *   launch_floor CUBIN FUNCTION LAUNCHES REPEATS BATCH
 *
 * Launches FUNCTION(a, b, c) (three 1024-float buffers, grid 4, block 256)
 * and prints, for each stream (the legacy default stream, the per-thread
 * default stream, a stream of its own), a line "NAME HOST SYNCED": medians
 * in microseconds per launch of the host time of the launch calls in batches
 * of BATCH (the queue never fills; synchronised between batches, untimed),
 * and of LAUNCHES launches followed by one synchronise. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s CUBIN FUNCTION LAUNCHES REPEATS BATCH\n", argv[0]);
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

    CUdevice device;
    CUcontext context;
    CUmodule module;
    CUfunction function;
    CUdeviceptr a, b, c;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, image));
    CHECK(cuModuleGetFunction(&function, module, argv[2]));
    CHECK(cuMemAlloc(&a, 4096));
    CHECK(cuMemAlloc(&b, 4096));
    CHECK(cuMemAlloc(&c, 4096));
    void *params[] = {&a, &b, &c};
    CUstream own;
    CHECK(cuStreamCreate(&own, CU_STREAM_DEFAULT));
    const char *names[] = {"legacy", "per-thread", "own"};
    CUstream streams[] = {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, own};

    /* The streams take turns, run after run, so drift falls on all alike. */
    double batched[3][1000], synced[3][1000];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 100; i++)
            CHECK(cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, streams[s], params, NULL));
        CHECK(cuCtxSynchronize());
    }
    for (int r = 0; r < repeats; r++) {
        for (int s = 0; s < 3; s++) {
            double host = 0;
            for (int done = 0; done < launches; done += batch) {
                double start = now_us();
                for (int i = 0; i < batch; i++)
                    CHECK(cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, streams[s], params, NULL));
                host += now_us() - start;
                CHECK(cuCtxSynchronize());
            }
            batched[s][r] = host / ((launches + batch - 1) / batch * batch);
            double start = now_us();
            for (int i = 0; i < launches; i++)
                CHECK(cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, streams[s], params, NULL));
            CHECK(cuCtxSynchronize());
            synced[s][r] = (now_us() - start) / launches;
        }
    }
    for (int s = 0; s < 3; s++)
        printf("%s %.3f %.3f\n", names[s], median(batched[s], repeats), median(synced[s], repeats));
    return 0;
}
