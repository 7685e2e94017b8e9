/* The CPU backend's runtime (see cpu.h and docs/design/cpu_backend.md).
 *
 * A launch runs the grid's blocks one after another. Within a block every
 * thread is a fiber with its own stack; the scheduler (the launching thread's
 * own context) resumes each fiber in turn until it returns or reaches
 * mg_cpu_barrier, which switches back. When a sweep over the block leaves
 * every fiber at a barrier, all are released; when some have returned while
 * others wait, that is barrier divergence and the launch stops with
 * mlirgpu.KernelError. Fibers never unwind: an abandoned fiber's stack is
 * simply reused by the next block or launch.
 *
 * A kernel that calls mg.grid.sync() (a cooperative one) needs every block
 * live at once: its launch runs all the grid's threads as fibers of one
 * group, each block with its own shared memory, up to
 * MG_CPU_MAX_COOPERATIVE_THREADS threads (past that, LaunchError, as the GPU
 * refuses a grid larger than it holds at once). The scheduler then releases
 * each block's mg.syncthreads() on its own, and mg_cpu_grid_sync once every
 * thread of the grid waits there.
 *
 * Everything a launch runs on is its own (mg_cpu_launch): the fibers and their
 * stacks, the scheduler's context, printf output, a failed bounds check. The
 * runtime calls below find it through a thread-local pointer, set while the
 * launch's blocks run on that thread. So two Python threads launch at the same
 * time, and Python code that runs between blocks (sys.stdout.write printing a
 * kernel's output) may itself launch a kernel. Blocks run without the GIL:
 * between blocks the launch takes it back to print, to check for signals
 * (Ctrl-C) and to raise errors. The only state shared by launches is the
 * cache of idle fiber pools, which is touched with the GIL held.
 *
 * The other runtime calls of the host trace: mg_cpu_shared (the block's
 * shared memory), mg_cpu_shuffle (a warp-level barrier that exchanges one
 * value per lane), mg_cpu_warp_put / mg_cpu_warp_collective / mg_cpu_warp_get
 * (the tensor-core collectives mma.sync and ldmatrix, at the same warp-level
 * barrier), mg_cpu_printf_arg / mg_cpu_printf (formatted into a buffer
 * that goes to sys.stdout between blocks), mg_cpu_bounds_index /
 * mg_cpu_out_of_bounds (a failed bounds check: recorded, and the fiber never
 * resumes). */
#include "cpu/cpu.h"
#include "host/engine.h"
#include "mlir/ir.h"
#include "host/runner_utils.h"

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

#define MG_CPU_STACK (64 * 1024)
#define MG_CPU_MAX_THREADS 1024 /* threads per block, as on the GPU */
#define MG_CPU_NINDEX 12        /* thread, block, block_dim, grid_dim: x, y, z each */
#define MG_CPU_WARP 32
#define MG_CPU_MAX_ARGS 32      /* printf values, bounds-check indices */
#define MG_CPU_SHARED_ALIGN 1024 /* of each block's shared memory: the 128-byte swizzle's period */
#define MG_CPU_NAMED_BARRIERS 16 /* bar.sync ids of a block (0 is syncthreads) */
#define MG_CPU_WARPGROUP 128
#define MG_CPU_WGMMA_MAX 128    /* f32 accumulators of a thread in one wgmma (m64n256) */
#define MG_CPU_WARP_DATA 16     /* 64-bit words a lane gives a warp collective */
#define MG_CPU_SLICE_NS 10000000 /* blocks run this long without the GIL before signals are checked */
#define MG_CPU_IDLE_POOLS 4     /* fiber pools kept for later launches */
/* Threads of a cooperative launch, all live at once (each a fiber with its stack). */
#define MG_CPU_MAX_COOPERATIVE_THREADS 8192

/* ------------------------------------------------------------------------ */
/* Fibers and the launch                                                     */

typedef void (*mg_packed_fn)(void **);

enum { FIBER_READY, FIBER_AT_BARRIER, FIBER_AT_SHUFFLE, FIBER_AT_GRID, FIBER_WAITING, FIBER_DONE, FIBER_FAILED };
/* What a FIBER_WAITING fiber waits for: an mbarrier's phase, or a named barrier. */
enum { WAIT_MBARRIER, WAIT_NAMED_BARRIER };

typedef struct {
    ucontext_t context;
    int state;
    int32_t line;     /* the barrier, grid barrier or shuffle it waits at */
    int32_t mode;     /* shuffle: MG_SHFL_* */
    int32_t offset;   /* shuffle: lane mask, delta or source lane */
    int32_t width;    /* shuffle: lanes per segment (a power of two, 1 to 32) */
    int64_t value;    /* shuffle: its value going in, then the one it reads */
    int ndata;        /* collective: words given so far */
    int64_t data[MG_CPU_WARP_DATA]; /* collective: its operands, then its results */
    int wait_kind;    /* waiting: WAIT_* */
    uint64_t *wait_on; /* waiting: the mbarrier, or the named barrier's generation */
    uint64_t wait_value; /* waiting: the phase parity, or the generation it arrived in */
    float wgmma[MG_CPU_WGMMA_MAX]; /* wgmma: the thread's accumulators, in and out */
} mg_fiber;

enum { MG_SHFL_XOR, MG_SHFL_DOWN, MG_SHFL_UP, MG_SHFL_IDX, MG_VOTE_BALLOT };
/* Warp collectives (mode >= MG_WARP_MMA_F16): mma.sync m16n8k16 f16/bf16 and
 * m16n8k8 tf32; ldmatrix is MG_WARP_LDMATRIX | count (1, 2, 4) | 8 if .trans. */
enum { MG_WARP_MMA_F16 = 16, MG_WARP_MMA_BF16 = 17, MG_WARP_MMA_TF32 = 18, MG_WARP_LDMATRIX = 32 };

/* Fibers and their stacks, one mapping: per fiber a guard page, then its stack. */
typedef struct fiber_pool {
    struct fiber_pool *next; /* in the idle list */
    mg_fiber *fibers;
    char *stacks;
    size_t capacity;
} fiber_pool;

/* What stopped a block, for the launch to raise once it holds the GIL again. */
enum { BLOCK_OK, BLOCK_OUT_OF_BOUNDS, BLOCK_BARRIER_DIVERGENCE, BLOCK_WARP_DIVERGENCE, BLOCK_COLLECTIVE_DIVERGENCE,
       BLOCK_MIXED_BARRIERS, BLOCK_GRID_DIVERGENCE, BLOCK_FAULT, BLOCK_WAIT_FOREVER };

typedef struct {
    int thread;
    int32_t name, kind, line;
    int rank;
    int64_t index[MG_CPU_MAX_ARGS], size[MG_CPU_MAX_ARGS];
} mg_bounds_error;

typedef struct {
    int waiting, other;      /* the waiting thread; the one that returned or waits elsewhere */
    int32_t line, other_line;
    int why;                 /* a collective's: COLLECTIVE_* of the lane `other`; else the state of `other` */
} mg_divergence;

/* Why a lane could not take part in its warp's tensor-core collective. */
enum { COLLECTIVE_NO_LANE, COLLECTIVE_OTHER_OPERATION, COLLECTIVE_RETURNED };

typedef struct {
    ucontext_t scheduler;
    fiber_pool *pool;
    int current;
    mg_packed_fn function;
    void ***arguments;       /* per thread: the packed argument array */
    const char *const *strings; /* the engine's: printf formats, array names */
    Py_ssize_t nstrings;
    char *shared[2];         /* the (first) block's static and dynamic shared memory */
    int64_t shared_size[2];
    int block_threads;       /* threads of a block: fiber t runs in block t / block_threads of the group */
    size_t shared_stride;    /* bytes from one block's shared memory to the next's */
    size_t shared_window;    /* bytes of a block's shared memory, static and dynamic */
    uint64_t *named;         /* per block of the group, MG_CPU_NAMED_BARRIERS (arrived, generation) pairs */
    int fault_thread;        /* BLOCK_FAULT: the thread, its line and what it did */
    int32_t fault_line;
    char fault[256];
    int nargs;               /* printf values or bounds-check indices pending */
    int64_t args[MG_CPU_MAX_ARGS], sizes[MG_CPU_MAX_ARGS];
    char *output;            /* printf output not yet written to sys.stdout (malloc: no GIL needed) */
    size_t output_len, output_cap;
    int output_failed;       /* out of memory while formatting: raised after the block */
    int failed;              /* BLOCK_* */
    mg_bounds_error bounds;
    mg_divergence divergence;
} mg_cpu_launch;

/* The launch whose blocks run on this thread (fibers share their thread's). */
static _Thread_local mg_cpu_launch *running;

static size_t page_size;
static fiber_pool *idle_pools; /* guarded by the GIL */
static int nidle_pools;

static size_t stack_stride(void) { return page_size + MG_CPU_STACK; }

static void pool_destroy(fiber_pool *p)
{
    munmap(p->stacks, p->capacity * stack_stride());
    PyMem_Free(p->fibers);
    PyMem_Free(p);
}

/* A pool of at least `n` fibers, idle or new; with the GIL. */
static fiber_pool *pool_take(size_t n)
{
    for (fiber_pool **at = &idle_pools; *at != NULL; at = &(*at)->next) {
        if ((*at)->capacity >= n) {
            fiber_pool *p = *at;
            *at = p->next;
            nidle_pools--;
            return p;
        }
    }
    if (page_size == 0)
        page_size = (size_t)sysconf(_SC_PAGESIZE);
    size_t capacity = MG_CPU_WARP;
    while (capacity < n)
        capacity *= 2;
    fiber_pool *p = PyMem_Calloc(1, sizeof *p);
    mg_fiber *fibers = PyMem_Calloc(capacity, sizeof *fibers);
    char *stacks = MAP_FAILED;
    if (p != NULL && fibers != NULL)
        stacks = mmap(NULL, capacity * stack_stride(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stacks == MAP_FAILED) {
        PyMem_Free(p);
        PyMem_Free(fibers);
        PyErr_NoMemory();
        return NULL;
    }
    /* A guard page under each stack: an overflow faults instead of corrupting its neighbour. */
    for (size_t i = 0; i < capacity; i++)
        mprotect(stacks + i * stack_stride(), page_size, PROT_NONE);
    p->fibers = fibers;
    p->stacks = stacks;
    p->capacity = capacity;
    return p;
}

/* Back to the idle list (the smallest goes when it is full); with the GIL. */
static void pool_give(fiber_pool *p)
{
    p->next = idle_pools;
    idle_pools = p;
    if (++nidle_pools <= MG_CPU_IDLE_POOLS)
        return;
    fiber_pool **smallest = &idle_pools;
    for (fiber_pool **at = &idle_pools; *at != NULL; at = &(*at)->next)
        if ((*at)->capacity < (*smallest)->capacity)
            smallest = at;
    fiber_pool *gone = *smallest;
    *smallest = gone->next;
    nidle_pools--;
    pool_destroy(gone);
}

static void fiber_main(void)
{
    mg_cpu_launch *l = running;
    int t = l->current;
    l->function(l->arguments[t]);
    l->pool->fibers[t].state = FIBER_DONE;
    /* Returning resumes uc_link: the scheduler. */
}

/* The running fiber stops in `state` (a block's or the grid's barrier) until
 * the scheduler resumes it. */
static void wait_at(int state, int32_t line)
{
    mg_cpu_launch *l = running;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = state;
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
}

void mg_cpu_barrier(int32_t line)
{
    wait_at(FIBER_AT_BARRIER, line);
}

/* What mg.grid.sync() becomes on the host: waits until every thread of the
 * grid (all live in a cooperative launch) has arrived. */
void mg_cpu_grid_sync(int32_t line)
{
    wait_at(FIBER_AT_GRID, line);
}

/* ------------------------------------------------------------------------ */
/* Shared memory                                                             */

struct mg_memref_1d {
    void *allocated, *aligned;
    int64_t offset, size, stride;
};

/* The C interface of `func.func private @mg_cpu_shared(i32) -> memref<?xi8>`:
 * 0 the block's static shared memory, 1 its dynamic (the launch's shared_mem). */
void _mlir_ciface_mg_cpu_shared(mg_memref_1d *result, int32_t which)
{
    mg_cpu_launch *l = running;
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
    mg_cpu_launch *l = running;
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
static void exchange(mg_fiber *fibers, int first, int end)
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
    mg_cpu_launch *l = running;
    mg_fiber *f = &l->pool->fibers[l->current];
    if (f->ndata < MG_CPU_WARP_DATA)
        f->data[f->ndata++] = bits;
}

void mg_cpu_warp_collective(int32_t mode, int32_t line)
{
    mg_cpu_launch *l = running;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_AT_SHUFFLE;
    f->mode = mode;
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
    f->ndata = 0;
}

int64_t mg_cpu_warp_get(int32_t k)
{
    mg_cpu_launch *l = running;
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
static float element(int mode, uint32_t reg, int i)
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
static void mma(mg_fiber *lanes, int mode)
{
    int K = mode == MG_WARP_MMA_TF32 ? 8 : 16;
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < MG_CPU_WARP; lane++) {
        const int64_t *d = lanes[lane].data;
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < (K == 16 ? 8 : 4); i++) {
            uint32_t reg = (uint32_t)d[K == 16 ? i / 2 : i];
            float value = element(mode, reg, K == 16 ? i % 2 : 0);
            if (K == 16)
                A[g + 8 * (i / 2 % 2)][2 * t + i % 2 + 8 * (i / 4)] = value;
            else
                A[g + 8 * (i % 2)][t + 4 * (i / 2)] = value;
        }
        for (int i = 0; i < (K == 16 ? 4 : 2); i++) {
            uint32_t reg = (uint32_t)d[4 + (K == 16 ? i / 2 : i)];
            float value = element(mode, reg, K == 16 ? i % 2 : 0);
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
static void ldmatrix(mg_fiber *lanes, int count, int transpose)
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
static int collective(mg_cpu_launch *l, mg_fiber *fibers, int first, int end)
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
        ldmatrix(lanes, mode & 7, (mode & 8) != 0);
    else
        mma(lanes, mode);
    for (int lane = 0; lane < MG_CPU_WARP; lane++)
        lanes[lane].state = FIBER_READY;
    return BLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Hopper: mbarriers, named barriers, TMA copies, wgmma                      */

/* A fault of the running thread (a shared address outside its block's shared
 * memory, a tensor map of the wrong kind): recorded for the scheduler, which
 * raises KernelError; the fiber is abandoned, never resumed. */
static void fault(int32_t line, const char *format, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fault(int32_t line, const char *format, ...)
{
    mg_cpu_launch *l = running;
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
static char *shared_window(mg_cpu_launch *l)
{
    return l->shared[0] + (size_t)(l->current / l->block_threads) * l->shared_stride;
}

/* Byte `offset` of the running block's shared memory, `nbytes` of it, or a fault of `what`. */
static char *shared_offset(size_t offset, size_t nbytes, const char *what, int32_t line)
{
    mg_cpu_launch *l = running;
    if (offset + nbytes > l->shared_window)
        fault(line, "%s: %zu bytes at byte %zu of shared memory, past the block's %zu", what, nbytes, offset,
              l->shared_window);
    return shared_window(l) + offset;
}

/* A u32 shared address as mg.shared.address gives it (the low 32 bits of the
 * host address) as an offset in the running block's shared memory. */
static size_t shared_address(uint32_t address)
{
    mg_cpu_launch *l = running;
    return (uint32_t)(address - (uint32_t)(uintptr_t)shared_window(l));
}

/* An mbarrier's 64 bits, as the PTX ISA's mbarrier object holds its state:
 * the arrivals a phase expects (bits 0-20), those still pending (21-41), the
 * transaction count (42-62, two's complement) and the current phase's parity (63). */
#define MB_FIELD 0x1fffffull
typedef struct {
    int64_t expected, pending, tx;
    uint64_t phase;
} mbarrier_state;

static mbarrier_state mb_unpack(uint64_t bits)
{
    int64_t tx = (int64_t)(bits >> 42 & MB_FIELD);
    return (mbarrier_state){(int64_t)(bits & MB_FIELD), (int64_t)(bits >> 21 & MB_FIELD),
                            tx & 0x100000 ? tx - 0x200000 : tx, bits >> 63};
}

/* Completes the phase if nothing is pending: the next expects as many arrivals. */
static uint64_t mb_pack(mbarrier_state m)
{
    if (m.pending == 0 && m.tx == 0) {
        m.phase ^= 1;
        m.pending = m.expected;
    }
    return (uint64_t)m.expected | (uint64_t)m.pending << 21 | ((uint64_t)m.tx & MB_FIELD) << 42 | m.phase << 63;
}

static uint64_t *mbarrier_at(int32_t address, const char *what, int32_t line)
{
    size_t offset = shared_address((uint32_t)address);
    if (offset % 8)
        fault(line, "%s: an mbarrier is 8-byte aligned, not at byte %zu of shared memory", what, offset);
    return (uint64_t *)shared_offset(offset, 8, what, line);
}

void mg_cpu_mbarrier_init(int32_t address, int32_t count, int32_t line)
{
    uint64_t *m = mbarrier_at(address, "mbarrier.init", line);
    if (count < 1 || (uint64_t)count >= (1 << 20))
        fault(line, "mbarrier.init: the arrival count is 1 to 2**20 - 1, not %d", (int)count);
    *m = (uint64_t)count | (uint64_t)count << 21;
}

/* arrive (transaction_bytes 0) or arrive.expect_tx: the bytes first, then the arrival. */
void mg_cpu_mbarrier_arrive(int32_t address, int32_t transaction_bytes, int32_t line)
{
    uint64_t *at = mbarrier_at(address, "mbarrier.arrive", line);
    mbarrier_state m = mb_unpack(*at);
    if (m.expected == 0)
        fault(line, "mbarrier.arrive on a barrier that was never initialised (init)");
    if (m.pending == 0)
        fault(line, "mbarrier.arrive: more arrivals than the barrier's phase expects (%lld)", (long long)m.expected);
    m.tx += transaction_bytes;
    m.pending--;
    *at = mb_pack(m);
}

/* The bytes of a copy that names the barrier have landed (complete-tx). */
static void mbarrier_complete_tx(uint64_t *at, int64_t bytes)
{
    mbarrier_state m = mb_unpack(*at);
    m.tx -= bytes;
    *at = mb_pack(m);
}

/* try_wait.parity until it succeeds: the phase of parity `parity` has completed
 * once the current phase has the other parity. */
void mg_cpu_mbarrier_wait(int32_t address, int32_t parity, int32_t line)
{
    mg_cpu_launch *l = running;
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
    mg_cpu_launch *l = running;
    if (id < 0 || id >= MG_CPU_NAMED_BARRIERS)
        fault(line, "a named barrier's id is 0 to %d, not %d", MG_CPU_NAMED_BARRIERS - 1, (int)id);
    if (threads > l->block_threads)
        fault(line, "named barrier %d counts %d threads, but the block has %d", (int)id, (int)threads,
              l->block_threads);
    uint64_t *b = l->named + ((size_t)(l->current / l->block_threads) * MG_CPU_NAMED_BARRIERS + (size_t)id) * 2;
    if (++b[0] >= (uint64_t)threads) {
        b[0] = 0;
        b[1]++;
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

static int wait_over(const mg_fiber *f)
{
    if (f->wait_kind == WAIT_MBARRIER)
        return (*f->wait_on >> 63) != f->wait_value;
    return *f->wait_on != f->wait_value;
}

/* The hardware's swizzle of a shared-memory offset (the block's shared memory
 * is 1024-byte aligned, so its bits are the address's): the 16-byte unit
 * (bits 4-6) XOR the 128-byte row's index (bits 7-9), over as many bits as the
 * mode has (128B: 3, 64B: 2, 32B: 1; swizzle_bytes 0: none). */
static size_t swizzled(size_t offset, int swizzle_bytes)
{
    size_t mask = swizzle_bytes ? (size_t)(swizzle_bytes / 16 - 1) << 4 : 0;
    return offset ^ (offset >> 3 & mask);
}

static const mg_cpu_tensor_map *host_tensor_map(void *map, int32_t rank, const char *what, int32_t line)
{
    const mg_cpu_tensor_map *m = map;
    if (m->magic != MG_CPU_TENSOR_MAP_MAGIC)
        fault(line, "%s: the tensor map was not made for the CPU backend", what);
    if (rank != m->rank)
        fault(line, "%s: %d coordinates for a %d-d tensor map", what, (int)rank, (int)m->rank);
    return m;
}

/* Copies the box at `coords` (innermost first) of the map's array to (load)
 * or from shared memory at byte `offset`, the box row-major there with the
 * map's swizzle; a load fills what lies outside the array (zeros, or NaN),
 * a store skips it. Returns the box's bytes. */
static size_t tma_copy(const mg_cpu_tensor_map *m, size_t offset, const int32_t *coords, int load,
                       const char *what, int32_t line)
{
    int rank = m->rank;
    size_t esize = m->element_size, count[5], total = 1;
    for (int i = 0; i < rank; i++) {
        count[i] = (m->box[i] + m->element_strides[i] - 1u) / m->element_strides[i];
        total *= count[i];
    }
    if (offset % 128)
        fault(line, "%s: the shared memory is at byte %zu, not 128-byte aligned", what, offset);
    /* The GPU stops with an illegal instruction where the box's rows start off a 16-byte boundary. */
    if ((int64_t)coords[0] * (int64_t)esize % 16)
        fault(line, "%s: the innermost coordinate %d is %lld bytes into a row: the box's rows must start at a "
              "multiple of 16 bytes", what, (int)coords[0], (long long)coords[0] * (long long)esize);
    shared_offset(offset, total * esize, what, line);
    unsigned char fill[8] = {0};
    if (m->oob_nan) {
        /* The canonical NaN of the element type (f16, f32, f64, bf16). */
        static const uint64_t nan[] = {0, 0, 0, 0, 0, 0, 0x7fff, 0x7fffffff, 0x7fffffffffffffffull, 0x7fff};
        uint64_t bits = m->data_type < 10 ? nan[m->data_type] : 0;
        memcpy(fill, &bits, esize);
    }
    size_t index[5] = {0, 0, 0, 0, 0};
    for (size_t e = 0; e < total; e++) {
        char *local = shared_offset(swizzled(offset + e * esize, m->swizzle_bytes), esize, what, line);
        int inside = 1;
        size_t at = 0;
        for (int i = 0; i < rank; i++) {
            int64_t g = (int64_t)coords[i] + (int64_t)(index[i] * m->element_strides[i]);
            inside &= g >= 0 && (uint64_t)g < m->dims[i];
            at += (size_t)g * m->strides[i];
        }
        char *global = (char *)(uintptr_t)m->address + at;
        if (load)
            memcpy(local, inside ? global : (const char *)fill, esize);
        else if (inside)
            memcpy(global, local, esize);
        for (int i = 0; i < rank && ++index[i] == count[i]; i++)
            index[i] = 0;
    }
    return total * esize;
}

void mg_cpu_tma_load(void *map, int32_t destination, int32_t barrier, int32_t rank, int32_t c0, int32_t c1,
                     int32_t c2, int32_t c3, int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    const mg_cpu_tensor_map *m = host_tensor_map(map, rank, "mg.tma.load", line);
    uint64_t *bar = mbarrier_at(barrier, "mg.tma.load's mbarrier", line);
    size_t bytes = tma_copy(m, shared_address((uint32_t)destination), coords, 1, "mg.tma.load", line);
    mbarrier_complete_tx(bar, (int64_t)bytes);
}

void mg_cpu_tma_store(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                      int32_t c4, int32_t line)
{
    int32_t coords[5] = {c0, c1, c2, c3, c4};
    const mg_cpu_tensor_map *m = host_tensor_map(map, rank, "mg.tma.store", line);
    if (m->readonly)
        fault(line, "mg.tma.store: the tensor map's array is read-only");
    tma_copy(m, shared_address((uint32_t)source), coords, 0, "mg.tma.store", line);
}

/* The C interface of `@mg_cpu_wgmma_buffer() -> memref<?xf32>`: the thread's
 * accumulators, written before mg_cpu_wgmma and read after it. */
void _mlir_ciface_mg_cpu_wgmma_buffer(mg_memref_1d *result)
{
    mg_cpu_launch *l = running;
    float *acc = l->pool->fibers[l->current].wgmma;
    *result = (mg_memref_1d){acc, acc, 0, MG_CPU_WGMMA_MAX, 1};
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
    mg_cpu_launch *l = running;
    /* The start address holds bits 4-17 of the shared address: shared memory is under 256 KB. */
    size_t start = (uint32_t)(((d & 0x3fff) << 4) - (uint32_t)(uintptr_t)shared_window(l)) & 0x3ffff;
    return (wgmma_operand){start, (d >> 16 & 0x3fff) << 4, (d >> 32 & 0x3fff) << 4, swizzles[d >> 62], k_major};
}

/* Element (mn, k) of a 2-byte operand: the canonical layouts of the PTX ISA
 * (8-row groups of 16-byte core matrices, or rows of the swizzle's width),
 * as mlirgpu.layout.wgmma checks tiles against them, then the swizzle. */
static float wgmma_element(const wgmma_operand *o, int mn, int k, int bf16, int32_t line)
{
    size_t width = o->swizzle_bytes ? (size_t)o->swizzle_bytes : 16, at;
    if (o->k_major)
        at = o->swizzle_bytes ? (size_t)(mn % 8) * width + (size_t)(mn / 8) * o->sbo + (size_t)k * 2
                              : (size_t)(mn % 8) * 16 + (size_t)(mn / 8) * o->sbo + (size_t)(k % 8) * 2 +
                                (size_t)(k / 8) * o->lbo;
    else if (o->swizzle_bytes == 0)
        at = (size_t)(mn % 8) * 2 + (size_t)(mn / 8) * o->sbo + (size_t)(k % 8) * 16 + (size_t)(k / 8) * o->lbo;
    else
        at = (size_t)(mn % (width / 2)) * 2 + (size_t)(mn / (width / 2)) * o->lbo + (size_t)(k % 8) * width +
             (size_t)(k / 8) * o->sbo;
    uint16_t h;
    memcpy(&h, shared_offset(swizzled(o->start + at, o->swizzle_bytes), 2, "mg.wgmma.mma", line), 2);
    return bf16 ? bits_to_float((uint32_t)h << 16) : half_to_float(h);
}

/* wgmma.mma_async m64nNk16 with f32 accumulators, this thread's part: its
 * N/2 accumulators (rows and columns as mg.wgmma.accumulator_coordinates
 * says) plus the products of A's rows and B's columns, read from shared
 * memory through the descriptors when it is issued. `mode`: bit 0 bf16 (else
 * f16), bit 1 B MN-major (else K-major). Products are summed in double and
 * rounded to f32 once. */
void mg_cpu_wgmma(int32_t n, int64_t a, int64_t b, int32_t mode, int32_t line)
{
    mg_cpu_launch *l = running;
    float *acc = l->pool->fibers[l->current].wgmma;
    int t = l->current % l->block_threads % MG_CPU_WARPGROUP, warp = t / 32, lane = t % 32, bf16 = mode & 1;
    if (n < 8 || n > 2 * MG_CPU_WGMMA_MAX || n % 8)
        fault(line, "mg.wgmma.mma: N is a multiple of 8 from 8 to 256, not %d", (int)n);
    wgmma_operand A = wgmma_descriptor(a, 1), B = wgmma_descriptor(b, !(mode & 2));
    float rows[2][16];
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 16; k++)
            rows[h][k] = wgmma_element(&A, warp * 16 + lane / 4 + 8 * h, k, bf16, line);
    for (int r = 0; r < n / 2; r++) {
        int row = (r >> 1) & 1, column = (r >> 2) * 8 + (lane % 4) * 2 + (r & 1);
        double sum = acc[r];
        for (int k = 0; k < 16; k++)
            sum += (double)rows[row][k] * (double)wgmma_element(&B, column, k, bf16, line);
        acc[r] = (float)sum;
    }
}

/* ------------------------------------------------------------------------ */
/* printf                                                                    */

void mg_cpu_printf_arg(int64_t bits)
{
    mg_cpu_launch *l = running;
    if (l->nargs < MG_CPU_MAX_ARGS)
        l->args[l->nargs++] = bits;
}

static void append_output(mg_cpu_launch *l, const char *text, size_t len)
{
    if (l->output_len + len + 1 > l->output_cap) {
        size_t cap = l->output_cap ? l->output_cap : 4096;
        while (cap < l->output_len + len + 1)
            cap *= 2;
        char *grown = realloc(l->output, cap);
        if (grown == NULL) {
            l->output_failed = 1;
            return;
        }
        l->output = grown;
        l->output_cap = cap;
    }
    memcpy(l->output + l->output_len, text, len);
    l->output_len += len;
}

/* Formats strings[format] with the values mg_cpu_printf_arg gave, as C's
 * printf would (the trace promoted them: ints to 32 or 64 bits, floats to
 * double), one conversion at a time. */
void mg_cpu_printf(int32_t format)
{
    mg_cpu_launch *l = running;
    int nargs = l->nargs, next = 0;
    l->nargs = 0;
    if (format < 0 || format >= l->nstrings)
        return;
    const char *p = l->strings[format];
    char spec[64], text[512];
    while (*p) {
        const char *percent = strchr(p, '%');
        if (percent == NULL) {
            append_output(l, p, strlen(p));
            break;
        }
        append_output(l, p, (size_t)(percent - p));
        if (percent[1] == '%') {
            append_output(l, "%", 1);
            p = percent + 2;
            continue;
        }
        /* %[flags][width][.precision][length]conversion */
        const char *q = percent + 1;
        q += strspn(q, "-+ #0");
        q += strspn(q, "0123456789");
        if (*q == '.')
            q += 1 + strspn(q + 1, "0123456789");
        int wide = 0;
        const char *length = q;
        q += strspn(q, "hlLjzt");
        for (const char *c = length; c < q; c++)
            wide |= *c == 'l' || *c == 'j' || *c == 'z' || *c == 't' || *c == 'L';
        if (*q == '\0')
            break;
        size_t n = (size_t)(length - percent);
        if (n + 4 > sizeof spec)
            break;
        memcpy(spec, percent, n); /* without the length modifier: we pick the C type */
        int64_t bits = next < nargs ? l->args[next] : 0;
        next++;
        char conversion = *q;
        int len = 0;
        if (strchr("diouxXc", conversion)) {
            if (wide)
                spec[n++] = 'l', spec[n++] = 'l';
            spec[n++] = conversion;
            spec[n] = '\0';
            if (conversion == 'c')
                len = snprintf(text, sizeof text, spec, (int)bits);
            else if (strchr("di", conversion))
                len = wide ? snprintf(text, sizeof text, spec, (long long)bits) : snprintf(text, sizeof text, spec, (int)bits);
            else
                len = wide ? snprintf(text, sizeof text, spec, (unsigned long long)bits)
                           : snprintf(text, sizeof text, spec, (unsigned)bits);
        } else if (strchr("eEfFgGaA", conversion)) {
            double d;
            memcpy(&d, &bits, sizeof d);
            spec[n++] = conversion;
            spec[n] = '\0';
            len = snprintf(text, sizeof text, spec, d);
        }
        if (len > 0)
            append_output(l, text, (size_t)len < sizeof text ? (size_t)len : sizeof text - 1);
        p = q + 1;
    }
}

/* Writes the pending printf output to sys.stdout, with the GIL (and from the
 * scheduler: Python does not run on a fiber's small stack); -1 with an
 * exception set. sys.stdout.write may run any Python code, kernel launches
 * included: those use launch state of their own. */
static int flush_output(mg_cpu_launch *l)
{
    if (l->output_failed) {
        l->output_failed = 0;
        l->output_len = 0;
        PyErr_NoMemory();
        return -1;
    }
    if (l->output_len == 0)
        return 0;
    PyObject *text = PyUnicode_DecodeUTF8(l->output, (Py_ssize_t)l->output_len, "replace");
    l->output_len = 0;
    if (text == NULL)
        return -1;
    PyObject *out = PySys_GetObject("stdout"); /* borrowed: held while write runs */
    PyObject *r = NULL;
    if (out != NULL && out != Py_None) {
        Py_INCREF(out);
        r = PyObject_CallMethod(out, "write", "O", text);
        Py_DECREF(out);
    }
    else
        r = Py_NewRef(Py_None);
    Py_DECREF(text);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Bounds checks                                                             */

void mg_cpu_bounds_index(int64_t index, int64_t size)
{
    mg_cpu_launch *l = running;
    if (l->nargs < MG_CPU_MAX_ARGS) {
        l->args[l->nargs] = index;
        l->sizes[l->nargs++] = size;
    }
}

/* An access failed its check: recorded for the scheduler, which raises
 * KernelError; this fiber is abandoned, never resumed. */
void mg_cpu_out_of_bounds(int32_t name, int32_t kind, int32_t line)
{
    mg_cpu_launch *l = running;
    mg_bounds_error *e = &l->bounds;
    l->failed = BLOCK_OUT_OF_BOUNDS;
    e->thread = l->current;
    e->name = name;
    e->kind = kind;
    e->line = line;
    e->rank = l->nargs;
    memcpy(e->index, l->args, sizeof e->index);
    memcpy(e->size, l->sizes, sizeof e->size);
    l->nargs = 0;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_FAILED;
    swapcontext(&f->context, &l->scheduler);
}

static void thread_xyz(int t, const int64_t *bdim, long long xyz[3])
{
    xyz[0] = t % bdim[0];
    xyz[1] = t / bdim[0] % bdim[1];
    xyz[2] = t / (bdim[0] * bdim[1]);
}

/* Where a launch's blocks ran: fiber t is thread t % per_block of the block
 * numbered first_block + t / per_block (x fastest) in the grid. */
typedef struct {
    const int64_t *grid, *bdim;
    int64_t first_block;
    int per_block;
    const char *source;
} mg_group_place;

/* "thread (x, y, z) of block (a, b, c)" of fiber t ("thread (x, y, z)" without `block`). */
static void thread_text(char *out, size_t cap, const mg_group_place *at, int t, int block)
{
    long long w[3];
    thread_xyz(t % at->per_block, at->bdim, w);
    int64_t b = at->first_block + t / at->per_block;
    if (!block)
        PyOS_snprintf(out, cap, "thread (%lld, %lld, %lld)", w[0], w[1], w[2]);
    else
        PyOS_snprintf(out, cap, "thread (%lld, %lld, %lld) of block (%lld, %lld, %lld)", w[0], w[1], w[2],
                      (long long)(b % at->grid[0]), (long long)(b / at->grid[0] % at->grid[1]),
                      (long long)(b / (at->grid[0] * at->grid[1])));
}

static const char *string_at(const mg_cpu_launch *l, int32_t i)
{
    return i >= 0 && i < l->nstrings ? l->strings[i] : "?";
}

static void tuple_text(char *out, size_t cap, const int64_t *v, int n)
{
    size_t at = (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, i ? ", %lld" : "%lld", (long long)v[i]);
    if (at < cap)
        snprintf(out + at, cap - at, n == 1 ? ",)" : ")");
}

static const char *barrier_name(int state)
{
    return state == FIBER_AT_GRID ? "mg.grid.sync()" : "mg.syncthreads()";
}

/* The KernelError of the blocks that failed; with the GIL. */
static void raise_block_error(mg_cpu_launch *l, const mg_group_place *at)
{
    static const char *kinds[] = {"load from", "store to", "atomic update of", "vector load from",
                                  "vector store to"};
    const char *source = at->source;
    char who[160], other[160];
    if (l->failed == BLOCK_OUT_OF_BOUNDS) {
        mg_bounds_error *e = &l->bounds;
        char index[512], shape[512];
        tuple_text(index, sizeof index, e->index, e->rank);
        tuple_text(shape, sizeof shape, e->size, e->rank);
        thread_text(who, sizeof who, at, e->thread, 1);
        mg_raise(mg_st->KernelError, "out-of-bounds %s '%s' at index %s [shape %s] by %s at %s:%d",
                 kinds[e->kind >= 0 && e->kind < 5 ? e->kind : 0], string_at(l, e->name), index, shape, who,
                 source, (int)e->line);
        return;
    }
    if (l->failed == BLOCK_FAULT) {
        thread_text(who, sizeof who, at, l->fault_thread, 1);
        mg_raise(mg_st->KernelError, "%s, by %s at %s:%d", l->fault, who, source, (int)l->fault_line);
        return;
    }
    mg_divergence *v = &l->divergence;
    thread_text(who, sizeof who, at, v->waiting, 1);
    if (l->failed == BLOCK_WAIT_FOREVER) {
        mg_raise(mg_st->KernelError,
                 "deadlock at %s:%d: %s waits on line %d for %s that no thread of its block can complete "
                 "(the others have returned or wait as well)", source, (int)v->line, who, (int)v->line,
                 v->why == WAIT_MBARRIER ? "an mbarrier phase" : "a named barrier");
        return;
    }
    if (l->failed == BLOCK_COLLECTIVE_DIVERGENCE) {
        mg_raise(mg_st->KernelError,
                 "warp divergence at %s:%d: %s runs a warp-wide tensor-core operation (mma.sync, ldmatrix) "
                 "on line %d, which needs all 32 lanes of its warp, but lane %d %s",
                 source, (int)v->line, who, (int)v->line, v->other,
                 v->why == COLLECTIVE_NO_LANE ? "does not exist (the block is not a whole number of warps)"
                 : v->why == COLLECTIVE_OTHER_OPERATION ? "is at another warp operation" : "has returned");
        return;
    }
    thread_text(other, sizeof other, at, v->other, l->failed == BLOCK_GRID_DIVERGENCE);
    if (l->failed == BLOCK_WARP_DIVERGENCE)
        mg_raise(mg_st->KernelError,
                 "warp divergence at %s:%d: %s waits at a warp shuffle on line %d, but %s of its warp waits "
                 "at %s on line %d", source, (int)v->line, who, (int)v->line, other, barrier_name(v->why),
                 (int)v->other_line);
    else if (l->failed == BLOCK_MIXED_BARRIERS)
        mg_raise(mg_st->KernelError,
                 "barrier divergence at %s:%d: %s waits at mg.syncthreads() on line %d, but %s of its block "
                 "waits at mg.grid.sync() on line %d", source, (int)v->line, who, (int)v->line, other,
                 (int)v->other_line);
    else
        mg_raise(mg_st->KernelError,
                 "barrier divergence at %s:%d: %s waits at %s on line %d, but %s returned without reaching it",
                 source, (int)v->line, who, l->failed == BLOCK_GRID_DIVERGENCE ? "mg.grid.sync()"
                 : "mg.syncthreads()", (int)v->line, other);
}

/* ------------------------------------------------------------------------ */
/* Running blocks                                                            */

/* Per state, how many threads of [first, end) are in it, and the first of each. */
typedef struct {
    int count[FIBER_FAILED + 1], first[FIBER_FAILED + 1];
} mg_census;

static mg_census census(const mg_fiber *fibers, int first, int end)
{
    mg_census c;
    for (int s = 0; s <= FIBER_FAILED; s++) {
        c.count[s] = 0;
        c.first[s] = -1;
    }
    for (int t = first; t < end; t++) {
        int s = fibers[t].state;
        if (c.count[s]++ == 0)
            c.first[s] = t;
    }
    return c;
}

/* Runs `nblocks` blocks of `per_block` threads as fibers at once (one block,
 * but for a cooperative launch), without the GIL: BLOCK_OK, or what stopped
 * them (barrier or warp divergence, a failed bounds check), recorded in the
 * launch for raise_block_error. */
static int run_blocks(mg_cpu_launch *l, int nblocks, int per_block)
{
    mg_fiber *fibers = l->pool->fibers;
    int n = nblocks * per_block;
    for (int t = 0; t < n; t++) {
        mg_fiber *f = &fibers[t];
        getcontext(&f->context);
        f->context.uc_stack.ss_sp = l->pool->stacks + (size_t)t * stack_stride() + page_size;
        f->context.uc_stack.ss_size = MG_CPU_STACK;
        f->context.uc_link = &l->scheduler;
        makecontext(&f->context, fiber_main, 0);
        f->state = FIBER_READY;
        f->ndata = 0; /* a fiber abandoned mid-collective may have left words behind */
    }
    memset(l->named, 0, (size_t)nblocks * MG_CPU_NAMED_BARRIERS * 2 * sizeof *l->named);
    for (;;) {
        for (int t = 0; t < n; t++) {
            if (fibers[t].state == FIBER_WAITING && wait_over(&fibers[t]))
                fibers[t].state = FIBER_READY;
            if (fibers[t].state != FIBER_READY)
                continue;
            l->current = t;
            swapcontext(&l->scheduler, &fibers[t].context);
            if (l->failed)
                return l->failed;
        }
        /* Every fiber has returned or waits. A warp whose remaining threads
         * all wait at a shuffle completes it; they run on before any barrier. */
        int progress = 0;
        for (int b = 0; b < nblocks; b++) {
            int block_end = (b + 1) * per_block;
            for (int first = b * per_block; first < block_end; first += MG_CPU_WARP) {
                int end = first + MG_CPU_WARP < block_end ? first + MG_CPU_WARP : block_end;
                mg_census c = census(fibers, first, end);
                /* A lane that waits (an mbarrier, a named barrier) will come. */
                if (!c.count[FIBER_AT_SHUFFLE] || c.count[FIBER_AT_BARRIER] || c.count[FIBER_AT_GRID] ||
                    c.count[FIBER_WAITING])
                    continue;
                /* A lane at a tensor-core collective makes it one (which fails
                 * unless all 32 lanes are at the same). */
                int tensor_core = 0;
                for (int t = first; t < end; t++)
                    tensor_core |= fibers[t].state == FIBER_AT_SHUFFLE && fibers[t].mode >= MG_WARP_MMA_F16;
                if (!tensor_core)
                    exchange(fibers, first, end);
                else if (collective(l, fibers, first, end) != BLOCK_OK)
                    return l->failed;
                progress = 1;
            }
        }
        if (progress)
            continue;
        /* A block whose threads all wait at mg.syncthreads() goes on. */
        for (int b = 0; b < nblocks; b++) {
            int first = b * per_block, end = first + per_block;
            if (census(fibers, first, end).count[FIBER_AT_BARRIER] == per_block) {
                for (int t = first; t < end; t++)
                    fibers[t].state = FIBER_READY;
                progress = 1;
            }
        }
        if (progress)
            continue;
        /* A wait that a thread swept after it ended (its phase completed, its named barrier was released). */
        for (int t = 0; t < n && !progress; t++)
            progress = fibers[t].state == FIBER_WAITING && wait_over(&fibers[t]);
        if (progress)
            continue;
        mg_census all = census(fibers, 0, n);
        if (all.count[FIBER_AT_GRID] == n) {
            for (int t = 0; t < n; t++)
                fibers[t].state = FIBER_READY;
            continue;
        }
        if (all.count[FIBER_DONE] == n)
            return BLOCK_OK;
        /* Nothing can go on: say why, for the first thread that waits. */
        int stuck = all.first[FIBER_WAITING];
        if (stuck >= 0) {
            l->divergence = (mg_divergence){stuck, 0, fibers[stuck].line, 0, fibers[stuck].wait_kind};
            return l->failed = BLOCK_WAIT_FOREVER;
        }
        int shuffling = all.first[FIBER_AT_SHUFFLE];
        if (shuffling >= 0) {
            /* Its warp has a thread at a barrier: neither can go on. */
            int block_first = shuffling / per_block * per_block;
            int warp_first = block_first + (shuffling - block_first) / MG_CPU_WARP * MG_CPU_WARP;
            int other = warp_first;
            while (fibers[other].state != FIBER_AT_BARRIER && fibers[other].state != FIBER_AT_GRID)
                other++;
            l->divergence = (mg_divergence){shuffling, other, fibers[shuffling].line, fibers[other].line,
                                            fibers[other].state};
            return l->failed = BLOCK_WARP_DIVERGENCE;
        }
        for (int b = 0; b < nblocks; b++) {
            mg_census c = census(fibers, b * per_block, (b + 1) * per_block);
            int waiting = c.first[FIBER_AT_BARRIER];
            if (waiting < 0)
                continue;
            int done = c.first[FIBER_DONE];
            int other = done >= 0 ? done : c.first[FIBER_AT_GRID];
            l->divergence = (mg_divergence){waiting, other, fibers[waiting].line, fibers[other].line, 0};
            return l->failed = done >= 0 ? BLOCK_BARRIER_DIVERGENCE : BLOCK_MIXED_BARRIERS;
        }
        /* Threads at mg.grid.sync() while others have returned. */
        int waiting = all.first[FIBER_AT_GRID];
        l->divergence = (mg_divergence){waiting, all.first[FIBER_DONE], fibers[waiting].line, 0, 0};
        return l->failed = BLOCK_GRID_DIVERGENCE;
    }
}

/* ------------------------------------------------------------------------ */
/* CpuEngine                                                                 */

enum { PARAM_MEMREF, PARAM_SCALAR, PARAM_TENSOR_MAP };
#define MG_CPU_TENSOR_MAP_WORDS 16 /* the 128 bytes of a tensor map */

typedef struct {
    int kind;
    int rank;        /* memref */
    int written;     /* memref: the kernel may store to it (a read-only array is refused) */
    Py_ssize_t size; /* memref: element size; scalar: bytes */
} mg_cpu_param;

typedef struct {
    PyObject_HEAD
    MlirExecutionEngine engine;
    mg_packed_fn function;
    mg_cpu_param *params;
    Py_ssize_t nparams;
    int uses_fibers;
    int cooperative;   /* it calls mg.grid.sync(): every block of a launch runs at once */
    Py_ssize_t static_shared; /* bytes of the kernel's mg.shared.array arrays */
    PyObject *name;    /* str */
    PyObject *source;  /* str: the kernel's file, for errors */
    PyObject *strings; /* tuple of str: printf formats and array names, by index */
    const char **texts; /* their UTF-8, owned by `strings` */
} mg_CpuEngine;

static PyTypeObject *CpuEngineType;

static int parse_params(mg_CpuEngine *self, PyObject *params)
{
    /* A tuple of our own: the items' conversions may run Python code that changes a list. */
    PyObject *seq = PySequence_Check(params) ? PySequence_Tuple(params) : NULL;
    if (seq == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "params must be a sequence of (kind, rank, size[, written]) tuples");
        }
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    self->params = PyMem_Calloc(n ? (size_t)n : 1, sizeof *self->params);
    if (self->params == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *kind;
        int rank, written = 1;
        Py_ssize_t size;
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (!PyTuple_Check(item)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "param %zd must be a (kind, rank, size[, written]) tuple", i);
            return -1;
        }
        if (!PyArg_ParseTuple(item, "sin|p:param", &kind, &rank, &size, &written)) {
            Py_DECREF(seq);
            return -1;
        }
        mg_cpu_param *p = &self->params[i];
        if (strcmp(kind, "memref") == 0 && rank >= 0 && rank <= 8 && size > 0)
            *p = (mg_cpu_param){PARAM_MEMREF, rank, written, size};
        else if (strcmp(kind, "scalar") == 0 && size > 0 && size <= 16)
            *p = (mg_cpu_param){PARAM_SCALAR, 0, 0, size};
        else if (strcmp(kind, "tensormap") == 0 && size == MG_CPU_TENSOR_MAP_WORDS * 8)
            *p = (mg_cpu_param){PARAM_TENSOR_MAP, 0, 0, size};
        else {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "param %zd: bad (kind, rank, size) (%s, %d, %zd)", i, kind, rank, size);
            return -1;
        }
    }
    self->nparams = n;
    Py_DECREF(seq);
    return 0;
}

static const struct {
    const char *name;
    void *address;
} runtime_symbols[] = {
    {"mg_cpu_barrier", (void *)mg_cpu_barrier},
    {"mg_cpu_grid_sync", (void *)mg_cpu_grid_sync},
    {"_mlir_ciface_mg_cpu_shared", (void *)_mlir_ciface_mg_cpu_shared},
    {"mg_cpu_shuffle", (void *)mg_cpu_shuffle},
    {"mg_cpu_warp_put", (void *)mg_cpu_warp_put},
    {"mg_cpu_warp_collective", (void *)mg_cpu_warp_collective},
    {"mg_cpu_warp_get", (void *)mg_cpu_warp_get},
    {"mg_cpu_printf_arg", (void *)mg_cpu_printf_arg},
    {"mg_cpu_printf", (void *)mg_cpu_printf},
    {"mg_cpu_bounds_index", (void *)mg_cpu_bounds_index},
    {"mg_cpu_out_of_bounds", (void *)mg_cpu_out_of_bounds},
    {"mg_cpu_mbarrier_init", (void *)mg_cpu_mbarrier_init},
    {"mg_cpu_mbarrier_arrive", (void *)mg_cpu_mbarrier_arrive},
    {"mg_cpu_mbarrier_wait", (void *)mg_cpu_mbarrier_wait},
    {"mg_cpu_named_barrier", (void *)mg_cpu_named_barrier},
    {"mg_cpu_tma_load", (void *)mg_cpu_tma_load},
    {"mg_cpu_tma_store", (void *)mg_cpu_tma_store},
    {"_mlir_ciface_mg_cpu_wgmma_buffer", (void *)_mlir_ciface_mg_cpu_wgmma_buffer},
    {"mg_cpu_wgmma", (void *)mg_cpu_wgmma},
};

typedef struct {
    MlirExecutionEngine engine;
    MlirStringRef name;
    mg_packed_fn function;
} engine_start;

/* Registers the runtime, runs the JIT (materialization happens here and in
 * the lookup, where LLVM may still hit a fatal error) and finds the kernel. */
static void start_engine(void *arg)
{
    engine_start *s = arg;
    for (size_t i = 0; i < sizeof runtime_symbols / sizeof *runtime_symbols; i++)
        mlirExecutionEngineRegisterSymbol(s->engine, mlirStringRefCreateFromCString(runtime_symbols[i].name),
                                          runtime_symbols[i].address);
    for (const mg_runtime_symbol *c = mg_conversion_symbols; c->name != NULL; c++)
        mlirExecutionEngineRegisterSymbol(s->engine, mlirStringRefCreateFromCString(c->name), c->address);
    mlirExecutionEngineInitialize(s->engine);
    s->function = (mg_packed_fn)mlirExecutionEngineLookupPacked(s->engine, s->name);
}

static PyObject *CpuEngine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"module", "name", "params", "source", "uses_fibers", "strings", "static_shared",
                             "opt_level", "cooperative", NULL};
    PyObject *module, *name, *params, *source, *strings = NULL, *held = NULL;
    int uses_fibers = 1, opt_level = 2, cooperative = 0;
    Py_ssize_t static_shared = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUOU|pOnip:CpuEngine", kwlist, &module, &name, &params, &source,
                                     &uses_fibers, &strings, &static_shared, &opt_level, &cooperative))
        return NULL;
    if (opt_level < 0 || opt_level > 3)
        return PyErr_Format(PyExc_ValueError, "opt_level must be 0..3, not %d", opt_level);
    if (static_shared < 0)
        return PyErr_Format(PyExc_ValueError, "static_shared must be >= 0, not %zd", static_shared);
    mg_CpuEngine *self = (mg_CpuEngine *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->source = Py_NewRef(source);
    self->cooperative = cooperative;
    self->uses_fibers = uses_fibers || cooperative;
    self->static_shared = static_shared;
    /* Everything that can run Python code (the sequences) before the module is looked at. */
    self->strings = strings != NULL ? PySequence_Tuple(strings) : PyTuple_New(0);
    if (self->strings == NULL || parse_params(self, params) < 0)
        goto error;
    self->texts = PyMem_Calloc((size_t)PyTuple_GET_SIZE(self->strings) + 1, sizeof *self->texts);
    if (self->texts == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->strings); i++) {
        PyObject *text = PyTuple_GET_ITEM(self->strings, i);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "strings must be str");
            goto error;
        }
        if ((self->texts[i] = PyUnicode_AsUTF8(text)) == NULL)
            goto error;
    }

    /* The engine is JIT-compiled from text: the module as lower() returns it,
     * or an ir.Module printed here. */
    mg_buf printed = {0};
    held = Py_NewRef(module);
    MlirStringRef ir_text;
    int allow_unregistered = 0;
    if (PyUnicode_Check(module)) {
        Py_ssize_t len;
        /* A str never changes; `held` keeps it alive while the GIL is released. */
        const char *data = PyUnicode_AsUTF8AndSize(module, &len);
        if (data == NULL)
            goto error;
        ir_text = mlirStringRefCreate(data, (size_t)len);
    } else {
        mg_ir_Operation *op = mg_ir_module_operation(module);
        if (op == NULL)
            goto error;
        mg_ir_Context *ctx = op->context;
        mg_ir_diag_clear(ctx);
        if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx)) {
            mg_ir_diag_raise(ctx, mg_st->MLIRError, "the host module does not verify");
            goto error;
        }
        if (mg_engine_print_source(op, &printed) < 0)
            goto error;
        ir_text = mlirStringRefCreate(printed.data, printed.len);
        allow_unregistered = mlirContextGetAllowUnregisteredDialects(ctx->context);
    }
    PyObject *what = PyUnicode_FromFormat("%U for the host", name);
    const char *what_text = what != NULL ? PyUnicode_AsUTF8(what) : NULL;
    if (what_text != NULL)
        self->engine = mg_engine_create_detached(ir_text, allow_unregistered, opt_level, what_text);
    Py_XDECREF(what);
    free(printed.data);
    if (mlirExecutionEngineIsNull(self->engine))
        goto error;
    PyObject *packed = PyUnicode_FromFormat("_mlir_ciface_%U", name);
    if (packed == NULL)
        goto error;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(packed, &len);
    if (text == NULL) {
        Py_DECREF(packed);
        goto error;
    }
    engine_start s = {self->engine, mlirStringRefCreate(text, (size_t)len), NULL};
    /* No Python object can reach the engine yet: materialized without the GIL. */
    int fatal;
    Py_BEGIN_ALLOW_THREADS
    fatal = mg_fatal_guarded(start_engine, &s);
    Py_END_ALLOW_THREADS
    Py_DECREF(packed);
    if (fatal) {
        self->engine.ptr = NULL; /* LLVM stopped half-way through it: leaked, never touched */
        mg_raise(mg_st->CompileError, "LLVM failed while JIT-compiling %U for the host: %s", name,
                 mg_fatal_reason);
        goto error;
    }
    self->function = s.function;
    if (self->function == NULL) {
        mg_raise(mg_st->CompileError, "the host module has no function %U with llvm.emit_c_interface", name);
        goto error;
    }
    Py_DECREF(held);
    return (PyObject *)self;
error:
    Py_XDECREF(held);
    Py_DECREF(self);
    return NULL;
}

static void CpuEngine_dealloc(mg_CpuEngine *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (!mlirExecutionEngineIsNull(self->engine))
        mlirExecutionEngineDestroy(self->engine);
    PyMem_Free(self->params);
    PyMem_Free(self->texts);
    Py_XDECREF(self->strings);
    Py_XDECREF(self->name);
    Py_XDECREF(self->source);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* A (x, y, z) of positive ints, or an int (y = z = 1). A list is copied into
 * a tuple first: an item's __index__ may change the list while it is read. */
static int dim3(PyObject *obj, const char *what, int64_t out[3])
{
    out[0] = out[1] = out[2] = 1;
    PyObject *items = NULL;
    if (PyIndex_Check(obj) && !PyBool_Check(obj)) {
        out[0] = PyLong_AsLongLong(obj);
    } else if (PyTuple_Check(obj) || PyList_Check(obj)) {
        items = PySequence_Tuple(obj);
        if (items == NULL)
            return -1;
        Py_ssize_t n = PyTuple_GET_SIZE(items);
        if (n < 1 || n > 3) {
            Py_DECREF(items);
            mg_raise(mg_st->LaunchError, "%s must be an int or a tuple of 1 to 3 ints, got %zd items", what, n);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(items, i);
            if (!PyIndex_Check(item) || PyBool_Check(item)) {
                PyErr_SetString(PyExc_TypeError, "not an int");
                break;
            }
            out[i] = PyLong_AsLongLong(item);
            if (out[i] == -1 && PyErr_Occurred())
                break;
        }
        Py_DECREF(items);
    } else {
        PyErr_SetString(PyExc_TypeError, "not an int");
    }
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;  /* KeyboardInterrupt and the like go on as they are */
        PyErr_Clear();
        mg_raise(mg_st->LaunchError, "%s must be an int or a tuple of 1 to 3 ints", what);
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (out[i] < 1 || out[i] > INT32_MAX) {
            mg_raise(mg_st->LaunchError, "%s[%d] = %lld is not in 1..2**31-1", what, i, (long long)out[i]);
            return -1;
        }
    return 0;
}

/* The threads of a block, or -1 past MG_CPU_MAX_THREADS (the product of three
 * extents up to 2**31-1 does not fit in 64 bits: checked step by step). */
static int64_t block_threads(const int64_t block[3])
{
    int64_t n = 1;
    for (int i = 0; i < 3; i++)
        if (__builtin_mul_overflow(n, block[i], &n) || n > MG_CPU_MAX_THREADS)
            return -1;
    return n;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs every block of the grid, one group of `group` blocks at a time (one
 * block, or all of a cooperative launch's); the GIL is released while blocks
 * run and taken back after a slice (MG_CPU_SLICE_NS) or when a group printed
 * or failed, to print, check for signals and raise. 0, or -1 with an error. */
static int run_grid(mg_CpuEngine *self, mg_cpu_launch *l, const int64_t grid[3], const int64_t block[3],
                    int64_t per_block, int64_t group, int64_t *indices, char *shared, size_t shared_bytes,
                    const char *source)
{
    mg_cpu_launch *outer = running; /* a launch from sys.stdout.write inside another's flush */
    int status = 0;
    int64_t b[3] = {0, 0, 0}, first = 0;
    PyThreadState *thread = PyEval_SaveThread();
    int64_t slice_end = now_ns() + MG_CPU_SLICE_NS;
    running = l;
    for (b[2] = 0; b[2] < grid[2] && status == 0; b[2]++)
        for (b[1] = 0; b[1] < grid[1] && status == 0; b[1]++)
            for (b[0] = 0; b[0] < grid[0] && status == 0; b[0]++) {
                if (group == 1) {
                    for (int64_t t = 0; t < per_block; t++)
                        memcpy(indices + (size_t)t * MG_CPU_NINDEX + 3, b, sizeof b);
                } else if (b[0] + b[1] + b[2] != 0) {
                    continue; /* the group that started at block (0, 0, 0) ran them all */
                }
                /* Fresh for each block, as far as a program can tell. */
                memset(shared, 0, shared_bytes);
                int failed = BLOCK_OK;
                if (self->uses_fibers)
                    failed = run_blocks(l, (int)group, (int)per_block);
                else
                    for (int64_t t = 0; t < per_block; t++)
                        self->function(l->arguments[t]);
                first += group;
                if (failed == BLOCK_OK && l->output_len == 0 && !l->output_failed && now_ns() < slice_end)
                    continue;
                running = outer;
                PyEval_RestoreThread(thread);
                if (failed != BLOCK_OK) {
                    flush_output(l); /* what ran before the error is printed; its own error is lost */
                    PyErr_Clear();
                    mg_group_place at = {grid, block, first - group, (int)per_block, source};
                    raise_block_error(l, &at);
                    status = -1;
                }
                else if (flush_output(l) < 0 || PyErr_CheckSignals() < 0) {
                    status = -1;
                }
                thread = PyEval_SaveThread();
                slice_end = now_ns() + MG_CPU_SLICE_NS;
                running = l;
            }
    running = outer;
    PyEval_RestoreThread(thread);
    if (status == 0 && (flush_output(l) < 0 || PyErr_CheckSignals() < 0))
        status = -1;
    return status;
}

/* launch(args, grid, block, shared_mem=0): args as the kernel's parameters
 * (C-contiguous aligned ndarrays for memrefs, writeable where the kernel may
 * store to them; bytes for scalars). */
static PyObject *CpuEngine_launch(mg_CpuEngine *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"args", "grid", "block", "shared_mem", NULL};
    PyObject *arglist, *gridobj, *blockobj;
    Py_ssize_t shared_mem = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|n:launch", kwlist, &arglist, &gridobj, &blockobj, &shared_mem))
        return NULL;
    int64_t grid[3], block[3];
    if (dim3(gridobj, "grid", grid) < 0 || dim3(blockobj, "block", block) < 0)
        return NULL;
    int64_t per_block = block_threads(block);
    if (per_block < 0)
        return mg_raise(mg_st->LaunchError, "block (%lld, %lld, %lld) has too many threads: at most %d",
                        (long long)block[0], (long long)block[1], (long long)block[2], MG_CPU_MAX_THREADS);
    if (shared_mem < 0)
        return mg_raise(mg_st->LaunchError, "shared_mem must be >= 0, not %zd", shared_mem);
    /* A cooperative launch runs every block at once: its threads are all fibers. */
    int64_t group = 1;
    if (self->cooperative) {
        int64_t fit = MG_CPU_MAX_COOPERATIVE_THREADS / per_block;
        if (__builtin_mul_overflow(grid[0], grid[1], &group) || __builtin_mul_overflow(group, grid[2], &group) ||
            group > fit)
            return mg_raise(mg_st->LaunchError,
                            "launch of kernel '%U': it calls mg.grid.sync(), so every block of its grid must run "
                            "at once, and the CPU backend runs at most %lld blocks of %lld threads at once "
                            "(%d threads in all); the grid (%lld, %lld, %lld) has more",
                            self->name, (long long)fit, (long long)per_block, MG_CPU_MAX_COOPERATIVE_THREADS,
                            (long long)grid[0], (long long)grid[1], (long long)grid[2]);
    }
    int64_t nthreads = per_block * group;
    /* Our own tuple: it keeps every array (and so its memory) alive while the blocks run without the GIL. */
    PyObject *seq = PyTuple_Check(arglist) || PyList_Check(arglist) ? PySequence_Tuple(arglist) : NULL;
    if (seq == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "args must be a tuple or list");
        return NULL;
    }
    Py_ssize_t n = self->nparams;
    if (PyTuple_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        return mg_raise(mg_st->LaunchError, "%U takes %zd arguments, got %zd", self->name, n,
                        PyTuple_GET_SIZE(seq));
    }
    const char *source = PyUnicode_AsUTF8(self->source);
    if (source == NULL) {
        Py_DECREF(seq);
        return NULL;
    }

    /* One allocation: descriptors and scalar slots (shared by all threads),
     * then per thread its packed argument array and its 12 index values. */
    size_t ndesc = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        ndesc += self->params[i].kind == PARAM_MEMREF ? 3 + 2 * (size_t)self->params[i].rank
               : self->params[i].kind == PARAM_TENSOR_MAP ? 1 + MG_CPU_TENSOR_MAP_WORDS : 2;
    size_t nargs = (size_t)n + MG_CPU_NINDEX;
    size_t bytes = ndesc * 8 + (size_t)n * sizeof(void *) + (size_t)nthreads * (nargs * sizeof(void *) +
                   MG_CPU_NINDEX * sizeof(int64_t) + sizeof(void **));
    char *memory = PyMem_Calloc(1, bytes);
    /* The block's shared memory: static arrays, then the dynamic bytes. */
    /* Each 1024-byte aligned (the 128-byte swizzle's period): TMA boxes and wgmma tiles may start there. */
    size_t static_bytes = ((size_t)self->static_shared + MG_CPU_SHARED_ALIGN - 1) / MG_CPU_SHARED_ALIGN *
                          MG_CPU_SHARED_ALIGN;
    size_t shared_stride = (static_bytes + (size_t)shared_mem + MG_CPU_SHARED_ALIGN - 1) / MG_CPU_SHARED_ALIGN *
                           MG_CPU_SHARED_ALIGN;
    size_t shared_bytes = shared_stride * (size_t)group; /* one block's each */
    char *shared = NULL;
    uint64_t *named = PyMem_Calloc((size_t)group * MG_CPU_NAMED_BARRIERS * 2, sizeof *named);
    if (memory == NULL || named == NULL ||
        posix_memalign((void **)&shared, MG_CPU_SHARED_ALIGN, shared_bytes ? shared_bytes : 1) != 0) {
        PyMem_Free(memory);
        PyMem_Free(named);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int64_t *slots = (int64_t *)memory;
    void **descriptors = (void **)(slots + ndesc); /* per param: what its packed slot points to */
    void ***per_thread = (void ***)(descriptors + n);
    void **packed = (void **)(per_thread + nthreads);
    int64_t *indices = (int64_t *)(packed + (size_t)nthreads * nargs);

    PyObject *result = NULL;
    mg_cpu_launch *launch = NULL;
    int64_t *slot = slots;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PyTuple_GET_ITEM(seq, i);
        mg_cpu_param *p = &self->params[i];
        if (p->kind == PARAM_SCALAR) {
            if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) != p->size) {
                mg_raise(mg_st->LaunchError, "argument %zd: expected %zd bytes of a scalar", i, p->size);
                goto done;
            }
            memcpy(slot, PyBytes_AS_STRING(arg), (size_t)p->size);
            descriptors[i] = slot;
            slot += 2;
            continue;
        }
        if (p->kind == PARAM_TENSOR_MAP) {
            /* The map's bytes, then the pointer the kernel takes (an !llvm.ptr) to them. */
            mg_cpu_tensor_map map;
            if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) != p->size) {
                mg_raise(mg_st->LaunchError, "argument %zd: expected the %zd bytes of a tensor map", i, p->size);
                goto done;
            }
            memcpy(&map, PyBytes_AS_STRING(arg), sizeof map);
            if (map.magic != MG_CPU_TENSOR_MAP_MAGIC) {
                mg_raise(mg_st->LaunchError, "argument %zd is a tensor map made for the GPU: on the CPU backend, "
                         "make it with mg.tensor_map of a host array", i);
                goto done;
            }
            memcpy(slot + 1, PyBytes_AS_STRING(arg), (size_t)p->size);
            slot[0] = (int64_t)(intptr_t)(slot + 1);
            descriptors[i] = slot;
            slot += 1 + MG_CPU_TENSOR_MAP_WORDS;
            continue;
        }
        if (!PyArray_Check(arg)) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected a numpy.ndarray, not %.100s", i,
                     Py_TYPE(arg)->tp_name);
            goto done;
        }
        PyArrayObject *a = (PyArrayObject *)arg;
        if (PyArray_NDIM(a) != p->rank || PyArray_ITEMSIZE(a) != p->size ||
            !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected a C-contiguous, aligned array of "
                     "rank %d and item size %zd", i, p->rank, p->size);
            goto done;
        }
        if (p->written && !PyArray_ISWRITEABLE(a)) {
            mg_raise(mg_st->LaunchError, "argument %zd is read-only, and %U stores to it", i, self->name);
            goto done;
        }
        /* {allocated, aligned, offset, sizes[rank], strides[rank]} in elements */
        slot[0] = (int64_t)(intptr_t)PyArray_DATA(a);
        slot[1] = (int64_t)(intptr_t)PyArray_DATA(a);
        slot[2] = 0;
        for (int d = 0; d < p->rank; d++) {
            slot[3 + d] = PyArray_DIM(a, d);
            slot[3 + p->rank + d] = PyArray_STRIDE(a, d) / p->size;
        }
        /* The C interface takes a pointer to the descriptor; packed, a pointer to that. */
        descriptors[i] = slot;
        slot += 3 + 2 * p->rank;
    }

    for (int64_t t = 0; t < nthreads; t++) {
        void **a = packed + (size_t)t * nargs;
        int64_t *ix = indices + (size_t)t * MG_CPU_NINDEX;
        for (Py_ssize_t i = 0; i < n; i++)
            a[i] = self->params[i].kind == PARAM_MEMREF ? (void *)&descriptors[i] : descriptors[i];
        for (int k = 0; k < MG_CPU_NINDEX; k++)
            a[n + k] = &ix[k];
        int64_t in_block = t % per_block, b = t / per_block; /* b: the block, in a cooperative launch */
        ix[0] = in_block % block[0];
        ix[1] = in_block / block[0] % block[1];
        ix[2] = in_block / (block[0] * block[1]);
        ix[3] = b % grid[0];
        ix[4] = b / grid[0] % grid[1];
        ix[5] = b / (grid[0] * grid[1]);
        for (int k = 0; k < 3; k++) {
            ix[6 + k] = block[k];
            ix[9 + k] = grid[k];
        }
        per_thread[t] = a;
    }
    launch = PyMem_Calloc(1, sizeof *launch);
    if (launch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (self->uses_fibers && (launch->pool = pool_take((size_t)nthreads)) == NULL)
        goto done;
    launch->function = self->function;
    launch->arguments = per_thread;
    launch->strings = self->texts;
    launch->nstrings = PyTuple_GET_SIZE(self->strings);
    launch->shared[0] = shared;
    launch->shared_size[0] = self->static_shared;
    launch->shared[1] = shared + static_bytes;
    launch->shared_size[1] = shared_mem;
    launch->block_threads = (int)per_block;
    launch->shared_stride = shared_stride;
    launch->shared_window = static_bytes + (size_t)shared_mem;
    launch->named = named;
    if (run_grid(self, launch, grid, block, per_block, group, indices, shared, shared_bytes, source) == 0)
        result = Py_NewRef(Py_None);
done:
    if (launch != NULL) {
        if (launch->pool != NULL)
            pool_give(launch->pool);
        free(launch->output);
        PyMem_Free(launch);
    }
    free(shared);
    PyMem_Free(named);
    PyMem_Free(memory);
    Py_DECREF(seq);
    return result;
}

static PyObject *CpuEngine_repr(mg_CpuEngine *self)
{
    return PyUnicode_FromFormat("<mlirgpu.CpuEngine %U>", self->name);
}

static PyMethodDef CpuEngine_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))CpuEngine_launch, METH_VARARGS | METH_KEYWORDS,
     "launch(args, grid, block, shared_mem=0): runs every thread of every block; memref arguments are "
     "C-contiguous ndarrays (writeable where the kernel stores), scalars their bytes. Raises KernelError on "
     "barrier or warp divergence and on a failed bounds check; printf output goes to sys.stdout between "
     "blocks. Blocks run without the GIL; Ctrl-C stops the launch between blocks."},
    {NULL},
};

static PyType_Slot CpuEngine_slots[] = {
    {Py_tp_doc, "CpuEngine(module, name, params, source, uses_fibers=True, strings=(), static_shared=0, "
                "opt_level=2, cooperative=False): the host module (lowered to the llvm dialect: an ir.Module, "
                "or its text as lower() returns it) JIT-compiled without the GIL; `name` is its "
                "func.func with llvm.emit_c_interface, `params` a (kind, rank, size[, written]) tuple per kernel "
                "parameter (written, default True: the kernel may store to that memref), `strings` the printf "
                "formats and array names its runtime calls refer to by index, `static_shared` the bytes of "
                "its static shared memory, `cooperative` whether it calls mg.grid.sync() (every block of a "
                "launch then runs at once, as fibers of one group)."},
    {Py_tp_new, CpuEngine_new},
    {Py_tp_dealloc, CpuEngine_dealloc},
    {Py_tp_repr, CpuEngine_repr},
    {Py_tp_methods, CpuEngine_methods},
    {0, NULL},
};

static PyType_Spec CpuEngine_spec = {
    .name = "mlirgpu.CpuEngine",
    .basicsize = sizeof(mg_CpuEngine),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = CpuEngine_slots,
};

int mg_cpu_init(PyObject *module)
{
    CpuEngineType = mg_add_type(module, &CpuEngine_spec, NULL);
    if (CpuEngineType == NULL)
        return -1;
    return PyModule_AddIntConstant(module, "CPU_MAX_COOPERATIVE_THREADS", MG_CPU_MAX_COOPERATIVE_THREADS);
}
