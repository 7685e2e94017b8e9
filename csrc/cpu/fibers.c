/* The CPU backend's fibers: a launch's threads, their stacks and pools,
 * and the running launch (cpu.c says how a launch runs). The bottom of cpu/. */
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
#define MG_CPU_IDLE_POOLS 4     /* fiber pools kept for later launches */

/* ------------------------------------------------------------------------ */
/* Fibers and the launch                                                     */











/* The launch whose blocks run on this thread (fibers share their thread's). */
_Thread_local mg_cpu_launch *mg_cpu_running;

size_t mg_cpu_page_size;
static fiber_pool *idle_pools; /* guarded by the GIL */
static int nidle_pools;

size_t mg_cpu_stack_stride(void) { return mg_cpu_page_size + MG_CPU_STACK; }

static void pool_destroy(fiber_pool *p)
{
    munmap(p->stacks, p->capacity * mg_cpu_stack_stride());
    PyMem_Free(p->fibers);
    PyMem_Free(p);
}

/* A pool of at least `n` fibers, idle or new; with the GIL. */
fiber_pool *mg_cpu_pool_take(size_t n)
{
    for (fiber_pool **at = &idle_pools; *at != NULL; at = &(*at)->next) {
        if ((*at)->capacity >= n) {
            fiber_pool *p = *at;
            *at = p->next;
            nidle_pools--;
            return p;
        }
    }
    if (mg_cpu_page_size == 0)
        mg_cpu_page_size = (size_t)sysconf(_SC_PAGESIZE);
    size_t capacity = MG_CPU_WARP;
    while (capacity < n)
        capacity *= 2;
    fiber_pool *p = PyMem_Calloc(1, sizeof *p);
    mg_fiber *fibers = PyMem_Calloc(capacity, sizeof *fibers);
    char *stacks = MAP_FAILED;
    if (p != NULL && fibers != NULL)
        stacks = mmap(NULL, capacity * mg_cpu_stack_stride(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stacks == MAP_FAILED) {
        PyMem_Free(p);
        PyMem_Free(fibers);
        PyErr_NoMemory();
        return NULL;
    }
    /* A guard page under each stack: an overflow faults instead of corrupting its neighbour. */
    for (size_t i = 0; i < capacity; i++)
        mprotect(stacks + i * mg_cpu_stack_stride(), mg_cpu_page_size, PROT_NONE);
    p->fibers = fibers;
    p->stacks = stacks;
    p->capacity = capacity;
    return p;
}

/* Back to the idle list (the smallest goes when it is full); with the GIL. */
void mg_cpu_pool_give(fiber_pool *p)
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

void mg_cpu_fiber_main(void)
{
    mg_cpu_launch *l = mg_cpu_running;
    int t = l->current;
    l->function(l->arguments[t]);
    l->pool->fibers[t].state = FIBER_DONE;
    /* Returning resumes uc_link: the scheduler. */
}

/* The running fiber stops in `state` (a block's or the grid's barrier) until
 * the scheduler resumes it. */
static void wait_at(int state, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    mg_fiber *f = &l->pool->fibers[l->current];
    f->state = state;
    f->line = line;
    swapcontext(&f->context, &l->scheduler);
}

void mg_cpu_poll(int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
    if (!mg_interrupted(l->interrupts))
        return;
    l->failed = BLOCK_INTERRUPTED;
    wait_at(FIBER_FAILED, line); /* abandoned, never resumed */
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
