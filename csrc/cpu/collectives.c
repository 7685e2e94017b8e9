/* What a block's threads do together on the CPU backend: shared memory,
 * warp shuffles, tensor-core collectives, and Hopper's mbarriers, named
 * barriers, TMA copies and wgmma. */
#include "cpu/cpu.h"
#include "host/engine.h"
#include "mlir/ir.h"
#include "host/runner_utils.h"

#include <math.h>
#include <mlir-c/ExecutionEngine.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "base/numpy_api.h"
#include "cpu/cpu_shared.h"
/* Shared memory                                                             */

struct mg_memref_1d {
    void *allocated, *aligned;
    int64_t offset, size, stride;
};

/* The C interface of `func.func private @mg_cpu_shared(i32) -> memref<?xi8>`:
 * 0 the block's static shared memory, 1 its dynamic (the launch's shared_mem). */
void mg_cpu__mlir_ciface_mg_cpu_shared(mg_memref_1d *result, int32_t which)
{
    mg_cpu_launch *l = mg_cpu_running;
    which = which != 0;
    char *base = l->shared[which] + (size_t)(l->current / l->block_threads) * l->shared_stride;
    *result = (mg_memref_1d){base, base, 0, l->shared_size[which], 1};
}

/* ------------------------------------------------------------------------ */
/* Warp shuffles                                                             */

/* A warp-level barrier: deposits `value`, waits until every thread of its
 * warp that has not returned is at a shuffle, and returns the value of the
 * lane chosen by `mode`, `offset` and `width` within the lane's segment of
 * `width` lanes (its own where that lane is outside the segment or not
 * there), as PTX's shfl.sync does with CUDA's clamp of ((32 - width) << 8) |
 * (up ? 0 : 31). MG_VOTE_BALLOT returns the bits of the lanes whose value
 * is nonzero instead (vote.sync.ballot). */
int64_t mg_cpu_shuffle(int32_t mode, int64_t value, int32_t offset, int32_t width, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_AT_SHUFFLE;
    f->mode = mode;
    f->value = value;
    f->offset = offset;
    f->width = width;
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
    return f->value;
}

/* Completes the shuffle of the warp starting at thread `first`. */
void mg_cpu_exchange(mg_fiber *fibers, int first, int end)
{
    int64_t in[MG_CPU_WARP];
    int active[MG_CPU_WARP];
    for (int t = first; t < end; t++) {
        in[t - first] = fibers[t].value;
        active[t - first] = fibers[t].state == FIBER_AT_SHUFFLE;
    }
    int64_t ballot = 0;
    for (int t = first; t < end; t++)
        if (active[t - first] && in[t - first] != 0)
            ballot |= (int64_t)1 << (t - first);
    for (int t = first; t < end; t++) {
        mg_fiber *f = &fibers[t];
        if (f->state != FIBER_AT_SHUFFLE)
            continue;
        f->state = FIBER_READY;
        if (f->mode == MG_VOTE_BALLOT) {
            f->value = ballot;
            continue;
        }
        /* PTX's shfl.sync: the segment is [first lane, last lane] of the lane's `width`. */
        int lane = t - first, b = f->offset & (MG_CPU_WARP - 1), source, valid;
        int width = f->width >= 1 && f->width <= MG_CPU_WARP ? f->width : MG_CPU_WARP;
        int segment_first = lane & ~(width - 1), segment_last = segment_first + width - 1;
        switch (f->mode) {
        case MG_SHFL_XOR: source = lane ^ b; valid = source <= segment_last; break;
        case MG_SHFL_DOWN: source = lane + b; valid = source <= segment_last; break;
        case MG_SHFL_UP: source = lane - b; valid = source >= segment_first; break;
        default: source = segment_first | (b & (width - 1)); valid = 1; break;
        }
        if (valid && source < end - first && active[source])
            f->value = in[source];
    }
}

/* ------------------------------------------------------------------------ */
/* Tensor-core collectives                                                   */

/* The lane's operands go in one 64-bit word at a time, then it waits at the
 * collective `mode` (a warp-level barrier like a shuffle's), then reads its
 * results back word by word. */
void mg_cpu_warp_put(int64_t bits)
{
    mg_cpu_launch *l = mg_cpu_running;
    mg_fiber *f = &l->pool->fibers[l->current];
    if (f->ndata < MG_CPU_WARP_DATA)
        f->data[f->ndata++] = bits;
}

void mg_cpu_warp_collective(int32_t mode, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_AT_SHUFFLE;
    f->mode = mode;
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
    f->ndata = 0;
}

int64_t mg_cpu_warp_get(int32_t k)
{
    mg_cpu_launch *l = mg_cpu_running;
    return k >= 0 && k < MG_CPU_WARP_DATA ? l->pool->fibers[l->current].data[k] : 0;
}

static float half_to_float(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13); /* inf, nan */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else {
        float value = (float)mantissa * (1.0f / 16777216.0f); /* subnormal: mantissa * 2^-24 */
        return sign ? -value : value;
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static float bits_to_float(uint32_t bits)
{
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* Element `i` (0 low, 1 high) of a register of the collective's input type. */
float mg_cpu_element(int mode, uint32_t reg, int i)
{
    switch (mode) {
    case MG_WARP_MMA_F16: return half_to_float(i ? reg >> 16 : reg & 0xffff);
    case MG_WARP_MMA_BF16: return bits_to_float((i ? reg >> 16 : reg & 0xffff) << 16);
    default: return bits_to_float(reg & 0xffffe000u); /* tf32: the top 19 bits */
    }
}

/* mma.sync over the 32 lanes at `lanes`, with the PTX ISA's fragment layouts
 * (groupID g = lane / 4, threadID_in_group t = lane % 4):
 *   m16n8k16: a_i (row g + 8 * (i/2 % 2), col 2t + i%2 + 8 * (i/4)), two per register;
 *             b_i (k 2t + i%2 + 8 * (i/2), col g), two per register;
 *   m16n8k8 tf32: a_i (row g + 8 * (i%2), col t + 4 * (i/2)); b_i (k t + 4i, col g);
 *   c_i and d_i (row g + 8 * (i/2), col 2t + i%2).
 * Products are summed in double and rounded to f32 once. */
void mg_cpu_mma(mg_fiber *lanes, int mode)
{
    int K = mode == MG_WARP_MMA_TF32 ? 8 : 16;
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < MG_CPU_WARP; lane++) {
        const int64_t *d = lanes[lane].data;
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < (K == 16 ? 8 : 4); i++) {
            uint32_t reg = (uint32_t)d[K == 16 ? i / 2 : i];
            float value = mg_cpu_element(mode, reg, K == 16 ? i % 2 : 0);
            if (K == 16)
                A[g + 8 * (i / 2 % 2)][2 * t + i % 2 + 8 * (i / 4)] = value;
            else
                A[g + 8 * (i % 2)][t + 4 * (i / 2)] = value;
        }
        for (int i = 0; i < (K == 16 ? 4 : 2); i++) {
            uint32_t reg = (uint32_t)d[4 + (K == 16 ? i / 2 : i)];
            float value = mg_cpu_element(mode, reg, K == 16 ? i % 2 : 0);
            if (K == 16)
                B[2 * t + i % 2 + 8 * (i / 2)][g] = value;
            else
                B[t + 4 * i][g] = value;
        }
        for (int i = 0; i < 4; i++)
            C[g + 8 * (i / 2)][2 * t + i % 2] = bits_to_float((uint32_t)d[6 + i]);
    }
    for (int lane = 0; lane < MG_CPU_WARP; lane++) {
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i / 2), col = 2 * t + i % 2;
            double sum = C[row][col];
            for (int k = 0; k < K; k++)
                sum += (double)A[row][k] * (double)B[k][col];
            float out = (float)sum;
            uint32_t bits;
            memcpy(&bits, &out, sizeof bits);
            lanes[lane].data[i] = bits;
        }
    }
}

/* ldmatrix .x{count}: lanes 8j .. 8j+7 gave the addresses of matrix j's rows
 * (8 contiguous 16-bit elements each). Lane l receives, per matrix, row l/4,
 * columns 2 (l%4) and +1; with .trans, column l/4, rows 2 (l%4) and +1. */
void mg_cpu_ldmatrix(mg_fiber *lanes, int count, int transpose)
{
    uint16_t m[4][8][8];
    for (int j = 0; j < count; j++)
        for (int r = 0; r < 8; r++)
            memcpy(m[j][r], (const void *)(intptr_t)lanes[8 * j + r].data[0], sizeof m[j][r]);
    for (int lane = 0; lane < MG_CPU_WARP; lane++)
        for (int j = 0; j < count; j++) {
            int row = lane / 4, col = 2 * (lane % 4);
            uint32_t low = transpose ? m[j][col][row] : m[j][row][col];
            uint32_t high = transpose ? m[j][col + 1][row] : m[j][row][col + 1];
            lanes[lane].data[j] = low | high << 16;
        }
}

/* Completes the collective of the warp starting at thread `first`; where not
 * all 32 lanes are at the same collective, records why in the launch (for
 * raise_block_error) and returns BLOCK_COLLECTIVE_DIVERGENCE. */
int mg_cpu_collective(mg_cpu_launch *l, mg_fiber *fibers, int first, int end)
{
    mg_fiber *lanes = &fibers[first];
    int mode = -1, at = 0;
    for (int t = first; t < end && mode < 0; t++)
        if (fibers[t].state == FIBER_AT_SHUFFLE && fibers[t].mode >= MG_WARP_MMA_F16) {
            mode = fibers[t].mode;
            at = t;
        }
    for (int lane = 0; lane < MG_CPU_WARP; lane++) {
        if (first + lane >= end || lanes[lane].state != FIBER_AT_SHUFFLE || lanes[lane].mode != mode) {
            int why = first + lane >= end ? COLLECTIVE_NO_LANE
                    : lanes[lane].state == FIBER_AT_SHUFFLE ? COLLECTIVE_OTHER_OPERATION : COLLECTIVE_RETURNED;
            l->divergence = (mg_divergence){at, lane, fibers[at].line, 0, why};
            return l->failed = BLOCK_COLLECTIVE_DIVERGENCE;
        }
    }
    if (mode >= MG_WARP_LDMATRIX)
        mg_cpu_ldmatrix(lanes, mode & 7, (mode & 8) != 0);
    else
        mg_cpu_mma(lanes, mode);
    for (int lane = 0; lane < MG_CPU_WARP; lane++)
        lanes[lane].state = FIBER_READY;
    return BLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Hopper: mbarriers, named barriers, TMA copies, wgmma                      */

/* A fault of the running thread (a shared address outside its block's shared
 * memory, a tensor map of the wrong kind): recorded for the scheduler, which
 * raises KernelError; the fiber is abandoned, never resumed. */
void mg_cpu_fault(int32_t line, const char *format, ...)
{
    mg_cpu_launch *l = mg_cpu_running;
    va_list ap;
    va_start(ap, format);
    vsnprintf(l->fault, sizeof l->fault, format, ap);
    va_end(ap);
    l->failed = BLOCK_FAULT;
    l->fault_thread = l->current;
    l->fault_line = line;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_FAILED;
    swapcontext(&f->context, &l->scheduler);
    __builtin_unreachable();
}

/* The running thread's block's shared memory (static, then dynamic: one window). */
char *mg_cpu_shared_window(mg_cpu_launch *l)
{
    return l->shared[0] + (size_t)(l->current / l->block_threads) * l->shared_stride;
}

/* Byte `offset` of the running block's shared memory, `nbytes` of it, or a fault of `what`. */
static char *shared_offset(size_t offset, size_t nbytes, const char *what, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    if (offset + nbytes > l->shared_window)
        mg_cpu_fault(line, "%s: %zu bytes at byte %zu of shared memory, past the block's %zu", what, nbytes, offset,
              l->shared_window);
    return mg_cpu_shared_window(l) + offset;
}

/* A u32 shared address as mg.shared.address gives it (the low 32 bits of the
 * host address) as an offset in the running block's shared memory. */
static size_t shared_address(uint32_t address)
{
    mg_cpu_launch *l = mg_cpu_running;
    return (uint32_t)(address - (uint32_t)(uintptr_t)mg_cpu_shared_window(l));
}

static void shadow_written(char *at, size_t bytes, int32_t line)
{
    mg_cpu_shadow_written(mg_cpu_running, at, bytes, line);
}

/* Faults, shared memory and the uninitialized-read check of the CPU backend, for cpu_tma.h. */
static const mg_hopper_hooks hooks = {mg_cpu_fault, shared_offset, shadow_written};

static uint64_t *mbarrier_at(int32_t address, const char *what, int32_t line)
{
    return mg_hopper_mbarrier_at(&hooks, shared_address((uint32_t)address), what, line);
}

void mg_cpu_mbarrier_init(int32_t address, int32_t count, int32_t line)
{
    mg_hopper_mbarrier_init(&hooks, mbarrier_at(address, "mbarrier.init", line), count, line);
}

/* Adds arrivals and transaction bytes; a phase that completes synchronizes its threads. */
static void mbarrier_update(uint64_t *at, int arrivals, int64_t bytes, int32_t line)
{
    if (mg_hopper_mbarrier_update(&hooks, at, arrivals, bytes, line))
        mg_cpu_synchronized(mg_cpu_running);
}

/* arrive (transaction_bytes 0) or arrive.expect_tx: the bytes first, then the arrival. */
void mg_cpu_mbarrier_arrive(int32_t address, int32_t transaction_bytes, int32_t line)
{
    mbarrier_update(mbarrier_at(address, "mbarrier.arrive", line), 1, transaction_bytes, line);
}

/* try_wait.parity until it succeeds: the phase of parity `parity` has completed
 * once the current phase has the other parity. */
void mg_cpu_mbarrier_wait(int32_t address, int32_t parity, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    uint64_t *m = mbarrier_at(address, "mbarrier.try_wait", line);
    if ((*m >> 63) != (uint64_t)(parity & 1))
        return;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_WAITING;
    f->wait_kind = WAIT_MBARRIER;
    f->wait_on = m;
    f->wait_value = (uint64_t)(parity & 1);
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
}

/* bar.sync (wait) or bar.arrive `id`, `threads`: the arrival that makes
 * `threads` releases the waiting ones and starts the next generation. It
 * counts threads: the PTX of mg.warpgroup.barrier and arrive is .aligned,
 * which every thread of a warp executes together, so the warp's 32 arrivals
 * are the hardware's one arrival of the warp. */
void mg_cpu_named_barrier(int32_t id, int32_t threads, int32_t wait, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    if (id < 0 || id >= MG_CPU_NAMED_BARRIERS)
        mg_cpu_fault(line, "a named barrier's id is 0 to %d, not %d", MG_CPU_NAMED_BARRIERS - 1, (int)id);
    if (threads > l->block_threads)
        mg_cpu_fault(line, "named barrier %d counts %d threads, but the block has %d", (int)id, (int)threads,
              l->block_threads);
    uint64_t *b = l->named + ((size_t)(l->current / l->block_threads) * MG_CPU_NAMED_BARRIERS + (size_t)id) * 2;
    if (++b[0] >= (uint64_t)threads) {
        b[0] = 0;
        b[1]++;
        mg_cpu_synchronized(l);
        return;
    }
    if (!wait)
        return;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_WAITING;
    f->wait_kind = WAIT_NAMED_BARRIER;
    f->wait_on = &b[1];
    f->wait_value = b[1];
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
}

int mg_cpu_wait_over(const mg_fiber *f)
{
    if (f->wait_kind == WAIT_MBARRIER)
        return (*f->wait_on >> 63) != f->wait_value;
    return *f->wait_on != f->wait_value;
}

void mg_cpu_tma_load(void *map, int32_t destination, int32_t barrier, int32_t rank, int32_t c0, int32_t c1,
                     int32_t c2, int32_t c3, int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    const mg_cpu_tensor_map *m = mg_hopper_tensor_map_of(&hooks, map, rank, "mg.tma.load", line);
    uint64_t *bar = mbarrier_at(barrier, "mg.tma.load's mbarrier", line);
    size_t bytes = mg_hopper_tma_copy(&hooks, m, shared_address((uint32_t)destination), coords, MG_HOPPER_TMA_LOAD,
                                      "mg.tma.load", line);
    mbarrier_update(bar, 0, -(int64_t)bytes, line);   /* complete-tx: the bytes have landed */
}

/* A store (mode MG_HOPPER_TMA_STORE) or an addition (MG_HOPPER_TMA_ADD) of shared memory at
 * `source` to the box at `coords` of the map's array, which must be writable. */
static void tma_write(void *map, int32_t source, int32_t rank, const int32_t *coords, int mode, const char *what,
                      int32_t line)
{
    const mg_cpu_tensor_map *m = mg_hopper_tensor_map_of(&hooks, map, rank, what, line);
    if (m->readonly)
        mg_cpu_fault(line, "%s: the tensor map's array is read-only", what);
    mg_hopper_tma_copy(&hooks, m, shared_address((uint32_t)source), coords, mode, what, line);
}

void mg_cpu_tma_store(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                      int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    tma_write(map, source, rank, coords, MG_HOPPER_TMA_STORE, "mg.tma.store", line);
}

void mg_cpu_tma_reduce_add(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    tma_write(map, source, rank, coords, MG_HOPPER_TMA_ADD, "mg.tma.reduce_add", line);
}

/* The C interface of `@mg_cpu_wgmma_buffer() -> memref<?xf32>`: the thread's
 * accumulators, written before mg_cpu_wgmma and read after it. */
void mg_cpu__mlir_ciface_mg_cpu_wgmma_buffer(mg_memref_1d *result)
{
    mg_cpu_launch *l = mg_cpu_running;
    float *acc = l->pool->fibers[l->current].wgmma;
    *result = (mg_memref_1d){acc, acc, 0, MG_CPU_WGMMA_MAX + MG_CPU_WGMMA_A_WORDS, 1};
}

/* A wgmma operand in shared memory as its descriptor says: the start (an
 * offset in the block's shared memory), LBO and SBO in bytes, the swizzle's
 * row in bytes (0: interleave) and which dimension is contiguous. */
typedef struct {
    size_t start, lbo, sbo;
    int swizzle_bytes, k_major;
} wgmma_operand;

static wgmma_operand wgmma_descriptor(int64_t bits, int k_major)
{
    uint64_t d = (uint64_t)bits;
    static const int swizzles[] = {0, 128, 64, 32}; /* bits 62-63: interleave, 128B, 64B, 32B */
    mg_cpu_launch *l = mg_cpu_running;
    /* The start address holds bits 4-17 of the shared address: shared memory is under 256 KB. */
    size_t start = (uint32_t)(((d & 0x3fff) << 4) - (uint32_t)(uintptr_t)mg_cpu_shared_window(l)) & 0x3ffff;
    return (wgmma_operand){start, (d >> 16 & 0x3fff) << 4, (d >> 32 & 0x3fff) << 4, swizzles[d >> 62], k_major};
}

/* wgmma's element types, as mg_cpu_wgmma's mode names them for A (bits 0-1)
 * and B (bits 2-3). */
enum { WGMMA_F16, WGMMA_BF16, WGMMA_E4M3, WGMMA_E5M2 };
enum { WGMMA_B_MN_MAJOR = 16, WGMMA_A_IN_REGISTERS = 32 };

/* An OCP 8-bit float, exactly: e4m3 (bias 7, no infinities, S.1111.111 NaN)
 * or e5m2 (bias 15, IEEE-like: infinities and NaNs at exponent 31); both
 * with subnormals. */
static float float8_to_float(uint32_t bits, int e5m2)
{
    int mantissa_bits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, top = e5m2 ? 31 : 15;
    int exponent = (int)(bits >> mantissa_bits & (uint32_t)top), mantissa = (int)(bits & ((1u << mantissa_bits) - 1));
    float sign = bits & 0x80u ? -1.0f : 1.0f;
    if (e5m2 && exponent == top)
        return mantissa ? NAN : sign * INFINITY;
    if (!e5m2 && exponent == top && mantissa == 7)
        return NAN;
    if (exponent == 0) /* subnormal: mantissa * 2^(1 - bias - mantissa_bits) */
        return sign * ldexpf((float)mantissa, 1 - bias - mantissa_bits);
    return sign * ldexpf((float)((1 << mantissa_bits) | mantissa), exponent - bias - mantissa_bits);
}

/* x rounded to an 8-bit float as cvt.rn.satfinite does: to nearest, ties to
 * the even code; beyond the largest finite value (infinities too) that value
 * with x's sign; NaN a NaN. The positive codes are ordered as their values,
 * so a binary search finds the two around |x|. */
static uint32_t float_to_float8(float x, int e5m2)
{
    uint32_t largest = e5m2 ? 0x7b : 0x7e, sign = signbit(x) ? 0x80u : 0;
    if (isnan(x))
        return 0x7f;
    float magnitude = fabsf(x);
    if (magnitude >= float8_to_float(largest, e5m2))
        return sign | largest;
    uint32_t low = 0, high = largest; /* float8(low) <= magnitude < float8(high) */
    while (high - low > 1) {
        uint32_t middle = (low + high) / 2;
        if (float8_to_float(middle, e5m2) <= magnitude)
            low = middle;
        else
            high = middle;
    }
    float below = magnitude - float8_to_float(low, e5m2), above = float8_to_float(high, e5m2) - magnitude;
    return sign | (below < above || (below == above && low % 2 == 0) ? low : high);
}

/* Four f32 values as the bytes of one word, lowest first, each rounded to an
 * 8-bit float (e5m2, else e4m3): a word of a k32 wgmma's A fragment. */
int32_t mg_cpu_float8x4(float x0, float x1, float x2, float x3, int32_t e5m2)
{
    return (int32_t)(float_to_float8(x0, e5m2) | float_to_float8(x1, e5m2) << 8 | float_to_float8(x2, e5m2) << 16 |
                     float_to_float8(x3, e5m2) << 24);
}

static float wgmma_value(uint32_t bits, int type)
{
    switch (type) {
    case WGMMA_F16: return half_to_float(bits);
    case WGMMA_BF16: return bits_to_float(bits << 16);
    default: return float8_to_float(bits, type == WGMMA_E5M2);
    }
}

/* Element (mn, k) of an operand of `size`-byte elements of `type`: the
 * canonical layouts of the PTX ISA (8-row groups of 16-byte core matrices,
 * or rows of the swizzle's width), as mlirgpu.layout.wgmma checks tiles
 * against them, then the swizzle. 8-bit operands are K-major only. */
static float wgmma_element(const wgmma_operand *o, int mn, int k, int type, int32_t line)
{
    size_t size = type >= WGMMA_E4M3 ? 1 : 2, per_core = 16 / size; /* elements in a core matrix's row */
    size_t width = o->swizzle_bytes ? (size_t)o->swizzle_bytes : 16, at;
    if (o->k_major)
        at = o->swizzle_bytes ? (size_t)(mn % 8) * width + (size_t)(mn / 8) * o->sbo + (size_t)k * size
                              : (size_t)(mn % 8) * 16 + (size_t)(mn / 8) * o->sbo + (size_t)k % per_core * size +
                                (size_t)k / per_core * o->lbo;
    else if (o->swizzle_bytes == 0)
        at = (size_t)(mn % 8) * 2 + (size_t)(mn / 8) * o->sbo + (size_t)(k % 8) * 16 + (size_t)(k / 8) * o->lbo;
    else
        at = (size_t)(mn % (width / 2)) * 2 + (size_t)(mn / (width / 2)) * o->lbo + (size_t)(k % 8) * width +
             (size_t)(k / 8) * o->sbo;
    uint16_t h = 0;
    memcpy(&h, shared_offset(mg_hopper_swizzled(o->start + at, o->swizzle_bytes), size, "mg.wgmma.mma", line), size);
    return wgmma_value(h, type);
}

/* wgmma.mma_async m64nNk16 (16-bit types) or m64nNk32 (8-bit floats) with
 * f32 accumulators, this thread's part: its N/2 accumulators (rows and
 * columns as mg.wgmma.accumulator_coordinates says) plus the products of
 * A's rows and B's columns over the 32 bytes of K, read from shared memory
 * through the descriptors when it is issued. `mode`: bits 0-1 A's type,
 * bits 2-3 B's (f16, bf16, e4m3, e5m2; the 16-bit types do not mix), bit 4
 * B MN-major (else K-major), bit 5 A from registers: then `a` is unused and
 * A's rows are the words after the accumulators, those of the thread's quad,
 * lane by lane (PTX's A fragment: word i of lane q holds row r + 8 (i % 2)
 * and, of `per` elements a word, the `per` columns from
 * 4 per (i / 2) + per q, lowest in the low bits). Products are summed in
 * double and rounded to f32 once. */
void mg_cpu_wgmma(int32_t n, int64_t a, int64_t b, int32_t mode, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    float *acc = l->pool->fibers[l->current].wgmma;
    int t = l->current % l->block_threads % MG_CPU_WARPGROUP, warp = t / 32, lane = t % 32;
    int type_a = mode & 3, type_b = mode >> 2 & 3, depth = type_a >= WGMMA_E4M3 ? 32 : 16, per = depth / 8;
    if (n < 8 || n > 2 * MG_CPU_WGMMA_MAX || n % 8)
        mg_cpu_fault(line, "mg.wgmma.mma: N is a multiple of 8 from 8 to 256, not %d", (int)n);
    wgmma_operand B = wgmma_descriptor(b, !(mode & WGMMA_B_MN_MAJOR));
    float rows[2][32];
    if (mode & WGMMA_A_IN_REGISTERS) {
        int bits = 32 / per;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < depth; k++) {
                uint32_t word;
                memcpy(&word, &acc[MG_CPU_WGMMA_MAX + 4 * (k % (4 * per) / per) + h + 2 * (k / (4 * per))], 4);
                rows[h][k] = wgmma_value(word >> bits * (k % per) & ((1u << bits) - 1), type_a);
            }
    } else {
        wgmma_operand A = wgmma_descriptor(a, 1);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < depth; k++)
                rows[h][k] = wgmma_element(&A, warp * 16 + lane / 4 + 8 * h, k, type_a, line);
    }
    for (int r = 0; r < n / 2; r++) {
        int row = (r >> 1) & 1, column = (r >> 2) * 8 + (lane % 4) * 2 + (r & 1);
        double sum = acc[r];
        for (int k = 0; k < depth; k++)
            sum += (double)rows[row][k] * (double)wgmma_element(&B, column, k, type_b, line);
        acc[r] = (float)sum;
    }
}

/* ------------------------------------------------------------------------ */
