/* MLIR's runner utilities in C (see runner_utils.h). The formats are those
 * of MLIR 22's CRunnerUtils (printf's %g and friends) and RunnerUtils (a
 * C++ stream with its default formatting: %g for floating point, an int8_t
 * element printed as a character, complex numbers as "(re,im)"). */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include "host/runner_utils.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* A memref descriptor: {allocated, aligned, offset, sizes[rank], strides[rank]}. */
typedef struct {
    void *allocated;
    char *aligned;
    int64_t offset;
    int64_t sizes_and_strides[];
} memref;

/* An unranked memref: its rank and a pointer to the ranked descriptor. */
typedef struct {
    int64_t rank;
    memref *descriptor;
} unranked;

/* ------------------------------------------------------------------------ */
/* Scalars (what vector.print lowers to)                                     */

static void printI64(int64_t value) { printf("%" PRId64, value); }
static void printU64(uint64_t value) { printf("%" PRIu64, value); }
static void printF32(float value) { printf("%g", value); }
static void printF64(double value) { printf("%lg", value); }
static void printString(const char *text) { fputs(text, stdout); }
static void printOpen(void) { fputs("( ", stdout); }
static void printClose(void) { fputs(" )", stdout); }
static void printComma(void) { fputs(", ", stdout); }
static void printNewline(void) { fputc('\n', stdout); }

static float f16_to_float(uint16_t bits)
{
    int sign = bits >> 15, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    float magnitude;
    if (exponent == 0)
        magnitude = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        magnitude = mantissa ? NAN : INFINITY;
    else
        magnitude = ldexpf((float)(mantissa | 0x400), exponent - 25);
    return sign ? -magnitude : magnitude;
}

static float bf16_to_float(uint16_t bits)
{
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

static void printF16(uint16_t bits) { printf("%g", f16_to_float(bits)); }
static void printBF16(uint16_t bits) { printf("%g", bf16_to_float(bits)); }

/* GFLOPS for benchmarks MLIR's way: to stderr. */
static void printFlops(double flops) { fprintf(stderr, "%lf GFLOPS\n", flops / 1.0E9); }

static double rtclock(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1.0e-9;
}

/* ------------------------------------------------------------------------ */
/* Memrefs                                                                   */

typedef enum { E_I8, E_I16, E_I32, E_I64, E_INDEX, E_F16, E_BF16, E_F32, E_F64, E_C32, E_C64 } element;

static const int64_t element_bytes[] = {1, 2, 4, 8, 8, 2, 2, 4, 8, 8, 16};

static void print_element(element type, const char *at)
{
    union {
        int8_t i8;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        uint64_t u64;
        uint16_t half;
        float f32[2];
        double f64[2];
    } v;
    memcpy(&v, at, (size_t)element_bytes[type]);
    switch (type) {
    case E_I8: putchar((unsigned char)v.i8); break; /* a stream prints int8_t as a character */
    case E_I16: printf("%d", v.i16); break;
    case E_I32: printf("%" PRId32, v.i32); break;
    case E_I64: printf("%" PRId64, v.i64); break;
    case E_INDEX: printf("%" PRIu64, v.u64); break;
    case E_F16: printf("%g", f16_to_float(v.half)); break;
    case E_BF16: printf("%g", bf16_to_float(v.half)); break;
    case E_F32: printf("%g", v.f32[0]); break;
    case E_F64: printf("%g", v.f64[0]); break;
    case E_C32: printf("(%g,%g)", v.f32[0], v.f32[1]); break;
    case E_C64: printf("(%g,%g)", v.f64[0], v.f64[1]); break;
    }
}

static void spaces(int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        putchar(' ');
}

/* Dimension `dim` counted down from `rank` to 0 (an element): nested
 * brackets, ", " between elements, ",\n" plus an indent between rows. */
static void print_data(element type, const char *base, int64_t dim, int64_t rank, int64_t offset,
                       const int64_t *sizes, const int64_t *strides)
{
    if (dim == 0) {
        print_element(type, base + offset * element_bytes[type]);
        return;
    }
    if (sizes[0] == 0) {
        /* MLIR's own printer reads a first element even here, past the end
         * of an empty memref; there is none to print. */
        fputs("[]", stdout);
        return;
    }
    putchar('[');
    print_data(type, base, dim - 1, rank, offset, sizes + 1, strides + 1);
    if (sizes[0] <= 1) {
        putchar(']');
        return;
    }
    fputs(dim > 1 ? ", \n" : ", ", stdout);
    for (int64_t i = 1; i + 1 < sizes[0]; i++) {
        spaces(rank - dim + 1);
        print_data(type, base, dim - 1, rank, offset + i * strides[0], sizes + 1, strides + 1);
        fputs(dim > 1 ? ", \n" : ", ", stdout);
    }
    spaces(rank - dim + 1);
    print_data(type, base, dim - 1, rank, offset + (sizes[0] - 1) * strides[0], sizes + 1, strides + 1);
    putchar(']');
}

static void print_list(const int64_t *values, int64_t rank)
{
    for (int64_t i = 0; i < rank; i++)
        printf(i ? ", %" PRId64 : "%" PRId64, values[i]);
}

static void print_metadata(const memref *m, int64_t rank)
{
    printf("base@ = %#" PRIxPTR " rank = %" PRId64 " offset = %" PRId64 " sizes = [", (uintptr_t)m->aligned, rank,
           m->offset);
    print_list(m->sizes_and_strides, rank);
    fputs("] strides = [", stdout);
    print_list(m->sizes_and_strides + rank, rank);
    putchar(']');
}

static void print_memref(const char *prefix, element type, const memref *m, int64_t rank)
{
    fputs(prefix, stdout);
    print_metadata(m, rank);
    fputs(" data = \n", stdout);
    if (rank == 0)
        putchar('[');
    print_data(type, m->aligned, rank, rank, m->offset, m->sizes_and_strides, m->sizes_and_strides + rank);
    if (rank == 0)
        putchar(']');
    putchar('\n');
    fflush(stdout);
}

static void print_shape(const char *prefix, const memref *m, int64_t rank)
{
    fputs(prefix, stdout);
    print_metadata(m, rank);
}

/* Per element type: printMemref<T>(rank, descriptor) as func-to-llvm calls
 * it, _mlir_ciface_printMemref<T>(unranked *) with llvm.emit_c_interface, and
 * _mlir_ciface_printMemrefShape<T>(unranked *). */
#define UNRANKED_PRINTERS(T, type)                                                                     \
    static void printMemref##T(int64_t rank, memref *m) { print_memref("Unranked Memref ", type, m, rank); } \
    static void ciface_printMemref##T(unranked *u) { print_memref("Unranked Memref ", type, u->descriptor, u->rank); } \
    static void ciface_printMemrefShape##T(unranked *u) { print_shape("Unranked Memref ", u->descriptor, u->rank); }

UNRANKED_PRINTERS(I8, E_I8)
UNRANKED_PRINTERS(I16, E_I16)
UNRANKED_PRINTERS(I32, E_I32)
UNRANKED_PRINTERS(I64, E_I64)
UNRANKED_PRINTERS(Ind, E_INDEX)
UNRANKED_PRINTERS(F16, E_F16)
UNRANKED_PRINTERS(BF16, E_BF16)
UNRANKED_PRINTERS(F32, E_F32)
UNRANKED_PRINTERS(F64, E_F64)
UNRANKED_PRINTERS(C32, E_C32)
UNRANKED_PRINTERS(C64, E_C64)

/* The ranked entry points (C interface only): a descriptor of a known rank. */
#define RANKED_PRINTER(name, type, rank) \
    static void ciface_##name(memref *m) { print_memref("Memref ", type, m, rank); }

RANKED_PRINTER(printMemref0dF32, E_F32, 0)
RANKED_PRINTER(printMemref1dI8, E_I8, 1)
RANKED_PRINTER(printMemref1dI32, E_I32, 1)
RANKED_PRINTER(printMemref1dI64, E_I64, 1)
RANKED_PRINTER(printMemref1dInd, E_INDEX, 1)
RANKED_PRINTER(printMemref1dF32, E_F32, 1)
RANKED_PRINTER(printMemref1dF64, E_F64, 1)
RANKED_PRINTER(printMemref1dC32, E_C32, 1)
RANKED_PRINTER(printMemref1dC64, E_C64, 1)
RANKED_PRINTER(printMemref2dF32, E_F32, 2)
RANKED_PRINTER(printMemref3dF32, E_F32, 3)
RANKED_PRINTER(printMemref4dF32, E_F32, 4)

/* memref.copy between memrefs that are not both contiguous (what
 * finalize-memref-to-llvm calls for them): element by element, any strides. */
static void memrefCopy(int64_t element_size, unranked *source, unranked *target)
{
    int64_t rank = source->rank;
    const memref *s = source->descriptor, *t = target->descriptor;
    const int64_t *sizes = s->sizes_and_strides, *ss = s->sizes_and_strides + rank,
                  *ts = t->sizes_and_strides + rank;
    int64_t count = 1;
    for (int64_t k = 0; k < rank; k++)
        count *= sizes[k];
    /* A memref has at most 64 dimensions in practice; more is no memref. */
    if (count == 0 || rank > 64)
        return;
    int64_t index[64] = {0}, from = s->offset, to = t->offset;
    for (int64_t n = 0; n < count; n++) {
        memcpy(t->aligned + to * element_size, s->aligned + from * element_size, (size_t)element_size);
        /* Next index, last dimension fastest. */
        for (int64_t k = rank - 1; k >= 0; k--) {
            from += ss[k];
            to += ts[k];
            if (++index[k] < sizes[k])
                break;
            from -= ss[k] * sizes[k];
            to -= ts[k] * sizes[k];
            index[k] = 0;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The symbol table                                                          */

#define SYMBOL(name) {#name, (void *)name}
#define CIFACE(name) {"_mlir_ciface_" #name, (void *)ciface_##name}
#define UNRANKED(T) SYMBOL(printMemref##T), CIFACE(printMemref##T), CIFACE(printMemrefShape##T)

static const struct {
    const char *name;
    void *address;
} symbols[] = {
    SYMBOL(printI64), SYMBOL(printU64), SYMBOL(printF16), SYMBOL(printBF16), SYMBOL(printF32), SYMBOL(printF64),
    SYMBOL(printString), {"printCString", (void *)printString}, SYMBOL(printOpen), SYMBOL(printClose),
    SYMBOL(printComma), SYMBOL(printNewline), SYMBOL(printFlops), SYMBOL(rtclock), SYMBOL(memrefCopy),
    UNRANKED(I8), UNRANKED(I16), UNRANKED(I32), UNRANKED(I64), UNRANKED(Ind), UNRANKED(F16), UNRANKED(BF16),
    UNRANKED(F32), UNRANKED(F64), UNRANKED(C32), UNRANKED(C64),
    CIFACE(printMemref0dF32), CIFACE(printMemref1dI8), CIFACE(printMemref1dI32), CIFACE(printMemref1dI64),
    CIFACE(printMemref1dInd), CIFACE(printMemref1dF32), CIFACE(printMemref1dF64), CIFACE(printMemref1dC32),
    CIFACE(printMemref1dC64), CIFACE(printMemref2dF32), CIFACE(printMemref3dF32), CIFACE(printMemref4dF32),
};

/* float -> bf16, rounding to nearest even; a NaN stays a quiet NaN. LLVM
 * calls these for a truncation to bf16 on hosts without bf16 instructions,
 * and the libgcc of older compilers (GCC 12) lacks them. A bf16 comes back
 * as a half does on x86-64 (in xmm0), hence _Float16 as the carrier. */
static _Float16 bf16_bits(uint16_t bits)
{
    _Float16 carrier;
    memcpy(&carrier, &bits, sizeof carrier);
    return carrier;
}

static _Float16 truncsfbf2(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return bf16_bits((uint16_t)(bits >> 16 | 0x40));
    bits += 0x7fffu + (bits >> 16 & 1);
    return bf16_bits((uint16_t)(bits >> 16));
}

/* Through float would round twice: the low bits that float drops decide ties. */
static _Float16 truncdfbf2(double value)
{
    if (isnan(value))
        return truncsfbf2((float)value);
    /* Rounded to odd on the way to float (toward zero, the last bit set where
     * inexact), then to nearest even: the same as rounding once. */
    float nearest = (float)value;
    uint32_t bits;
    memcpy(&bits, &nearest, sizeof bits);
    if ((double)nearest != value && !isinf(nearest)) {
        if ((double)nearest > value ? nearest > 0 : nearest < 0)
            bits -= 1;   /* rounded away from zero: one step back toward it */
        bits |= 1;
    }
    memcpy(&nearest, &bits, sizeof bits);
    return truncsfbf2(nearest);
}

const mg_runtime_symbol mg_conversion_symbols[] = {
    {"__truncsfbf2", (void *)truncsfbf2},
    {"__truncdfbf2", (void *)truncdfbf2},
    {NULL, NULL},
};

void *mg_runner_symbol(const char *name)
{
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++)
        if (strcmp(symbols[i].name, name) == 0)
            return symbols[i].address;
    return NULL;
}
