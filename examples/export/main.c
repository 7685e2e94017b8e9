/* Calls the kernels that build.py exported into libkernels.so: the SGEMM for
 * a few sizes of both variants (multiples of 16 and not), and attention's
 * forward pass, on the GPU where there is one and on the library's CPU
 * builds where there is not, checking each result against a plain C loop in
 * double precision. Attention has no CPU build (its kernel needs shared
 * memory, barriers and warp shuffles, which the CPU builds of a library do
 * without), so without a GPU its call must fail with KERNELS_NO_BACKEND and
 * a message. Exits 1 on a wrong result. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        if ((call) != KERNELS_SUCCESS) {                                                 \
            fprintf(stderr, "%s failed: %s\n", #call, kernels_last_error());             \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* A new buffer of the backend's kind holding `bytes` of `host`. */
static void *to_device(const void *host, size_t bytes)
{
    void *device;
    CHECK(kernels_alloc(&device, bytes));
    CHECK(kernels_copy_to_device(device, host, bytes));
    return device;
}

static double sgemm(int64_t m, int64_t k, int64_t n)
{
    size_t a_bytes = (size_t)(m * k) * sizeof(float), b_bytes = (size_t)(k * n) * sizeof(float),
           c_bytes = (size_t)(m * n) * sizeof(float);
    float *a = malloc(a_bytes), *b = malloc(b_bytes), *c = malloc(c_bytes);
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 13) / 13.0f;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 5) % 11) / 11.0f;
    for (int64_t i = 0; i < m * n; i++) c[i] = 1.0f;
    void *da = to_device(a, a_bytes), *db = to_device(b, b_bytes), *dc = to_device(c, c_bytes);
    /* C = 2 A B + 0.5 C on the default stream; the copy back waits for it. */
    CHECK(kernels_sgemm(NULL, da, db, dc, 2.0f, 0.5f, m, k, n));
    CHECK(kernels_copy_to_host(c, dc, c_bytes));
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0.5;
            for (int64_t p = 0; p < k; p++)
                want += 2.0 * a[i * k + p] * b[p * n + j];
            double error = fabs(c[i * n + j] - want) / fabs(want);
            worst = error > worst ? error : worst;
        }
    CHECK(kernels_free(da));
    CHECK(kernels_free(db));
    CHECK(kernels_free(dc));
    free(a), free(b), free(c);
    return worst;
}

/* IEEE half precision, which the kernel's float16 arrays hold: from a float that is zero or a normal half
 * (as every input here is), and to a float. */
static uint16_t to_half(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (x == 0.0f)
        return sign;
    int exponent;
    float mantissa = frexpf(fabsf(x), &exponent);   /* |x| = 2 mantissa 2^(exponent - 1), 2 mantissa in [1, 2) */
    long bits = lrintf((2.0f * mantissa - 1.0f) * 1024.0f), biased = exponent + 14;
    if (bits == 1024)
        bits = 0, biased++;
    return (uint16_t)(sign | biased << 10 | bits);
}

static float from_half(uint16_t h)
{
    int exponent = h >> 10 & 31, bits = h & 1023;
    float magnitude = exponent == 0 ? ldexpf((float)bits, -24)
                      : exponent == 31 ? (bits ? NAN : INFINITY)
                      : ldexpf((float)(1024 + bits), exponent - 25);
    return h & 0x8000 ? -magnitude : magnitude;
}

/* O = softmax(Q K^T / sqrt(D)) V for `batch` sequences of `length` tokens and `heads` heads of D = 64:
 * the worst error of O relative to its largest entry, and of the log-sum-exp, through `lse_error`; -1
 * where the library cannot run it here (no GPU), after printing why. */
static double attention(int64_t batch, int64_t length, int64_t heads, double *lse_error)
{
    enum { D = 64 };
    int64_t tokens = batch * length, elements = tokens * heads * D;
    size_t bytes = (size_t)elements * sizeof(uint16_t), lse_bytes = (size_t)(batch * heads * length) * sizeof(float);
    uint16_t *q = malloc(bytes), *k = malloc(bytes), *v = malloc(bytes), *o = malloc(bytes);
    float *lse = malloc(lse_bytes);
    for (int64_t i = 0; i < elements; i++) {   /* multiples of 1/8 in [-0.75, 0.75]: exact in float16 */
        q[i] = to_half((float)((i * 7) % 13 - 6) / 8.0f);
        k[i] = to_half((float)((i * 5) % 11 - 5) / 8.0f);
        v[i] = to_half((float)((i * 3) % 7 - 3) / 8.0f);
    }
    const int32_t unused = 0;   /* the offsets of packed sequences, which this kernel does not read */
    void *dq = to_device(q, bytes), *dk = to_device(k, bytes), *dv = to_device(v, bytes);
    void *dout = to_device(o, bytes), *dlse = to_device(lse, lse_bytes), *dcu = to_device(&unused, sizeof unused);
    const double scale = 1.0 / sqrt(D);
    kernels_status status = kernels_attention_forward(
        NULL, dq, dk, dv, dout, dlse, dcu, dcu, (float)(scale * 1.4426950408889634 /* log2(e) */), 0, 0,
        tokens, heads, tokens, heads, tokens, heads, tokens, heads, batch * heads, length, 1, 1);
    double worst = -1;
    if (status == KERNELS_NO_BACKEND) {
        printf("attention: not run on the %s: %s\n", kernels_backend(), kernels_last_error());
    } else {
        CHECK(status);
        CHECK(kernels_copy_to_host(o, dout, bytes));
        CHECK(kernels_copy_to_host(lse, dlse, lse_bytes));
        double *scores = malloc((size_t)length * sizeof(double)), largest = 0, worst_o = 0;
        worst = *lse_error = 0;
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t i = 0; i < length; i++) {
                    const int64_t row = ((b * length + i) * heads + h) * D;
                    double top = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < length; j++) {
                        const int64_t key = ((b * length + j) * heads + h) * D;
                        double s = 0;
                        for (int d = 0; d < D; d++)
                            s += (double)from_half(q[row + d]) * from_half(k[key + d]);
                        scores[j] = s * scale;
                        top = scores[j] > top ? scores[j] : top;
                    }
                    for (int64_t j = 0; j < length; j++)
                        sum += scores[j] = exp(scores[j] - top);
                    for (int d = 0; d < D; d++) {
                        double want = 0;
                        for (int64_t j = 0; j < length; j++)
                            want += scores[j] * from_half(v[((b * length + j) * heads + h) * D + d]) / sum;
                        double error = fabs(from_half(o[row + d]) - want);
                        worst_o = error > worst_o ? error : worst_o;
                        largest = fabs(want) > largest ? fabs(want) : largest;
                    }
                    double error = fabs(lse[(b * heads + h) * length + i] - (top + log(sum)));
                    *lse_error = error > *lse_error ? error : *lse_error;
                }
        worst = worst_o / largest;
        free(scores);
    }
    void *buffers[] = {dq, dk, dv, dout, dlse, dcu};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        CHECK(kernels_free(buffers[i]));
    free(q), free(k), free(v), free(o), free(lse);
    return worst;
}

int main(void)
{
    const int64_t sizes[][3] = {{64, 32, 48}, {33, 17, 21}, {16, 50, 7}};
    int failed = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double error = sgemm(sizes[s][0], sizes[s][1], sizes[s][2]);
        printf("sgemm %lldx%lld @ %lldx%lld on the %s: relative error %.2e\n", (long long)sizes[s][0],
               (long long)sizes[s][1], (long long)sizes[s][1], (long long)sizes[s][2], kernels_backend(), error);
        failed |= !(error < 1e-5);
    }
    /* A size the kernel cannot take is an error with a message, not a crash. */
    if (kernels_sgemm(NULL, NULL, NULL, NULL, 1.0f, 0.0f, 0, 1, 1) != KERNELS_INVALID_VALUE) {
        fprintf(stderr, "a zero size was not refused\n");
        return 1;
    }
    printf("a zero size: %s\n", kernels_last_error());
    /* 80 tokens: a full tile of 64 queries and keys, and one that ends past the sequence. */
    double lse_error = 0, error = attention(2, 80, 2, &lse_error);
    if (error >= 0) {
        printf("attention 2x80x2x64 on the %s: relative error %.2e, log-sum-exp error %.2e\n", kernels_backend(),
               error, lse_error);
        failed |= !(error < 1e-2 && lse_error < 1e-3);
    } else if (strcmp(kernels_backend(), "cpu") != 0) {
        failed = 1;   /* only the CPU lacks a build of it */
    }
    return failed;
}
