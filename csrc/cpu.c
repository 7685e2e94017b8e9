/* The CPU backend's runtime (see cpu.h and docs/cpu.md).
 *
 * A launch runs the grid's blocks one after another. Within a block every
 * thread is a fiber with its own stack; the scheduler (the launching thread's
 * own context) resumes each fiber in turn until it returns or reaches
 * mg_cpu_barrier, which switches back. When a sweep over the block leaves
 * every fiber at a barrier, all are released; when some have returned while
 * others wait, that is barrier divergence and the launch stops with
 * mlirgpu.KernelError. Fibers never unwind: an abandoned fiber's stack is
 * simply reused by the next block or launch. The GIL is held throughout, so
 * the scheduler's state can be process-wide.
 *
 * The other runtime calls of the host trace: mg_cpu_shared (the block's
 * shared memory), mg_cpu_shuffle (a warp-level barrier that exchanges one
 * value per lane), mg_cpu_warp_put / mg_cpu_warp_collective / mg_cpu_warp_get
 * (the tensor-core collectives mma.sync and ldmatrix, at the same warp-level
 * barrier), mg_cpu_printf_arg / mg_cpu_printf (formatted into a buffer
 * that goes to sys.stdout between blocks), mg_cpu_bounds_index /
 * mg_cpu_out_of_bounds (a failed bounds check: recorded, and the fiber never
 * resumes). */
#include "cpu.h"
#include "ir.h"

#include <mlir-c/ExecutionEngine.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "numpy_api.h"

extern _Thread_local jmp_buf *mg_fatal_target; /* ir.c: LLVM fatal errors longjmp there */

#define MG_CPU_STACK (64 * 1024)
#define MG_CPU_MAX_THREADS 1024 /* threads per block, as on the GPU */
#define MG_CPU_NINDEX 12        /* thread, block, block_dim, grid_dim: x, y, z each */
#define MG_CPU_WARP 32
#define MG_CPU_MAX_ARGS 32      /* printf values, bounds-check indices */
#define MG_CPU_ALIGN 64         /* of each shared memory region */
#define MG_CPU_WARP_DATA 16     /* 64-bit words a lane gives a warp collective */

/* ------------------------------------------------------------------------ */
/* Fibers and the scheduler                                                  */

typedef void (*mg_packed_fn)(void **);

enum { FIBER_READY, FIBER_AT_BARRIER, FIBER_AT_SHUFFLE, FIBER_DONE, FIBER_FAILED };

typedef struct {
    ucontext_t context;
    int state;
    int32_t line;     /* the barrier or shuffle it waits at */
    int32_t mode;     /* shuffle: MG_SHFL_* */
    int32_t offset;   /* shuffle: lane mask, delta or source lane */
    int64_t value;    /* shuffle: its value going in, then the one it reads */
    int ndata;        /* collective: words given so far */
    int64_t data[MG_CPU_WARP_DATA]; /* collective: its operands, then its results */
} mg_fiber;

enum { MG_SHFL_XOR, MG_SHFL_DOWN, MG_SHFL_UP, MG_SHFL_IDX };
/* Warp collectives (mode >= MG_WARP_MMA_F16): mma.sync m16n8k16 f16/bf16 and
 * m16n8k8 tf32; ldmatrix is MG_WARP_LDMATRIX | count (1, 2, 4) | 8 if .trans. */
enum { MG_WARP_MMA_F16 = 16, MG_WARP_MMA_BF16 = 17, MG_WARP_MMA_TF32 = 18, MG_WARP_LDMATRIX = 32 };

/* What mg_cpu_out_of_bounds records for the scheduler to raise. */
typedef struct {
    int failed;
    int thread;
    int32_t name, kind, line;
    int rank;
    int64_t index[MG_CPU_MAX_ARGS], size[MG_CPU_MAX_ARGS];
} mg_bounds_error;

static struct {
    ucontext_t scheduler;
    mg_fiber *fibers;
    char *stacks;      /* one mapping: per fiber a guard page, then its stack */
    size_t capacity;   /* fibers (and stacks) allocated */
    size_t page;
    int current;
    int nthreads;      /* of the block running */
    mg_packed_fn function;
    void ***arguments; /* per thread: the packed argument array */
    const char *const *strings; /* the engine's: printf formats, array names */
    Py_ssize_t nstrings;
    char *shared[2];   /* the block's static and dynamic shared memory */
    int64_t shared_size[2];
    int nargs;         /* printf values or bounds-check indices pending */
    int64_t args[MG_CPU_MAX_ARGS], sizes[MG_CPU_MAX_ARGS];
    char *output;      /* printf output not yet written to sys.stdout */
    size_t output_len, output_cap;
    int output_failed; /* out of memory while formatting: raised after the block */
    mg_bounds_error bounds;
} sched;

static size_t stack_stride(void) { return sched.page + MG_CPU_STACK; }
static void thread_xyz(int t, const int64_t *bdim, long long xyz[3]);

/* Grows the fiber pool to `n` (kept across launches: stacks are reused). */
static int reserve_fibers(size_t n)
{
    if (n <= sched.capacity)
        return 0;
    if (sched.page == 0)
        sched.page = (size_t)sysconf(_SC_PAGESIZE);
    mg_fiber *fibers = PyMem_Calloc(n, sizeof *fibers);
    if (fibers == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char *stacks = mmap(NULL, n * stack_stride(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stacks == MAP_FAILED) {
        PyMem_Free(fibers);
        PyErr_SetFromErrno(PyExc_MemoryError);
        return -1;
    }
    /* A guard page under each stack: an overflow faults instead of corrupting its neighbour. */
    for (size_t i = 0; i < n; i++)
        mprotect(stacks + i * stack_stride(), sched.page, PROT_NONE);
    if (sched.stacks != NULL)
        munmap(sched.stacks, sched.capacity * stack_stride());
    PyMem_Free(sched.fibers);
    sched.fibers = fibers;
    sched.stacks = stacks;
    sched.capacity = n;
    return 0;
}

static void fiber_main(void)
{
    int t = sched.current;
    sched.function(sched.arguments[t]);
    sched.fibers[t].state = FIBER_DONE;
    /* Returning resumes uc_link: the scheduler. */
}

void mg_cpu_barrier(int32_t line)
{
    mg_fiber *f = &sched.fibers[sched.current];
    f->state = FIBER_AT_BARRIER;
    f->line = line;
    swapcontext(&f->context, &sched.scheduler);
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
    which = which != 0;
    *result = (mg_memref_1d){sched.shared[which], sched.shared[which], 0, sched.shared_size[which], 1};
}

/* ------------------------------------------------------------------------ */
/* Warp shuffles                                                             */

/* A warp-level barrier: deposits `value`, waits until every thread of its
 * warp that has not returned is at a shuffle, and returns the value of the
 * lane chosen by `mode` and `offset` (its own where that lane is out of range
 * or not there, as gpu.shuffle gives). */
int64_t mg_cpu_shuffle(int32_t mode, int64_t value, int32_t offset, int32_t line)
{
    mg_fiber *f = &sched.fibers[sched.current];
    f->state = FIBER_AT_SHUFFLE;
    f->mode = mode;
    f->value = value;
    f->offset = offset;
    f->line = line;
    swapcontext(&f->context, &sched.scheduler);
    return f->value;
}

/* Completes the shuffle of the warp starting at thread `first`. */
static void exchange(int first, int end)
{
    int64_t in[MG_CPU_WARP];
    int active[MG_CPU_WARP];
    for (int t = first; t < end; t++) {
        in[t - first] = sched.fibers[t].value;
        active[t - first] = sched.fibers[t].state == FIBER_AT_SHUFFLE;
    }
    for (int t = first; t < end; t++) {
        mg_fiber *f = &sched.fibers[t];
        if (f->state != FIBER_AT_SHUFFLE)
            continue;
        int lane = t - first, b = f->offset & (MG_CPU_WARP - 1), source;
        switch (f->mode) {
        case MG_SHFL_XOR: source = lane ^ b; break;
        case MG_SHFL_DOWN: source = lane + b; break;
        case MG_SHFL_UP: source = lane - b; break;
        default: source = b; break;
        }
        if (source >= 0 && source < end - first && active[source])
            f->value = in[source];
        f->state = FIBER_READY;
    }
}

/* ------------------------------------------------------------------------ */
/* Tensor-core collectives                                                   */

/* The lane's operands go in one 64-bit word at a time, then it waits at the
 * collective `mode` (a warp-level barrier like a shuffle's), then reads its
 * results back word by word. */
void mg_cpu_warp_put(int64_t bits)
{
    mg_fiber *f = &sched.fibers[sched.current];
    if (f->ndata < MG_CPU_WARP_DATA)
        f->data[f->ndata++] = bits;
}

void mg_cpu_warp_collective(int32_t mode, int32_t line)
{
    mg_fiber *f = &sched.fibers[sched.current];
    f->state = FIBER_AT_SHUFFLE;
    f->mode = mode;
    f->line = line;
    swapcontext(&f->context, &sched.scheduler);
    f->ndata = 0;
}

int64_t mg_cpu_warp_get(int32_t k)
{
    return k >= 0 && k < MG_CPU_WARP_DATA ? sched.fibers[sched.current].data[k] : 0;
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

/* Completes the collective of the warp starting at thread `first`; -1 with
 * KernelError when not all 32 lanes are at the same collective. */
static int collective(int first, int end, const int64_t *block, const int64_t *bdim, const char *source)
{
    mg_fiber *lanes = &sched.fibers[first];
    int mode = -1, at = 0;
    for (int t = first; t < end && mode < 0; t++)
        if (lanes[t - first].state == FIBER_AT_SHUFFLE && lanes[t - first].mode >= MG_WARP_MMA_F16) {
            mode = lanes[t - first].mode;
            at = t;
        }
    for (int lane = 0; lane < MG_CPU_WARP; lane++) {
        if (first + lane >= end || lanes[lane].state != FIBER_AT_SHUFFLE || lanes[lane].mode != mode) {
            long long w[3];
            int32_t line = sched.fibers[at].line;
            thread_xyz(at, bdim, w);
            mg_raise(mg_st->KernelError,
                     "warp divergence at %s:%d: thread (%lld, %lld, %lld) of block (%lld, %lld, %lld) runs a "
                     "warp-wide tensor-core operation (mma.sync, ldmatrix) on line %d, which needs all 32 lanes "
                     "of its warp, but lane %d %s",
                     source, (int)line, w[0], w[1], w[2], (long long)block[0], (long long)block[1],
                     (long long)block[2], (int)line, lane,
                     first + lane >= end ? "does not exist (the block is not a whole number of warps)"
                     : lanes[lane].state == FIBER_AT_SHUFFLE ? "is at another warp operation"
                                                             : "has returned");
            return -1;
        }
    }
    if (mode >= MG_WARP_LDMATRIX)
        ldmatrix(lanes, mode & 7, (mode & 8) != 0);
    else
        mma(lanes, mode);
    for (int lane = 0; lane < MG_CPU_WARP; lane++)
        lanes[lane].state = FIBER_READY;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* printf                                                                    */

void mg_cpu_printf_arg(int64_t bits)
{
    if (sched.nargs < MG_CPU_MAX_ARGS)
        sched.args[sched.nargs++] = bits;
}

static void append_output(const char *text, size_t len)
{
    if (sched.output_len + len + 1 > sched.output_cap) {
        size_t cap = sched.output_cap ? sched.output_cap : 4096;
        while (cap < sched.output_len + len + 1)
            cap *= 2;
        char *grown = PyMem_Realloc(sched.output, cap);
        if (grown == NULL) {
            sched.output_failed = 1;
            return;
        }
        sched.output = grown;
        sched.output_cap = cap;
    }
    memcpy(sched.output + sched.output_len, text, len);
    sched.output_len += len;
}

/* Formats strings[format] with the values mg_cpu_printf_arg gave, as C's
 * printf would (the trace promoted them: ints to 32 or 64 bits, floats to
 * double), one conversion at a time. */
void mg_cpu_printf(int32_t format)
{
    int nargs = sched.nargs, next = 0;
    sched.nargs = 0;
    if (format < 0 || format >= sched.nstrings)
        return;
    const char *p = sched.strings[format];
    char spec[64], text[512];
    while (*p) {
        const char *percent = strchr(p, '%');
        if (percent == NULL) {
            append_output(p, strlen(p));
            break;
        }
        append_output(p, (size_t)(percent - p));
        if (percent[1] == '%') {
            append_output("%", 1);
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
        int64_t bits = next < nargs ? sched.args[next] : 0;
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
            append_output(text, (size_t)len < sizeof text ? (size_t)len : sizeof text - 1);
        p = q + 1;
    }
}

/* Writes the pending printf output to sys.stdout (from the scheduler: Python
 * does not run on a fiber's small stack); -1 with an exception set. */
static int flush_output(void)
{
    if (sched.output_failed) {
        sched.output_failed = 0;
        sched.output_len = 0;
        PyErr_NoMemory();
        return -1;
    }
    if (sched.output_len == 0)
        return 0;
    PyObject *text = PyUnicode_DecodeUTF8(sched.output, (Py_ssize_t)sched.output_len, "replace");
    sched.output_len = 0;
    if (text == NULL)
        return -1;
    PyObject *out = PySys_GetObject("stdout"); /* borrowed */
    PyObject *r = NULL;
    if (out != NULL && out != Py_None)
        r = PyObject_CallMethod(out, "write", "O", text);
    else
        r = Py_NewRef(Py_None);
    Py_DECREF(text);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Bounds checks (MLIRGPU_CHECK=bounds)                                      */

void mg_cpu_bounds_index(int64_t index, int64_t size)
{
    if (sched.nargs < MG_CPU_MAX_ARGS) {
        sched.args[sched.nargs] = index;
        sched.sizes[sched.nargs++] = size;
    }
}

/* An access failed its check: recorded for the scheduler, which raises
 * KernelError; this fiber is abandoned, never resumed. */
void mg_cpu_out_of_bounds(int32_t name, int32_t kind, int32_t line)
{
    mg_bounds_error *e = &sched.bounds;
    e->failed = 1;
    e->thread = sched.current;
    e->name = name;
    e->kind = kind;
    e->line = line;
    e->rank = sched.nargs;
    memcpy(e->index, sched.args, sizeof e->index);
    memcpy(e->size, sched.sizes, sizeof e->size);
    sched.nargs = 0;
    mg_fiber *f = &sched.fibers[sched.current];
    f->state = FIBER_FAILED;
    swapcontext(&f->context, &sched.scheduler);
}

static void thread_xyz(int t, const int64_t *bdim, long long xyz[3])
{
    xyz[0] = t % bdim[0];
    xyz[1] = t / bdim[0] % bdim[1];
    xyz[2] = t / (bdim[0] * bdim[1]);
}

static const char *string_at(int32_t i)
{
    return i >= 0 && i < sched.nstrings ? sched.strings[i] : "?";
}

static void tuple_text(char *out, size_t cap, const int64_t *v, int n)
{
    size_t at = (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, i ? ", %lld" : "%lld", (long long)v[i]);
    if (at < cap)
        snprintf(out + at, cap - at, n == 1 ? ",)" : ")");
}

static void raise_bounds(const int64_t *block, const int64_t *bdim, const char *source)
{
    static const char *kinds[] = {"load from", "store to", "atomic update of", "vector load from",
                                  "vector store to"};
    mg_bounds_error *e = &sched.bounds;
    char index[512], shape[512];
    long long t[3];
    tuple_text(index, sizeof index, e->index, e->rank);
    tuple_text(shape, sizeof shape, e->size, e->rank);
    thread_xyz(e->thread, bdim, t);
    mg_raise(mg_st->KernelError, "out-of-bounds %s '%s' at index %s [shape %s] by thread (%lld, %lld, %lld) "
             "of block (%lld, %lld, %lld) at %s:%d", kinds[e->kind >= 0 && e->kind < 5 ? e->kind : 0],
             string_at(e->name), index, shape, t[0], t[1], t[2], (long long)block[0], (long long)block[1],
             (long long)block[2], source, (int)e->line);
    e->failed = 0;
}

/* ------------------------------------------------------------------------ */
/* Running a block                                                           */

/* Runs one block of `n` threads as fibers; -1 with KernelError on barrier or
 * warp divergence or a failed bounds check. */
static int run_block(int n, const int64_t *block, const int64_t *bdim, const char *source)
{
    sched.nthreads = n;
    for (int t = 0; t < n; t++) {
        mg_fiber *f = &sched.fibers[t];
        getcontext(&f->context);
        f->context.uc_stack.ss_sp = sched.stacks + (size_t)t * stack_stride() + sched.page;
        f->context.uc_stack.ss_size = MG_CPU_STACK;
        f->context.uc_link = &sched.scheduler;
        makecontext(&f->context, fiber_main, 0);
        f->state = FIBER_READY;
        f->ndata = 0; /* a fiber abandoned mid-collective may have left words behind */
    }
    for (;;) {
        for (int t = 0; t < n; t++) {
            if (sched.fibers[t].state != FIBER_READY)
                continue;
            sched.current = t;
            swapcontext(&sched.scheduler, &sched.fibers[t].context);
            if (sched.bounds.failed) {
                raise_bounds(block, bdim, source);
                return -1;
            }
        }
        /* Every fiber has returned or waits. A warp whose remaining threads
         * all wait at a shuffle completes it; they run on before any barrier. */
        int progress = 0;
        for (int first = 0; first < n; first += MG_CPU_WARP) {
            int end = first + MG_CPU_WARP < n ? first + MG_CPU_WARP : n, shuffling = 0, other = 0;
            for (int t = first; t < end; t++) {
                shuffling += sched.fibers[t].state == FIBER_AT_SHUFFLE;
                other += sched.fibers[t].state == FIBER_AT_BARRIER;
            }
            if (shuffling && !other) {
                /* A lane at a tensor-core collective makes it one (which fails
                 * unless all 32 lanes are at the same). */
                int tensor_core = 0;
                for (int t = first; t < end; t++)
                    tensor_core |= sched.fibers[t].state == FIBER_AT_SHUFFLE && sched.fibers[t].mode >= MG_WARP_MMA_F16;
                if (tensor_core) {
                    if (collective(first, end, block, bdim, source) < 0)
                        return -1;
                } else {
                    exchange(first, end);
                }
                progress = 1;
            }
        }
        if (progress)
            continue;
        int waiting = -1, done = -1, shuffling = -1;
        for (int t = 0; t < n; t++) {
            int state = sched.fibers[t].state;
            if (state == FIBER_AT_BARRIER) {
                if (waiting < 0)
                    waiting = t;
            } else if (state == FIBER_AT_SHUFFLE) {
                if (shuffling < 0)
                    shuffling = t;
            } else if (done < 0) {
                done = t;
            }
        }
        if (waiting < 0 && shuffling < 0)
            return 0;
        long long w[3], d[3];
        if (shuffling >= 0) {
            /* Its warp has a thread at a barrier: neither can go on. */
            int first = shuffling / MG_CPU_WARP * MG_CPU_WARP, other = first;
            while (sched.fibers[other].state != FIBER_AT_BARRIER)
                other++;
            thread_xyz(shuffling, bdim, w);
            thread_xyz(other, bdim, d);
            mg_raise(mg_st->KernelError,
                     "warp divergence at %s:%d: thread (%lld, %lld, %lld) of block (%lld, %lld, %lld) waits at "
                     "a warp shuffle on line %d, but thread (%lld, %lld, %lld) of its warp waits at "
                     "mg.syncthreads() on line %d",
                     source, (int)sched.fibers[shuffling].line, w[0], w[1], w[2], (long long)block[0],
                     (long long)block[1], (long long)block[2], (int)sched.fibers[shuffling].line, d[0], d[1],
                     d[2], (int)sched.fibers[other].line);
            return -1;
        }
        if (done >= 0) {
            thread_xyz(waiting, bdim, w);
            thread_xyz(done, bdim, d);
            mg_raise(mg_st->KernelError,
                     "barrier divergence at %s:%d: thread (%lld, %lld, %lld) of block (%lld, %lld, %lld) "
                     "waits at mg.syncthreads() on line %d, but thread (%lld, %lld, %lld) returned "
                     "without reaching it",
                     source, (int)sched.fibers[waiting].line, w[0], w[1], w[2],
                     (long long)block[0], (long long)block[1], (long long)block[2],
                     (int)sched.fibers[waiting].line, d[0], d[1], d[2]);
            return -1;
        }
        for (int t = 0; t < n; t++)
            sched.fibers[t].state = FIBER_READY;
    }
}

/* ------------------------------------------------------------------------ */
/* CpuEngine                                                                 */

enum { PARAM_MEMREF, PARAM_SCALAR };

typedef struct {
    int kind;
    int rank;        /* memref */
    Py_ssize_t size; /* memref: element size; scalar: bytes */
} mg_cpu_param;

typedef struct {
    PyObject_HEAD
    MlirExecutionEngine engine;
    mg_packed_fn function;
    mg_cpu_param *params;
    Py_ssize_t nparams;
    int uses_fibers;
    Py_ssize_t static_shared; /* bytes of the kernel's mg.shared.array arrays */
    PyObject *name;    /* str */
    PyObject *source;  /* str: the kernel's file, for errors */
    PyObject *strings; /* tuple of str: printf formats and array names, by index */
    const char **texts; /* their UTF-8, owned by `strings` */
} mg_CpuEngine;

static PyTypeObject *CpuEngineType;

static int parse_params(mg_CpuEngine *self, PyObject *params)
{
    PyObject *seq = PySequence_Fast(params, "params must be a sequence of (kind, rank, size) tuples");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->params = PyMem_Calloc(n ? (size_t)n : 1, sizeof *self->params);
    if (self->params == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *kind;
        int rank;
        Py_ssize_t size;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sin:param", &kind, &rank, &size)) {
            Py_DECREF(seq);
            return -1;
        }
        mg_cpu_param *p = &self->params[i];
        if (strcmp(kind, "memref") == 0 && rank >= 0 && rank <= 8 && size > 0)
            *p = (mg_cpu_param){PARAM_MEMREF, rank, size};
        else if (strcmp(kind, "scalar") == 0 && size > 0 && size <= 16)
            *p = (mg_cpu_param){PARAM_SCALAR, 0, size};
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

typedef struct {
    MlirModule module;
    int opt_level;
    MlirExecutionEngine engine;
} engine_creation;

static void create_engine(void *arg)
{
    engine_creation *c = arg;
    /* Position-independent code: with the small code model a JIT'd call or
     * data reference reaches +-2 GB only, and a process holding a CUDA
     * context has reserved so much address space that the JIT's memory can
     * land farther than that from libc and from our runtime functions. */
    c->engine = mlirExecutionEngineCreate(c->module, c->opt_level, 0, NULL, false, true);
}

/* mlirExecutionEngineCreate; 1 if LLVM hit a fatal error inside. */
static int create_guarded(MlirModule module, int opt_level, MlirExecutionEngine *engine)
{
    engine_creation c = {module, opt_level, {NULL}};
    int fatal = mg_fatal_guarded(create_engine, &c);
    *engine = c.engine;
    return fatal;
}

static PyObject *CpuEngine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"module", "name", "params", "source", "uses_fibers", "strings", "static_shared",
                             "opt_level", NULL};
    PyObject *module, *name, *params, *source, *strings = NULL;
    int uses_fibers = 1, opt_level = 2;
    Py_ssize_t static_shared = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUOU|pOni:CpuEngine", kwlist, &module, &name, &params, &source,
                                     &uses_fibers, &strings, &static_shared, &opt_level))
        return NULL;
    if (opt_level < 0 || opt_level > 3)
        return PyErr_Format(PyExc_ValueError, "opt_level must be 0..3, not %d", opt_level);
    if (static_shared < 0)
        return PyErr_Format(PyExc_ValueError, "static_shared must be >= 0, not %zd", static_shared);
    mg_ir_Operation *op = mg_ir_module_operation(module);
    if (op == NULL)
        return NULL;
    mg_CpuEngine *self = (mg_CpuEngine *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->source = Py_NewRef(source);
    self->uses_fibers = uses_fibers;
    self->static_shared = static_shared;
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

    mg_ir_Context *ctx = op->context;
    mg_ir_diag_clear(ctx);
    if (!mlirOperationVerify(op->op) || mg_ir_diag_has_error(ctx)) {
        mg_ir_diag_raise(ctx, mg_st->MLIRError, "the host module does not verify");
        goto error;
    }
    MlirModule m = mlirModuleFromOperation(op->op);
    if (create_guarded(m, opt_level, &self->engine)) {
        self->engine.ptr = NULL; /* half-built by LLVM: leaked, never touched */
        mg_raise(mg_st->CompileError, "LLVM failed while JIT-compiling %U for the host", name);
        goto error;
    }
    if (mlirExecutionEngineIsNull(self->engine)) {
        if (mg_ir_diag_has_error(ctx))
            mg_ir_diag_raise(ctx, mg_st->CompileError, "JIT-compiling the host module failed");
        else
            mg_raise(mg_st->CompileError, "JIT-compiling %U for the host failed (is it lowered to the llvm "
                                          "dialect?)", name);
        goto error;
    }
    static const struct {
        const char *name;
        void *address;
    } runtime[] = {
        {"mg_cpu_barrier", (void *)mg_cpu_barrier},
        {"_mlir_ciface_mg_cpu_shared", (void *)_mlir_ciface_mg_cpu_shared},
        {"mg_cpu_shuffle", (void *)mg_cpu_shuffle},
        {"mg_cpu_warp_put", (void *)mg_cpu_warp_put},
        {"mg_cpu_warp_collective", (void *)mg_cpu_warp_collective},
        {"mg_cpu_warp_get", (void *)mg_cpu_warp_get},
        {"mg_cpu_printf_arg", (void *)mg_cpu_printf_arg},
        {"mg_cpu_printf", (void *)mg_cpu_printf},
        {"mg_cpu_bounds_index", (void *)mg_cpu_bounds_index},
        {"mg_cpu_out_of_bounds", (void *)mg_cpu_out_of_bounds},
    };
    for (size_t i = 0; i < sizeof runtime / sizeof *runtime; i++)
        mlirExecutionEngineRegisterSymbol(self->engine, mlirStringRefCreateFromCString(runtime[i].name),
                                          runtime[i].address);
    mlirExecutionEngineInitialize(self->engine);
    PyObject *packed = PyUnicode_FromFormat("_mlir_ciface_%U", name);
    if (packed == NULL)
        goto error;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(packed, &len);
    if (text != NULL)
        self->function = (mg_packed_fn)mlirExecutionEngineLookupPacked(self->engine,
                                                                      mlirStringRefCreate(text, (size_t)len));
    Py_DECREF(packed);
    if (text == NULL)
        goto error;
    if (self->function == NULL) {
        mg_raise(mg_st->CompileError, "the host module has no function %U with llvm.emit_c_interface", name);
        goto error;
    }
    return (PyObject *)self;
error:
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

/* A (x, y, z) of positive ints, or an int (y = z = 1). */
static int dim3(PyObject *obj, const char *what, int64_t out[3])
{
    out[0] = out[1] = out[2] = 1;
    if (PyLong_Check(obj)) {
        out[0] = PyLong_AsLongLong(obj);
    } else {
        PyObject *seq = PySequence_Fast(obj, "");
        if (seq == NULL || PySequence_Fast_GET_SIZE(seq) < 1 || PySequence_Fast_GET_SIZE(seq) > 3) {
            Py_XDECREF(seq);
            PyErr_Clear();
            mg_raise(mg_st->LaunchError, "%s must be an int or a tuple of 1 to 3 ints", what);
            return -1;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (out[i] == -1 && PyErr_Occurred())
                break;
        }
        Py_DECREF(seq);
    }
    if (PyErr_Occurred()) {
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

/* launch(args, grid, block, shared_mem=0): args as the kernel's parameters
 * (C-contiguous aligned writeable ndarrays for memrefs, bytes for scalars). */
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
    int64_t nthreads = block[0] * block[1] * block[2];
    if (nthreads > MG_CPU_MAX_THREADS)
        return mg_raise(mg_st->LaunchError, "block has %lld threads; at most %d", (long long)nthreads,
                        MG_CPU_MAX_THREADS);
    if (shared_mem < 0)
        return mg_raise(mg_st->LaunchError, "shared_mem must be >= 0, not %zd", shared_mem);
    PyObject *seq = PySequence_Fast(arglist, "args must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = self->nparams;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        return mg_raise(mg_st->LaunchError, "%U takes %zd arguments, got %zd", self->name, n,
                        PySequence_Fast_GET_SIZE(seq));
    }

    /* One allocation: descriptors and scalar slots (shared by all threads),
     * then per thread its packed argument array and its 12 index values. */
    size_t ndesc = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        ndesc += self->params[i].kind == PARAM_MEMREF ? 3 + 2 * (size_t)self->params[i].rank : 2;
    size_t nargs = (size_t)n + MG_CPU_NINDEX;
    size_t bytes = ndesc * 8 + (size_t)n * sizeof(void *) + (size_t)nthreads * (nargs * sizeof(void *) +
                   MG_CPU_NINDEX * sizeof(int64_t) + sizeof(void **));
    char *memory = PyMem_Calloc(1, bytes);
    /* The block's shared memory: static arrays, then the dynamic bytes. */
    size_t static_bytes = ((size_t)self->static_shared + MG_CPU_ALIGN - 1) / MG_CPU_ALIGN * MG_CPU_ALIGN;
    size_t shared_bytes = static_bytes + (size_t)shared_mem;
    char *shared = NULL;
    if (memory == NULL || posix_memalign((void **)&shared, MG_CPU_ALIGN, shared_bytes ? shared_bytes : 1) != 0) {
        PyMem_Free(memory);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int64_t *slots = (int64_t *)memory;
    void **descriptors = (void **)(slots + ndesc); /* per param: what its packed slot points to */
    void ***per_thread = (void ***)(descriptors + n);
    void **packed = (void **)(per_thread + nthreads);
    int64_t *indices = (int64_t *)(packed + (size_t)nthreads * nargs);

    PyObject *result = NULL;
    int64_t *slot = slots;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PySequence_Fast_GET_ITEM(seq, i);
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
        if (!PyArray_Check(arg)) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected a numpy.ndarray, not %.100s", i,
                     Py_TYPE(arg)->tp_name);
            goto done;
        }
        PyArrayObject *a = (PyArrayObject *)arg;
        if (PyArray_NDIM(a) != p->rank || PyArray_ITEMSIZE(a) != p->size ||
            !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || !PyArray_ISWRITEABLE(a)) {
            mg_raise(mg_st->LaunchError, "argument %zd: expected a C-contiguous, aligned, writeable array of "
                     "rank %d and item size %zd", i, p->rank, p->size);
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
        ix[0] = t % block[0];
        ix[1] = t / block[0] % block[1];
        ix[2] = t / (block[0] * block[1]);
        for (int k = 0; k < 3; k++) {
            ix[6 + k] = block[k];
            ix[9 + k] = grid[k];
        }
        per_thread[t] = a;
    }
    if (self->uses_fibers && reserve_fibers((size_t)nthreads) < 0)
        goto done;

    sched.function = self->function;
    sched.arguments = per_thread;
    sched.strings = self->texts;
    sched.nstrings = PyTuple_GET_SIZE(self->strings);
    sched.shared[0] = shared;
    sched.shared_size[0] = self->static_shared;
    sched.shared[1] = shared + static_bytes;
    sched.shared_size[1] = shared_mem;
    sched.nargs = 0;
    sched.output_len = 0;
    const char *source = PyUnicode_AsUTF8(self->source);
    if (source == NULL)
        goto done;
    for (int64_t bz = 0; bz < grid[2]; bz++)
        for (int64_t by = 0; by < grid[1]; by++)
            for (int64_t bx = 0; bx < grid[0]; bx++) {
                int64_t b[3] = {bx, by, bz};
                for (int64_t t = 0; t < nthreads; t++)
                    memcpy(indices + (size_t)t * MG_CPU_NINDEX + 3, b, sizeof b);
                /* Fresh for each block, as far as a program can tell. */
                memset(shared, 0, shared_bytes);
                if (self->uses_fibers) {
                    if (run_block((int)nthreads, b, block, source) < 0) {
                        PyObject *type, *value, *traceback;
                        PyErr_Fetch(&type, &value, &traceback);
                        flush_output(); /* what ran before the error is printed; its own error is lost */
                        PyErr_Clear();
                        PyErr_Restore(type, value, traceback);
                        goto done;
                    }
                } else {
                    for (int64_t t = 0; t < nthreads; t++)
                        self->function(per_thread[t]);
                }
                if (flush_output() < 0)
                    goto done;
            }
    result = Py_NewRef(Py_None);
done:
    sched.function = NULL;
    sched.arguments = NULL;
    sched.strings = NULL;
    sched.nstrings = 0;
    sched.shared[0] = sched.shared[1] = NULL;
    sched.output_len = 0;
    free(shared);
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
     "C-contiguous ndarrays, scalars their bytes. Raises KernelError on barrier or warp divergence and on a "
     "failed bounds check; printf output goes to sys.stdout after each block."},
    {NULL},
};

static PyType_Slot CpuEngine_slots[] = {
    {Py_tp_doc, "CpuEngine(module, name, params, source, uses_fibers=True, strings=(), static_shared=0, "
                "opt_level=2): the host module (lowered to the llvm dialect) JIT-compiled; `name` is its "
                "func.func with llvm.emit_c_interface, `params` a (kind, rank, size) tuple per kernel "
                "parameter, `strings` the printf formats and array names its runtime calls refer to by index, "
                "`static_shared` the bytes of its static shared memory."},
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
    return CpuEngineType == NULL ? -1 : 0;
}
