/* Running a launch's blocks: the scheduler that resumes each fiber in turn
 * and releases barriers. */
#include "cpu/cpu.h"
#include "base/interrupt.h"
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
#include "cpu/cpu_shared.h"
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
int mg_cpu_run_blocks(mg_cpu_launch *l, int nblocks, int per_block)
{
    mg_fiber *fibers = l->pool->fibers;
    int n = nblocks * per_block;
    l->group_threads = n;
    for (int t = 0; t < n; t++) {
        mg_fiber *f = &fibers[t];
        getcontext(&f->context);
        f->context.uc_stack.ss_sp = l->pool->stacks + (size_t)t * mg_cpu_stack_stride() + mg_cpu_page_size;
        f->context.uc_stack.ss_size = MG_CPU_STACK;
        f->context.uc_link = &l->scheduler;
        makecontext(&f->context, mg_cpu_fiber_main, 0);
        f->state = FIBER_READY;
        f->ndata = 0; /* a fiber abandoned mid-collective may have left words behind */
        f->warp_syncs = 0;
    }
    memset(l->named, 0, (size_t)nblocks * MG_CPU_NAMED_BARRIERS * 2 * sizeof *l->named);
    for (;;) {
        /* Each sweep is a cheap point to notice Ctrl-C (a loop with a barrier in it). */
        if (mg_interrupted(l->interrupts))
            return l->failed = BLOCK_INTERRUPTED;
        if (mg_cpu_uninitialized_read(l, 0) != BLOCK_OK)
            return l->failed;
        for (int t = 0; t < n; t++) {
            if (fibers[t].state == FIBER_WAITING && mg_cpu_wait_over(&fibers[t]))
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
                    mg_cpu_exchange(fibers, first, end);
                else if (mg_cpu_collective(l, fibers, first, end) != BLOCK_OK)
                    return l->failed;
                mg_cpu_warp_synchronized(fibers, first, end);
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
                mg_cpu_synchronized(l);
                progress = 1;
            }
        }
        if (progress)
            continue;
        /* A wait that a thread swept after it ended (its phase completed, its named barrier was released). */
        for (int t = 0; t < n && !progress; t++)
            progress = fibers[t].state == FIBER_WAITING && mg_cpu_wait_over(&fibers[t]);
        if (progress)
            continue;
        mg_census all = census(fibers, 0, n);
        if (all.count[FIBER_AT_GRID] == n) {
            for (int t = 0; t < n; t++)
                fibers[t].state = FIBER_READY;
            mg_cpu_synchronized(l);
            continue;
        }
        if (all.count[FIBER_DONE] == n)
            return mg_cpu_uninitialized_read(l, 1);
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
