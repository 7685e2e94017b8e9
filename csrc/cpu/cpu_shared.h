/* What the files of the CPU backend share with each other (fibers.c,
 * collectives.c, checks.c, blocks.c, cpu.c), hidden from the world by
 * -fvisibility=hidden. */
#ifndef MG_CPU_SHARED_H
#define MG_CPU_SHARED_H

#include "cpu/cpu.h"
#include <setjmp.h>
#include <ucontext.h>

#define MG_CPU_STACK (64 * 1024)

#define MG_CPU_MAX_THREADS 1024 /* threads per block, as on the GPU */

#define MG_CPU_NINDEX 12        /* thread, block, block_dim, grid_dim: x, y, z each */

#define MG_CPU_WARP 32

#define MG_CPU_MAX_ARGS 32      /* printf values, bounds-check indices */

#define MG_CPU_SHARED_ALIGN 1024 /* of each block's shared memory: the 128-byte swizzle's period */

#define MG_CPU_NAMED_BARRIERS 16 /* bar.sync ids of a block (0 is syncthreads) */

#define MG_CPU_WARPGROUP 128

#define MG_CPU_WGMMA_MAX 128    /* f32 accumulators of a thread in one wgmma (m64n256) */
#define MG_CPU_WGMMA_A_WORDS 16 /* A from registers: the 4 words of each lane of the thread's quad */

#define MG_CPU_WARP_DATA 16     /* 64-bit words a lane gives a warp collective */

#define MG_CPU_SLICE_NS 10000000 /* blocks run this long without the GIL before signals are checked */

/* Threads of a cooperative launch, all live at once (each a fiber with its stack). */
#define MG_CPU_MAX_COOPERATIVE_THREADS 8192

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
    float wgmma[MG_CPU_WGMMA_MAX + MG_CPU_WGMMA_A_WORDS]; /* wgmma: the thread's accumulators, in and
                                                             out, then A's words (their bits) */
    uint32_t warp_syncs; /* collectives its warp completed in this group of blocks (races.c) */
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
       BLOCK_MIXED_BARRIERS, BLOCK_GRID_DIVERGENCE, BLOCK_FAULT, BLOCK_WAIT_FOREVER, BLOCK_INTERRUPTED,
       BLOCK_RACE, BLOCK_UNINITIALIZED };

/* What the race and uninitialized-read checks know of one byte of shared
 * memory (races.c): the synchronization epoch and thread of its last write,
 * and of up to two threads that read it in the current epoch, each with the
 * count of its warp's collectives then (which order the lanes of that warp). */
#define MG_CPU_NO_THREAD 0xffffffffu
typedef struct {
    uint32_t write_epoch, read_epoch;
    uint32_t writer, reader, reader2;
    uint32_t write_syncs, read_syncs, read_syncs2;
    int32_t write_line, read_line, read_line2;
} mg_shadow;

/* A slot of the table of global memory (races.c): an element a block of the
 * group touched in the current epoch, by its address. */
typedef struct {
    uint64_t address;
    uint32_t block;
    mg_shadow shadow;
} mg_global_slot;

/* The bytes [start, end) of an array a launch may store to. */
typedef struct {
    uint64_t start, end;
} mg_written_array;

/* A race (two threads, one access each) or a read of bytes never written (`other` unused). */
typedef struct {
    int thread, other;
    int32_t line, other_line;
    int writes, other_writes; /* whether each access was a write */
    int32_t array;            /* global memory: the array's name in the string table; shared memory: -1 */
    size_t offset;            /* shared: the byte in the block's shared memory; global: the array's element */
    uint64_t address;         /* shared: the shared address, as mg.shared.address gives it; global: the host's */
} mg_race;

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
    int group_threads;       /* fibers of the group of blocks running now */
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
    mg_shadow *shadow;       /* per byte of shared_total where the kernel checks its accesses (races.c), else NULL */
    size_t shared_total;     /* bytes of the group's shared memory, every block's */
    uint32_t epoch;          /* bumped at each synchronization of a thread with others */
    uint32_t block_epoch;    /* the epoch the running group of blocks started in */
    mg_global_slot *global;  /* where the kernel checks its global accesses (races.c), else NULL */
    size_t global_mask;      /* its slots - 1 (a power of two) */
    size_t global_used;      /* its slots in use in global_epoch */
    uint32_t global_epoch;
    mg_written_array *written; /* the arrays the kernel may store to: a read elsewhere cannot race */
    int nwritten;
    mg_race race;
    /* The first read of bytes never written, reported once its epoch is over
     * (blocks.c) unless a thread writes them in it: that is a race instead. */
    int uninitialized_pending;
    uint32_t uninitialized_epoch;
    mg_race uninitialized;
    uint64_t interrupts;     /* SIGINTs counted when the launch began (base/interrupt.h) */
    mg_bounds_error bounds;
    mg_divergence divergence;
} mg_cpu_launch;

/* Where a launch's blocks ran: fiber t is thread t % per_block of the block
 * numbered first_block + t / per_block (x fastest) in the grid. */
typedef struct {
    const int64_t *grid, *bdim;
    int64_t first_block;
    int per_block;
    const char *source;
} mg_group_place;

extern _Thread_local mg_cpu_launch *mg_cpu_running;
extern size_t mg_cpu_page_size;
size_t mg_cpu_stack_stride(void);
fiber_pool *mg_cpu_pool_take(size_t n);
void mg_cpu_pool_give(fiber_pool *p);
void mg_cpu_fiber_main(void);
void mg_cpu_barrier(int32_t line);
void mg_cpu_grid_sync(int32_t line);
void mg_cpu__mlir_ciface_mg_cpu_shared(mg_memref_1d *result, int32_t which);
int64_t mg_cpu_shuffle(int32_t mode, int64_t value, int32_t offset, int32_t width, int32_t line);
void mg_cpu_exchange(mg_fiber *fibers, int first, int end);
void mg_cpu_warp_put(int64_t bits);
void mg_cpu_warp_collective(int32_t mode, int32_t line);
int64_t mg_cpu_warp_get(int32_t k);
float mg_cpu_element(int mode, uint32_t reg, int i);
void mg_cpu_mma(mg_fiber *lanes, int mode);
void mg_cpu_ldmatrix(mg_fiber *lanes, int count, int transpose);
int mg_cpu_collective(mg_cpu_launch *l, mg_fiber *fibers, int first, int end);
void mg_cpu_fault(int32_t line, const char *format, ...);
char *mg_cpu_shared_window(mg_cpu_launch *l);
void mg_cpu_mbarrier_init(int32_t address, int32_t count, int32_t line);
void mg_cpu_mbarrier_arrive(int32_t address, int32_t transaction_bytes, int32_t line);
void mg_cpu_mbarrier_wait(int32_t address, int32_t parity, int32_t line);
void mg_cpu_named_barrier(int32_t id, int32_t threads, int32_t wait, int32_t line);
int mg_cpu_wait_over(const mg_fiber *f);
void mg_cpu_tma_load(void *map, int32_t destination, int32_t barrier, int32_t rank, int32_t c0, int32_t c1,
                     int32_t c2, int32_t c3, int32_t c4, int32_t line);
void mg_cpu_tma_store(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                      int32_t c4, int32_t line);
void mg_cpu_tma_reduce_add(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           int32_t c4, int32_t line);
void mg_cpu__mlir_ciface_mg_cpu_wgmma_buffer(mg_memref_1d *result);
void mg_cpu_wgmma(int32_t n, int64_t a, int64_t b, int32_t mode, int32_t line);
int32_t mg_cpu_float8x4(float x0, float x1, float x2, float x3, int32_t e5m2);
void mg_cpu_printf_arg(int64_t bits);
void mg_cpu_printf(int32_t format);
int mg_cpu_flush_output(mg_cpu_launch *l);
void mg_cpu_bounds_index(int64_t index, int64_t size);
void mg_cpu_out_of_bounds(int32_t name, int32_t kind, int32_t line);
void mg_cpu_division_fault(int32_t overflow, int32_t line);
void mg_cpu_poll(int32_t line);
void mg_cpu_shared_access(int64_t address, int32_t bytes, int32_t kind, int32_t line);
int mg_cpu_global_table(mg_cpu_launch *l);
void mg_cpu_shadow_written(mg_cpu_launch *l, const char *at, size_t bytes, int32_t line);
int mg_cpu_uninitialized_read(mg_cpu_launch *l, int finished);

/* Threads of the group have synchronized: accesses after this are ordered after those before. */
static inline void mg_cpu_synchronized(mg_cpu_launch *l)
{
    l->epoch++;
}

/* The lanes first .. end - 1 of one warp completed a collective: it orders
 * their accesses, not those of the block's other warps. */
static inline void mg_cpu_warp_synchronized(mg_fiber *fibers, int first, int end)
{
    for (int t = first; t < end; t++)
        fibers[t].warp_syncs++;
}
void mg_cpu_raise_block_error(mg_cpu_launch *l, const mg_group_place *at);
int mg_cpu_run_blocks(mg_cpu_launch *l, int nblocks, int per_block);
int64_t mg_cpu_block_threads(const int64_t block[3]);


#endif
