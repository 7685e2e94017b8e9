/* The CPU backend's race detector and uninitialized-read check for shared
 * memory. Every checked access records, per byte, the synchronization epoch
 * and thread of the last write and of the threads that read it since the
 * epoch began. The epoch advances whenever threads of the running blocks
 * synchronize (a barrier, named barrier or grid barrier released, an mbarrier
 * phase completed): two accesses in one epoch by different threads, at least
 * one a write, have nothing ordering them, on the GPU as here, whatever order
 * the fibers ran in, unless both threads are lanes of one warp that completed
 * a shuffle or collective between them (which orders that warp's lanes only:
 * an mma.sync of one warp does not order another warp's accesses). Advancing
 * the epoch for every synchronization of any threads orders more than the GPU
 * does, so a race may go unseen, but none is reported that is not one.
 * Atomics are not tracked. */
#include "cpu/cpu.h"

#include <ucontext.h>

#include "cpu/cpu_shared.h"

enum { ACCESS_STORE = 1, ACCESS_VECTOR_STORE = 4, CHECK_RACES = 8, CHECK_UNINITIALIZED = 16 };

/* Ends the launch with the race or uninitialized read in l->race; the fiber is abandoned. */
static void report(mg_cpu_launch *l, int failed)
{
    l->failed = failed;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = FIBER_FAILED;
    swapcontext(&f->context, &l->scheduler);
    __builtin_unreachable();
}

static mg_race race_at(mg_cpu_launch *l, size_t at, int writes, int32_t line, uint32_t other, int other_writes,
                       int32_t other_line)
{
    size_t window = l->shared_stride ? l->shared_stride : 1;
    return (mg_race){l->current, (int)other, line, other_line, writes, other_writes, at % window,
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

static void race(mg_cpu_launch *l, size_t at, int writes, int32_t line, uint32_t other, int other_writes,
                 int32_t other_line)
{
    l->race = race_at(l, at, writes, line, other, other_writes, other_line);
    report(l, BLOCK_RACE);
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
    uint32_t t = (uint32_t)l->current, now = l->epoch, syncs = warp_syncs(l);
    if ((kind & 7) != ACCESS_STORE && (kind & 7) != ACCESS_VECTOR_STORE) {
        if ((kind & CHECK_RACES) && s->write_epoch == now && unordered(l, s->writer, s->write_syncs))
            race(l, at, 0, line, s->writer, 1, s->write_line);
        if ((kind & CHECK_UNINITIALIZED) && !l->uninitialized_pending &&
            (s->write_epoch < l->block_epoch || s[bytes - 1].write_epoch < l->block_epoch)) {
            l->uninitialized_pending = 1;
            l->uninitialized_epoch = now;
            l->uninitialized = race_at(l, s->write_epoch < l->block_epoch ? at : at + (size_t)bytes - 1, 0, line,
                                       MG_CPU_NO_THREAD, 0, 0);
        }
        /* A thread's latest read in the epoch is the one a lane of its warp must be ordered after. */
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
        return;
    }
    for (int32_t i = 0; i < bytes; i++, s++, at++) {
        if (kind & CHECK_RACES) {
            if (s->write_epoch == now && unordered(l, s->writer, s->write_syncs))
                race(l, at, 1, line, s->writer, 1, s->write_line);
            if (s->read_epoch == now && unordered(l, s->reader, s->read_syncs))
                race(l, at, 1, line, s->reader, 0, s->read_line);
            if (s->read_epoch == now && s->reader2 != MG_CPU_NO_THREAD && unordered(l, s->reader2, s->read_syncs2))
                race(l, at, 1, line, s->reader2, 0, s->read_line2);
        }
        s->write_epoch = now;
        s->writer = t;
        s->write_syncs = syncs;
        s->write_line = line;
    }
}

/* Bytes the runtime wrote for the running thread (a TMA load's box): written
 * as far as later reads are concerned, by that thread now. */
void mg_cpu_shadow_written(mg_cpu_launch *l, const char *at, size_t bytes, int32_t line)
{
    if (l->shadow == NULL)
        return; /* the kernel checks no access */
    size_t offset = (size_t)(at - l->shared[0]);
    for (size_t i = 0; i < bytes && offset + i < l->shared_total; i++) {
        mg_shadow *s = &l->shadow[offset + i];
        s->write_epoch = l->epoch;
        s->writer = (uint32_t)l->current;
        s->write_syncs = warp_syncs(l);
        s->write_line = line;
    }
}
