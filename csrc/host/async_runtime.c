/* MLIR's async runtime over the calling thread (see async_runtime.h). The
 * signatures are those of MLIR 22's AsyncRuntime.h, which
 * convert-async-to-llvm declares. Objects are reference counted (created
 * with one reference); an awaiter is a coroutine to resume or a group to
 * count down, run when the token or value becomes ready. Because nothing
 * runs on another thread, a blocking await of something not ready could
 * never end: it fails the call instead. */
#include "host/async_runtime.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static mg_async_hooks hooks;

void mg_async_register_hooks(const mg_async_hooks *registered)
{
    hooks = *registered;
}

typedef void (*resume_fn)(void *);

enum { TOKEN, VALUE, GROUP };
enum { PENDING, READY, ERROR };

struct object;

typedef struct {
    void *handle;         /* a coroutine to resume, or NULL */
    resume_fn resume;
    struct object *group; /* else a group to count down (one reference held) */
} awaiter;

typedef struct object {
    int kind, state;
    int64_t refs;
    awaiter *awaiters;
    size_t nawaiters, cawaiters;
    void *storage;          /* a value's */
    int64_t pending, errors, rank; /* a group's */
    struct object *prev, *next;    /* the invocation's live objects */
} object;

/* The live objects of the invocation running on this thread. */
static _Thread_local object *live;

static object *create(int kind)
{
    object *o = calloc(1, sizeof *o);
    if (o == NULL) {
        hooks.fail(CUDA_ERROR_OUT_OF_MEMORY, "mlirAsyncRuntime", "no host memory left for an async object");
        return NULL;
    }
    o->kind = kind;
    o->refs = 1;
    o->next = live;
    if (live != NULL)
        live->prev = o;
    live = o;
    return o;
}

static void destroy(object *o)
{
    if (o->prev != NULL)
        o->prev->next = o->next;
    else
        live = o->next;
    if (o->next != NULL)
        o->next->prev = o->prev;
    free(o->storage);
    free(o->awaiters);
    free(o);
}

static void mlirAsyncRuntimeAddRef(object *o, int64_t count) { o->refs += count; }

static void mlirAsyncRuntimeDropRef(object *o, int64_t count)
{
    if ((o->refs -= count) <= 0)
        destroy(o);
}

static object *mlirAsyncRuntimeCreateToken(void) { return create(TOKEN); }

static object *mlirAsyncRuntimeCreateValue(int64_t bytes)
{
    object *o = create(VALUE);
    if (o != NULL && (o->storage = calloc(1, bytes > 0 ? (size_t)bytes : 1)) == NULL) {
        destroy(o);
        hooks.fail(CUDA_ERROR_OUT_OF_MEMORY, "mlirAsyncRuntimeCreateValue", "no host memory left for a value");
        return NULL;
    }
    return o;
}

static object *mlirAsyncRuntimeCreateGroup(int64_t size)
{
    object *o = create(GROUP);
    if (o != NULL)
        o->pending = size;
    return o;
}

static void wait_on(object *o, awaiter a)
{
    if (o->nawaiters == o->cawaiters) {
        size_t n = o->cawaiters ? 2 * o->cawaiters : 4;
        awaiter *grown = realloc(o->awaiters, n * sizeof *grown);
        if (grown == NULL) {
            hooks.fail(CUDA_ERROR_OUT_OF_MEMORY, "mlirAsyncRuntime", "no host memory left for an awaiter");
            return;
        }
        o->awaiters = grown;
        o->cawaiters = n;
    }
    o->awaiters[o->nawaiters++] = a;
}

static void count_down(object *group, int error);

/* Runs and forgets the awaiters of `o`, which just became ready. */
static void run_awaiters(object *o)
{
    /* Taken first: a resumed coroutine may await `o` again; `o` is kept
     * alive while they run, since one of them may drop its last reference. */
    awaiter *list = o->awaiters;
    size_t n = o->nawaiters;
    o->awaiters = NULL;
    o->nawaiters = o->cawaiters = 0;
    o->refs++;
    for (size_t i = 0; i < n; i++) {
        if (list[i].handle != NULL) {
            list[i].resume(list[i].handle);
        } else {
            count_down(list[i].group, o->state == ERROR);
            mlirAsyncRuntimeDropRef(list[i].group, 1);
        }
    }
    free(list);
    mlirAsyncRuntimeDropRef(o, 1);
}

static void count_down(object *group, int error)
{
    group->errors += error;
    if (--group->pending == 0)
        run_awaiters(group);
}

static void set_state(object *o, int state)
{
    o->state = state;
    run_awaiters(o);
}

static void mlirAsyncRuntimeEmplaceToken(object *o) { set_state(o, READY); }
static void mlirAsyncRuntimeEmplaceValue(object *o) { set_state(o, READY); }
static void mlirAsyncRuntimeSetTokenError(object *o) { set_state(o, ERROR); }
static void mlirAsyncRuntimeSetValueError(object *o) { set_state(o, ERROR); }
static bool mlirAsyncRuntimeIsTokenError(object *o) { return o->state == ERROR; }
static bool mlirAsyncRuntimeIsValueError(object *o) { return o->state == ERROR; }
static bool mlirAsyncRuntimeIsGroupError(object *o) { return o->errors > 0; }
static void *mlirAsyncRuntimeGetValueStorage(object *o) { return o->storage; }

static int64_t mlirAsyncRuntimeAddTokenToGroup(object *token, object *group)
{
    int64_t rank = group->rank++;
    if (token->state != PENDING) {
        count_down(group, token->state == ERROR);
    } else {
        group->refs++; /* until the token is ready */
        wait_on(token, (awaiter){NULL, NULL, group});
    }
    return rank;
}

/* A blocking await: what it waits for can only be ready already. */
static void await_ready(object *o, const char *what)
{
    int ready = o->kind == GROUP ? o->pending <= 0 : o->state != PENDING;
    if (!ready)
        hooks.fail(CUDA_ERROR_ILLEGAL_STATE, what, "awaits what no async.execute region can complete (every "
                           "region runs on the calling thread, and all of them are waiting)");
}

static void mlirAsyncRuntimeAwaitToken(object *o) { await_ready(o, "mlirAsyncRuntimeAwaitToken"); }
static void mlirAsyncRuntimeAwaitValue(object *o) { await_ready(o, "mlirAsyncRuntimeAwaitValue"); }
static void mlirAsyncRuntimeAwaitAllInGroup(object *o) { await_ready(o, "mlirAsyncRuntimeAwaitAllInGroup"); }

static void mlirAsyncRuntimeExecute(void *handle, resume_fn resume) { resume(handle); }

static void await_and_execute(object *o, void *handle, resume_fn resume)
{
    int ready = o->kind == GROUP ? o->pending <= 0 : o->state != PENDING;
    if (ready)
        resume(handle);
    else
        wait_on(o, (awaiter){handle, resume, NULL});
}

static void mlirAsyncRuntimeAwaitTokenAndExecute(object *o, void *handle, resume_fn resume)
{
    await_and_execute(o, handle, resume);
}

static void mlirAsyncRuntimeAwaitValueAndExecute(object *o, void *handle, resume_fn resume)
{
    await_and_execute(o, handle, resume);
}

static void mlirAsyncRuntimeAwaitAllInGroupAndExecute(object *o, void *handle, resume_fn resume)
{
    await_and_execute(o, handle, resume);
}

/* async.parallel_for splits its work by this: one thread runs it all. */
static int64_t mlirAsyncRuntimGetNumWorkerThreads(void) { return 1; }

void mg_async_release_all(void)
{
    while (live != NULL)
        destroy(live);
}

#define SYMBOL(name) {#name, (void *)name}

static const struct {
    const char *name;
    void *address;
} symbols[] = {
    SYMBOL(mlirAsyncRuntimeAddRef), SYMBOL(mlirAsyncRuntimeDropRef), SYMBOL(mlirAsyncRuntimeCreateToken),
    SYMBOL(mlirAsyncRuntimeCreateValue), SYMBOL(mlirAsyncRuntimeCreateGroup), SYMBOL(mlirAsyncRuntimeAddTokenToGroup),
    SYMBOL(mlirAsyncRuntimeEmplaceToken), SYMBOL(mlirAsyncRuntimeEmplaceValue), SYMBOL(mlirAsyncRuntimeSetTokenError),
    SYMBOL(mlirAsyncRuntimeSetValueError), SYMBOL(mlirAsyncRuntimeIsTokenError), SYMBOL(mlirAsyncRuntimeIsValueError),
    SYMBOL(mlirAsyncRuntimeIsGroupError), SYMBOL(mlirAsyncRuntimeAwaitToken), SYMBOL(mlirAsyncRuntimeAwaitValue),
    SYMBOL(mlirAsyncRuntimeAwaitAllInGroup), SYMBOL(mlirAsyncRuntimeGetValueStorage), SYMBOL(mlirAsyncRuntimeExecute),
    SYMBOL(mlirAsyncRuntimeAwaitTokenAndExecute), SYMBOL(mlirAsyncRuntimeAwaitValueAndExecute),
    SYMBOL(mlirAsyncRuntimeAwaitAllInGroupAndExecute), SYMBOL(mlirAsyncRuntimGetNumWorkerThreads),
};

void *mg_async_symbol(const char *name)
{
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++)
        if (strcmp(symbols[i].name, name) == 0)
            return symbols[i].address;
    return NULL;
}
