/* Calls the SGEMM that build.py exported into libsgemm.so, for a few sizes of
 * both variants (multiples of 16 and not), on the GPU where there is one and
 * on the library's CPU build where there is not, and checks each product
 * against a plain C loop in double precision. Exits 1 on a wrong result. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sgemm.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        if ((call) != SGEMM_SUCCESS) {                                                   \
            fprintf(stderr, "%s failed: %s\n", #call, sgemm_last_error());               \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static double run(int64_t m, int64_t k, int64_t n)
{
    size_t a_bytes = (size_t)(m * k) * sizeof(float), b_bytes = (size_t)(k * n) * sizeof(float),
           c_bytes = (size_t)(m * n) * sizeof(float);
    float *a = malloc(a_bytes), *b = malloc(b_bytes), *c = malloc(c_bytes);
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 13) / 13.0f;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 5) % 11) / 11.0f;
    for (int64_t i = 0; i < m * n; i++) c[i] = 1.0f;
    void *da, *db, *dc;
    CHECK(sgemm_alloc(&da, a_bytes));
    CHECK(sgemm_alloc(&db, b_bytes));
    CHECK(sgemm_alloc(&dc, c_bytes));
    CHECK(sgemm_copy_to_device(da, a, a_bytes));
    CHECK(sgemm_copy_to_device(db, b, b_bytes));
    CHECK(sgemm_copy_to_device(dc, c, c_bytes));
    /* C = 2 A B + 0.5 C on the default stream; the copy back waits for it. */
    CHECK(sgemm_sgemm(NULL, da, db, dc, 2.0f, 0.5f, m, k, n));
    CHECK(sgemm_copy_to_host(c, dc, c_bytes));
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0.5;
            for (int64_t p = 0; p < k; p++)
                want += 2.0 * a[i * k + p] * b[p * n + j];
            double error = fabs(c[i * n + j] - want) / fabs(want);
            worst = error > worst ? error : worst;
        }
    CHECK(sgemm_free(da));
    CHECK(sgemm_free(db));
    CHECK(sgemm_free(dc));
    free(a), free(b), free(c);
    return worst;
}

int main(void)
{
    const int64_t sizes[][3] = {{64, 32, 48}, {33, 17, 21}, {16, 50, 7}};
    int failed = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double error = run(sizes[s][0], sizes[s][1], sizes[s][2]);
        printf("sgemm %lldx%lld @ %lldx%lld on the %s: relative error %.2e\n", (long long)sizes[s][0],
               (long long)sizes[s][1], (long long)sizes[s][1], (long long)sizes[s][2], sgemm_backend(), error);
        failed |= !(error < 1e-5);
    }
    /* A size the kernel cannot take is an error with a message, not a crash. */
    if (sgemm_sgemm(NULL, NULL, NULL, NULL, 1.0f, 0.0f, 0, 1, 1) != SGEMM_INVALID_VALUE) {
        fprintf(stderr, "a zero size was not refused\n");
        return 1;
    }
    printf("a zero size: %s\n", sgemm_last_error());
    return failed;
}
