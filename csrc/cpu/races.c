/* The CPU backend's race detector and uninitialized-read check for shared
 * memory, and its race detector for global memory. Every checked access
 * records the synchronization epoch and thread of the last write and of the
 * threads that read since the epoch began: per byte of shared memory in a
 * shadow of it, per element of global memory in a hash table of the elements
 * the running blocks touched in the epoch (the arrays may be far larger than
 * what one epoch touches). The epoch advances whenever threads of the running
 * blocks synchronize (a barrier, named barrier or grid barrier released, an
 * mbarrier phase completed): two accesses in one epoch by different threads
 * of a block, at least one a write, have nothing ordering them, on the GPU as
 * here, whatever order the fibers ran in, unless both threads are lanes of
 * one warp that completed a shuffle or collective between them (which orders
 * that warp's lanes only: an mma.sync of one warp does not order another
 * warp's accesses). Advancing the epoch for every synchronization of any
 * threads orders more than the GPU does, so a race may go unseen, but none is
 * reported that is not one. Atomics are not tracked. */
#include "cpu/cpu.h"

#include <stdlib.h>
#include <ucontext.h>

#include "cpu/cpu_shared.h"

enum { ACCESS_STORE = 1, ACCESS_VECTOR_STORE = 4, CHECK_RACES = 8, CHECK_UNINITIALIZED = 16 };

/* Slots of the global-memory table: the first a launch allocates, and the
 * most it grows to (half of them in use at most; past that, elements first
 * touched late in a long epoch go unchecked). */
#define GLOBAL_SLOTS_FIRST 1024
#define GLOBAL_SLOTS_MAX (1u << 20)

/* Ends the launch with the race or uninitialized read in l->race; the fiber is abandoned. */
static void report(mg_cpu_launch *l, int failed)
{
    l->failed = failed;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_FAILED;
    swapcontext(&f->context, &l->scheduler);
    __builtin_unreachable();
}

/* A thread's access as a shadow records it: the other side of a race. */
typedef struct {
    uint32_t thread;
    int writes;
    int32_t line;
} mg_access;

/* mg_race of the running thread's access at byte `at` of the group's shared memory and `other`. */
static mg_race shared_race(mg_cpu_launch *l, size_t at, int writes, int32_t line, mg_access other)
{
    size_t window = l->shared_stride ? l->shared_stride : 1;
    return (mg_race){l->current, (int)other.thread, line, other.line, writes, other.writes, -1, at % window,
                     (uint32_t)(uintptr_t)(l->shared[0] + at)};
}

/* The collectives the running thread's warp completed (0 where the kernel runs without fibers: one thread at a time). */
static uint32_t warp_syncs(mg_cpu_launch *l)
{
    return l->pool != NULL ? l->pool->fibers[l->current].warp_syncs : 0;
}

/* Whether an access of the running thread in the epoch of an access by
 * `other`, whose warp had then completed `syncs` collectives, is unordered
 * with it: another thread, and not a lane of its warp with a collective since. */
static int unordered(mg_cpu_launch *l, uint32_t other, uint32_t syncs)
{
    uint32_t t = (uint32_t)l->current, per_block = (uint32_t)l->block_threads;
    if (other == t)
        return 0;
    int one_warp = other / per_block == t / per_block && other % per_block / MG_CPU_WARP == t % per_block / MG_CPU_WARP;
    return !one_warp || warp_syncs(l) == syncs;
}

/* Whether an access of the running thread (a write if `writes`) is unordered
 * with one `s` recorded in this epoch: 1 with that access in *other, else 0. */
static int conflict(mg_cpu_launch *l, const mg_shadow *s, int writes, mg_access *other)
{
    uint32_t now = l->epoch;
    if (s->write_epoch == now && unordered(l, s->writer, s->write_syncs))
        *other = (mg_access){s->writer, 1, s->write_line};
    else if (writes && s->read_epoch == now && unordered(l, s->reader, s->read_syncs))
        *other = (mg_access){s->reader, 0, s->read_line};
    else if (writes && s->read_epoch == now && s->reader2 != MG_CPU_NO_THREAD &&
             unordered(l, s->reader2, s->read_syncs2))
        *other = (mg_access){s->reader2, 0, s->read_line2};
    else
        return 0;
    return 1;
}

/* Records a read by the running thread in `s`: a thread's latest read in the
 * epoch is the one a lane of its warp must be ordered after. */
static void record_read(mg_cpu_launch *l, mg_shadow *s, int32_t line)
{
    uint32_t t = (uint32_t)l->current, now = l->epoch, syncs = warp_syncs(l);
    if (s->read_epoch != now) {
        s->read_epoch = now;
        s->reader = t;
        s->read_syncs = syncs;
        s->read_line = line;
        s->reader2 = MG_CPU_NO_THREAD;
    } else if (s->reader == t) {
        s->read_syncs = syncs;
        s->read_line = line;
    } else if (s->reader2 == MG_CPU_NO_THREAD || s->reader2 == t) {
        s->reader2 = t;
        s->read_syncs2 = syncs;
        s->read_line2 = line;
    }
}

static void record_write(mg_cpu_launch *l, mg_shadow *s, int32_t line)
{
    s->write_epoch = l->epoch;
    s->writer = (uint32_t)l->current;
    s->write_syncs = warp_syncs(l);
    s->write_line = line;
}

/* BLOCK_UNINITIALIZED, with l->race, for a read of bytes never written whose
 * epoch is over (or the blocks have `finished`); else BLOCK_OK. From the scheduler. */
int mg_cpu_uninitialized_read(mg_cpu_launch *l, int finished)
{
    if (!l->uninitialized_pending || (!finished && l->epoch == l->uninitialized_epoch))
        return BLOCK_OK;
    l->uninitialized_pending = 0;
    l->race = l->uninitialized;
    return l->failed = BLOCK_UNINITIALIZED;
}

/* A write records itself in every byte it covers. A read, far more common
 * (a tile read by a row of threads), checks the write of its first byte and
 * records itself there, and is uninitialized where its first or last byte is:
 * a read and a write that overlap elsewhere (the same bytes seen as different
 * types) may go unseen, but what is reported is always so. */
void mg_cpu_shared_access(int64_t address, int32_t bytes, int32_t kind, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    size_t at = (size_t)((char *)(intptr_t)address - l->shared[0]);
    if (bytes <= 0 || at >= l->shared_total || (size_t)bytes > l->shared_total - at)
        return; /* not shared memory: the bounds check has its say */
    mg_shadow *s = l->shadow + at;
    mg_access other;
    if ((kind & 7) != ACCESS_STORE && (kind & 7) != ACCESS_VECTOR_STORE) {
        if ((kind & CHECK_RACES) && conflict(l, s, 0, &other)) {
            l->race = shared_race(l, at, 0, line, other);
            report(l, BLOCK_RACE);
        }
        if ((kind & CHECK_UNINITIALIZED) && !l->uninitialized_pending &&
            (s->write_epoch < l->block_epoch || s[bytes - 1].write_epoch < l->block_epoch)) {
            l->uninitialized_pending = 1;
            l->uninitialized_epoch = l->epoch;
            l->uninitialized = shared_race(l, s->write_epoch < l->block_epoch ? at : at + (size_t)bytes - 1, 0,
                                           line, (mg_access){MG_CPU_NO_THREAD, 0, 0});
        }
        record_read(l, s, line);
        return;
    }
    for (int32_t i = 0; i < bytes; i++, s++, at++) {
        if ((kind & CHECK_RACES) && conflict(l, s, 1, &other)) {
            l->race = shared_race(l, at, 1, line, other);
            report(l, BLOCK_RACE);
        }
        record_write(l, s, line);
    }
}

/* Bytes the runtime wrote for the running thread (a TMA load's box): written
 * as far as later reads are concerned, by that thread now. */
void mg_cpu_shadow_written(mg_cpu_launch *l, const char *at, size_t bytes, int32_t line)
{
    if (l->shadow == NULL)
        return; /* the kernel checks no access */
    size_t offset = (size_t)(at - l->shared[0]);
    for (size_t i = 0; i < bytes && offset + i < l->shared_total; i++)
        record_write(l, &l->shadow[offset + i], line);
}

/* ------------------------------------------------------------------------ */
/* Global memory                                                             */

/* A slot of the table is in use while it holds an access of the current
 * epoch: the table empties itself whenever the epoch advances. */
static int live(const mg_global_slot *e, uint32_t now)
{
    return e->shadow.write_epoch == now || e->shadow.read_epoch == now;
}

static size_t slot_of(uint64_t address, uint32_t block, size_t mask)
{
    return (size_t)(((address ^ (uint64_t)block << 48) * 0x9e3779b97f4a7c15ull) >> 20) & mask;
}

/* Doubles the table, keeping the slots in use; 0 where it is at its most or
 * out of memory (it stays as it was). Without the GIL: the C allocator. */
static int grow(mg_cpu_launch *l)
{
    size_t slots = l->global_mask + 1;
    uint32_t now = l->epoch;
    if (slots >= GLOBAL_SLOTS_MAX)
        return 0;
    mg_global_slot *table = calloc(2 * slots, sizeof *table);
    if (table == NULL)
        return 0;
    size_t mask = 2 * slots - 1;
    for (size_t i = 0; i < slots; i++) {
        mg_global_slot *e = &l->global[i];
        if (!live(e, now))
            continue;
        size_t j = slot_of(e->address, e->block, mask);
        while (live(&table[j], now))
            j = (j + 1) & mask;
        table[j] = *e;
    }
    free(l->global);
    l->global = table;
    l->global_mask = mask;
    return 1;
}

/* The shadow of the element at `address` as threads of `block` (of the
 * group) accessed it in this epoch, added empty if they have not; NULL where
 * the table is full. Open addressing with linear probing: a slot out of use
 * ends a probe, since no slot of this epoch was added after one out of use in its path. */
static mg_shadow *global_shadow(mg_cpu_launch *l, uint64_t address, uint32_t block)
{
    uint32_t now = l->epoch;
    if (l->global_epoch != now) {
        l->global_epoch = now;
        l->global_used = 0;
    }
    size_t i = slot_of(address, block, l->global_mask);
    for (; live(&l->global[i], now); i = (i + 1) & l->global_mask)
        if (l->global[i].address == address && l->global[i].block == block)
            return &l->global[i].shadow;
    if (2 * (l->global_used + 1) > l->global_mask + 1) {
        if (!grow(l))
            return NULL;
        for (i = slot_of(address, block, l->global_mask); live(&l->global[i], now); i = (i + 1) & l->global_mask)
            ;
    }
    l->global_used++;
    l->global[i] = (mg_global_slot){address, block, {0}};
    return &l->global[i].shadow;
}

/* Whether `bytes` at `address` overlap an array the kernel may store to. */
static int may_be_written(const mg_cpu_launch *l, uint64_t address, uint64_t bytes)
{
    for (int i = 0; i < l->nwritten; i++)
        if (address < l->written[i].end && address + bytes > l->written[i].start)
            return 1;
    return 0;
}

/* Each element is its own entry, found by its address: a read and a write of
 * overlapping bytes at different addresses (the same bytes seen as different
 * types) go unseen, but what is reported is always so. Out of line: the
 * common call, a read no thread can race with, stays a few instructions. */
static __attribute__((noinline)) void check_elements(mg_cpu_launch *l, uint64_t address, int64_t element,
                                                     int32_t size, int32_t count, int writes, int32_t array,
                                                     int32_t line)
{
    if (l->global == NULL)
        return; /* an engine made without checks_global keeps no table */
    uint32_t block = (uint32_t)(l->current / l->block_threads);
    mg_access other;
    for (int32_t i = 0; i < count; i++) {
        uint64_t at = address + (uint64_t)i * (uint64_t)size;
        mg_shadow *s = global_shadow(l, at, block);
        if (s == NULL)
            return;
        if (conflict(l, s, writes, &other)) {
            l->race = (mg_race){l->current, (int)other.thread, line, other.line, writes, other.writes, array,
                                (size_t)(element + i), at};
            report(l, BLOCK_RACE);
        }
        if (writes)
            record_write(l, s, line);
        else
            record_read(l, s, line);
    }
}

/* A read of an array no thread stores to (a matmul's operands) is no race and skips the table. */
void mg_cpu_global_access(int64_t address, int64_t element, int32_t size, int32_t count, int32_t kind,
                          int32_t array, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    int writes = kind == ACCESS_STORE || kind == ACCESS_VECTOR_STORE;
    if (writes || may_be_written(l, (uint64_t)address, (uint64_t)size * (uint64_t)count))
        check_elements(l, (uint64_t)address, element, size, count, writes, array, line);
}

/* The table of a launch whose kernel checks global accesses: 0, or -1 with MemoryError. With the GIL. */
int mg_cpu_global_table(mg_cpu_launch *l)
{
    l->global = calloc(GLOBAL_SLOTS_FIRST, sizeof *l->global);
    if (l->global == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    l->global_mask = GLOBAL_SLOTS_FIRST - 1;
    return 0;
}
