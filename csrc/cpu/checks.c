/* The CPU backend's printf and bounds checks, and the KernelError a block
 * that broke a rule raises. */
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
#include "cpu/cpu_shared.h"
/* printf                                                                    */

void mg_cpu_printf_arg(int64_t bits)
{
    mg_cpu_launch *l = mg_cpu_running;
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
    mg_cpu_launch *l = mg_cpu_running;
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
int mg_cpu_flush_output(mg_cpu_launch *l)
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
    mg_cpu_launch *l = mg_cpu_running;
    if (l->nargs < MG_CPU_MAX_ARGS) {
        l->args[l->nargs] = index;
        l->sizes[l->nargs++] = size;
    }
}

/* An access failed its check: recorded for the scheduler, which raises
 * KernelError; this fiber is abandoned, never resumed. */
void mg_cpu_out_of_bounds(int32_t name, int32_t kind, int32_t line)
{
    mg_cpu_launch *l = mg_cpu_running;
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

/* An integer division by zero (or INT_MIN by -1: `overflow`), which would
 * kill the process with SIGFPE: a fault of the running thread instead. */
void mg_cpu_division_fault(int32_t overflow, int32_t line)
{
    mg_cpu_fault(line, overflow ? "integer division overflow (the lowest signed integer divided by -1; on the "
                                  "GPU the result is unspecified)"
                                : "integer division by zero (// or %%; on the GPU the result is unspecified)");
}

static void thread_xyz(int t, const int64_t *bdim, long long xyz[3])
{
    xyz[0] = t % bdim[0];
    xyz[1] = t / bdim[0] % bdim[1];
    xyz[2] = t / (bdim[0] * bdim[1]);
}


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

/* Where the blocked threads of the group wait, for a deadlock's message:
 * "; blocked: 31 threads on line 14 (the first thread (1, 0, 0) of block
 * (0, 0, 0)), 1 on line 20 (...)", up to four lines. */
static void blocked_text(char *out, size_t cap, const mg_cpu_launch *l, const mg_group_place *at)
{
    enum { LINES = 4 };
    int32_t lines[LINES];
    int count[LINES], first[LINES], nlines = 0, more = 0;
    const mg_fiber *fibers = l->pool->fibers;
    for (int t = 0; t < l->group_threads; t++) {
        int s = fibers[t].state;
        if (s != FIBER_AT_BARRIER && s != FIBER_AT_SHUFFLE && s != FIBER_AT_GRID && s != FIBER_WAITING)
            continue;
        int k = 0;
        while (k < nlines && lines[k] != fibers[t].line)
            k++;
        if (k == nlines) {
            if (nlines == LINES) {
                more++;
                continue;
            }
            lines[nlines] = fibers[t].line;
            count[nlines] = 0;
            first[nlines++] = t;
        }
        count[k]++;
    }
    size_t used = (size_t)PyOS_snprintf(out, cap, "; blocked:");
    for (int k = 0; k < nlines && used < cap; k++) {
        char who[160];
        thread_text(who, sizeof who, at, first[k], 1);
        used += (size_t)PyOS_snprintf(out + used, cap - used, "%s %d thread%s on line %d (the first %s)",
                                      k ? "," : "", count[k], count[k] == 1 ? "" : "s", (int)lines[k], who);
    }
    if (more && used < cap)
        PyOS_snprintf(out + used, cap - used, ", %d more elsewhere", more);
}

/* The KernelError of the blocks that failed; with the GIL. */
void mg_cpu_raise_block_error(mg_cpu_launch *l, const mg_group_place *at)
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
    if (l->failed == BLOCK_RACE || l->failed == BLOCK_UNINITIALIZED) {
        mg_race *r = &l->race;
        thread_text(who, sizeof who, at, r->thread, 1);
        if (l->failed == BLOCK_UNINITIALIZED) {
            mg_raise(mg_st->KernelError,
                     "read of uninitialized shared memory at %s:%d: %s reads byte %zu of its block's shared "
                     "memory (shared address 0x%x), which no thread of the block has written (MLIRGPU_CHECK "
                     "without 'uninitialized' turns this check off)", source, (int)r->line, who, r->offset,
                     (unsigned)r->address);
            return;
        }
        thread_text(other, sizeof other, at, r->other, 1);
        if (r->array >= 0) {
            mg_raise(mg_st->KernelError,
                     "data race on global memory at %s:%d: %s %s element %zu of '%s' (address %p), which %s "
                     "%s at %s:%d, with no barrier between them (MLIRGPU_CHECK without 'races' turns this check "
                     "off)", source, (int)r->line, who, r->writes ? "writes" : "reads", r->offset,
                     string_at(l, r->array), (void *)(uintptr_t)r->address, other,
                     r->other_writes ? "wrote" : "read", source, (int)r->other_line);
            return;
        }
        mg_raise(mg_st->KernelError,
                 "data race on shared memory at %s:%d: %s %s byte %zu of its block's shared memory (shared "
                 "address 0x%x), which %s %s at %s:%d, with no barrier between them (MLIRGPU_CHECK without "
                 "'races' turns this check off)", source, (int)r->line, who, r->writes ? "writes" : "reads",
                 r->offset, (unsigned)r->address, other, r->other_writes ? "wrote" : "read", source,
                 (int)r->other_line);
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
        char blocked[1024];
        blocked_text(blocked, sizeof blocked, l, at);
        mg_raise(mg_st->KernelError,
                 "deadlock at %s:%d: %s waits on line %d for %s that no thread of its block can complete "
                 "(the others have returned or wait as well)%s", source, (int)v->line, who, (int)v->line,
                 v->why == WAIT_MBARRIER ? "an mbarrier phase" : "a named barrier", blocked);
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
