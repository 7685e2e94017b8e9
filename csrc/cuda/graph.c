/* mlirgpu.Graph: work captured from a stream into a CUDA graph
 * (cuStreamBeginCapture in thread-local mode, cuStreamEndCapture,
 * cuGraphInstantiateWithFlags) and replayed with cuGraphLaunch. */
#include "cuda/graph.h"
#include "cuda/driver.h"
#include "cuda/stream.h"

#include <structmember.h>

/* A Graph's life: made, capturing (inside the with-block), then ready to
 * replay, or discarded when its capture failed. A Graph captures once. */
enum { GRAPH_NEW, GRAPH_CAPTURING, GRAPH_READY, GRAPH_DISCARDED };

typedef struct {
    uintptr_t pointer;
    int device;
    int pinned;
} deferred_free;

typedef struct {
    PyObject_HEAD
    PyObject *stream_obj;         /* strong: the stream captured on, and replayed on by default */
    CUstream stream;
    int device;
    int state;
    CUgraph graph;
    CUgraphExec exec;
    PyObject *retained;           /* {id(obj): obj}: what the captured work points at; NULL until captured */
    PyObject *outer;              /* strong while capturing: the graph this thread captured into before */
    deferred_free *deferred;      /* frees put off until the capture ends (PyMem) */
    Py_ssize_t ndeferred, deferred_capacity;
} mg_graph;

/* Each link of the chain (this variable, then each graph's `outer`) owns a reference. */
_Thread_local PyObject *mg_graph_tls_capture = NULL;

static PyTypeObject *graph_type;

static mg_graph_hooks hooks;

void mg_graph_register_hooks(const mg_graph_hooks *registered)
{
    hooks = *registered;
}

void mg_cu_free_quietly(CUdeviceptr pointer, int device)
{
    if (pointer == 0 || mg_graph_defer_free((uintptr_t)pointer, device, 0))
        return;
    int pushed = mg_cu_push_quietly(device);
    if (pushed < 0)
        return;
    /* A destructor cannot report failure: at exit the driver may already be
     * deinitialized, and after a sticky fault nothing can be freed anyway. */
    mg_cu.cuMemFree(pointer);
    mg_cu_pop(pushed);
}

void mg_cu_free_host_quietly(void *pointer, int device)
{
    if (pointer == NULL || mg_graph_defer_free((uintptr_t)pointer, device, 1))
        return;
    int pushed = mg_cu_push_quietly(device);
    if (pushed < 0)
        return;
    mg_cu.cuMemFreeHost(pointer);
    mg_cu_pop(pushed);
}


int mg_graph_retain(PyObject *obj)
{
    for (PyObject *g = mg_graph_tls_capture; g != NULL; g = ((mg_graph *)g)->outer) {
        PyObject *key = PyLong_FromVoidPtr(obj);
        if (key == NULL)
            return -1;
        int status = PyDict_SetItem(((mg_graph *)g)->retained, key, obj);
        Py_DECREF(key);
        if (status < 0)
            return -1;
    }
    return 0;
}

int mg_graph_defer_free(uintptr_t pointer, int device, int pinned)
{
    mg_graph *g = (mg_graph *)mg_graph_tls_capture;
    if (g == NULL)
        return 0;
    if (g->ndeferred == g->deferred_capacity) {
        Py_ssize_t capacity = g->deferred_capacity ? 2 * g->deferred_capacity : 16;
        deferred_free *grown = PyMem_Realloc(g->deferred, (size_t)capacity * sizeof *grown);
        if (grown == NULL)
            return 0;   /* freed now: the capture may fail, but nothing leaks */
        g->deferred = grown;
        g->deferred_capacity = capacity;
    }
    g->deferred[g->ndeferred++] = (deferred_free){pointer, device, pinned};
    return 1;
}

/* Frees what the capture put off; an outer capture of this thread, if any,
 * puts them off again. */
static void flush_deferred(mg_graph *self)
{
    deferred_free *deferred = self->deferred;
    Py_ssize_t n = self->ndeferred;
    self->deferred = NULL;
    self->ndeferred = self->deferred_capacity = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (deferred[i].pinned)
            mg_cu_free_host_quietly((void *)deferred[i].pointer, deferred[i].device);
        else
            mg_cu_free_quietly((CUdeviceptr)deferred[i].pointer, deferred[i].device);
    }
    PyMem_Free(deferred);
}

/* Takes `self` out of this thread's chain of captures: 1, or 0 when another
 * thread began its capture. */
static int unlink_capture(mg_graph *self)
{
    PyObject **link = &mg_graph_tls_capture;
    while (*link != NULL && *link != (PyObject *)self)
        link = &((mg_graph *)*link)->outer;
    if (*link == NULL)
        return 0;
    *link = self->outer;   /* the link now owns self's reference to its outer graph */
    self->outer = NULL;
    Py_DECREF(self);       /* the link's reference; the caller holds another */
    return 1;
}

static PyObject *state_error(mg_graph *self)
{
    static const char *why[] = {
        [GRAPH_NEW] = "the graph was not captured yet: capture it with `with g:` (or `with mg.graph() as g:`)",
        [GRAPH_CAPTURING] = "the graph is still capturing: replay it after the with-block",
        [GRAPH_READY] = "the graph was captured already: a Graph captures once, make another",
        [GRAPH_DISCARDED] = "the graph was discarded: its capture failed or raised",
    };
    return mg_raise(PyExc_RuntimeError, "%s", why[self->state]);
}

/* ---------------------------------------------------------------------- */
/* Creation and release                                                    */
/* ---------------------------------------------------------------------- */

static PyObject *graph_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", NULL};
    PyObject *stream_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:Graph", keywords, &stream_obj))
        return NULL;
    CUstream stream;
    if (stream_obj != NULL) {
        if (!mg_cu_stream_converter(stream_obj, &stream))
            return NULL;
        if (stream == NULL)
            return mg_raise(PyExc_ValueError,
                            "CUDA cannot capture the legacy default stream (None, 0, 1, mlirgpu.cuda.default_stream): "
                            "capture on an mlirgpu.Stream, or give no stream and the graph makes its own");
        Py_INCREF(stream_obj);
    }
    else {
        /* Non-blocking: the legacy default stream's work neither waits for the capture nor breaks it. */
        PyObject *empty = PyTuple_New(0), *options = Py_BuildValue("{s:O}", "non_blocking", Py_True);
        if (empty != NULL && options != NULL)
            stream_obj = PyObject_Call((PyObject *)mg_cu_Stream_type, empty, options);
        Py_XDECREF(empty);
        Py_XDECREF(options);
        if (stream_obj == NULL || !mg_cu_stream_converter(stream_obj, &stream)) {
            Py_XDECREF(stream_obj);
            return NULL;
        }
    }
    mg_graph *self = (mg_graph *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(stream_obj);
        return NULL;
    }
    self->stream_obj = stream_obj;
    self->stream = stream;
    self->device = mg_cu_stream_device(stream_obj);
    self->state = GRAPH_NEW;
    return (PyObject *)self;
}

static void destroy_handles(mg_graph *self)
{
    if (self->exec == NULL && self->graph == NULL)
        return;
    int pushed = mg_cu_push_quietly(self->device);
    if (pushed >= 0) {
        /* An executable graph still running is freed by the driver once it completes. */
        if (self->exec != NULL)
            mg_cu.cuGraphExecDestroy(self->exec);
        if (self->graph != NULL)
            mg_cu.cuGraphDestroy(self->graph);
        mg_cu_pop(pushed);
    }
    self->exec = NULL;
    self->graph = NULL;
}

static int graph_traverse(mg_graph *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->stream_obj);
    Py_VISIT(self->retained);
    return 0;
}

/* A capturing graph is never garbage (this thread's chain holds it), so
 * only a ready or discarded one gets here; it is discarded after, in case a
 * finalizer of its cycle still calls it. The handles go first: the retained
 * arrays' memory must outlive the executable graph. */
static int graph_clear(mg_graph *self)
{
    destroy_handles(self);
    self->state = GRAPH_DISCARDED;
    Py_CLEAR(self->retained);
    Py_CLEAR(self->stream_obj);
    return 0;
}

static void graph_dealloc(mg_graph *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    graph_clear(self);
    PyMem_Free(self->deferred);
    type->tp_free(self);
    Py_DECREF(type);
}

/* ---------------------------------------------------------------------- */
/* Capture                                                                 */
/* ---------------------------------------------------------------------- */

static PyObject *graph_enter(mg_graph *self, PyObject *unused)
{
    if (self->state != GRAPH_NEW)
        return state_error(self);
    PyObject *retained = PyDict_New();
    if (retained == NULL)
        return NULL;
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0) {
        Py_DECREF(retained);
        return NULL;
    }
    /* Thread-local: unsafe calls (allocating, freeing, synchronising) fail on
     * this thread only, while other threads go on using the GPU. */
    CUresult r = mg_cu.cuStreamBeginCapture(self->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuStreamBeginCapture") < 0) {
        Py_DECREF(retained);
        return NULL;
    }
    self->retained = retained;
    self->state = GRAPH_CAPTURING;
    self->outer = mg_graph_tls_capture;            /* the chain's reference moves to self */
    mg_graph_tls_capture = Py_NewRef((PyObject *)self);
    return Py_NewRef((PyObject *)self);
}

static void discard(mg_graph *self, CUgraph graph)
{
    if (graph != NULL) {
        int pushed = mg_cu_push_quietly(self->device);
        if (pushed >= 0) {
            mg_cu.cuGraphDestroy(graph);
            mg_cu_pop(pushed);
        }
    }
    self->state = GRAPH_DISCARDED;
    Py_CLEAR(self->retained);
}

/* Ends the capture, whatever happened in the block: an exception from it
 * discards the graph and propagates; otherwise the graph is instantiated,
 * or the capture's failure is raised as CudaError. The stream is usable
 * again in every case. */
static PyObject *graph_exit(mg_graph *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "__exit__ takes 3 arguments, got %zd", nargs);
    int raised = args[0] != Py_None;
    if (self->state != GRAPH_CAPTURING)
        return state_error(self);
    if (!unlink_capture(self))
        return mg_raise(PyExc_RuntimeError, "a graph's capture must end on the thread that began it");
    CUgraph graph = NULL;
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0) {
        flush_deferred(self);
        discard(self, NULL);
        return NULL;
    }
    CUresult r = mg_cu.cuStreamEndCapture(self->stream, &graph);
    mg_cu_pop(pushed);
    flush_deferred(self);
    if (raised || r != CUDA_SUCCESS) {
        discard(self, graph);
        if (raised)
            Py_RETURN_FALSE;   /* the block's exception says what went wrong */
        mg_cu_raise(r, "cuStreamEndCapture", r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ? NULL :
                    "a call during the capture failed (synchronising, allocating or freeing memory, "
                    "work on the legacy default stream): the graph is discarded, the stream usable again");
        return NULL;
    }
    if (mg_cu_push(self->device, &pushed) < 0) {
        discard(self, graph);
        return NULL;
    }
    r = mg_cu.cuGraphInstantiateWithFlags(&self->exec, graph, 0);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuGraphInstantiateWithFlags") < 0) {
        self->exec = NULL;
        discard(self, graph);
        return NULL;
    }
    self->graph = graph;
    self->state = GRAPH_READY;
    Py_RETURN_FALSE;
}

/* ---------------------------------------------------------------------- */
/* Replay                                                                  */
/* ---------------------------------------------------------------------- */

static PyObject *graph_replay(mg_graph *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", NULL};
    PyObject *stream_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:replay", keywords, &stream_arg))
        return NULL;
    if (self->state != GRAPH_READY)
        return state_error(self);
    CUstream stream = self->stream;
    PyObject *stream_obj = self->stream_obj;
    if (stream_arg != Py_None) {
        if (!mg_cu_stream_converter(stream_arg, &stream))
            return NULL;
        stream_obj = stream_arg;
    }
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return NULL;
    CUresult r;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuGraphLaunch(self->exec, stream);
    Py_END_ALLOW_THREADS
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuGraphLaunch") < 0)
        return NULL;
    /* Replayed into another capture, this graph's arrays must outlive that one too. */
    if (mg_graph_capturing() && mg_graph_retain((PyObject *)self) < 0)
        return NULL;
    /* Later host copies and exports of the graph's arrays order themselves after the replay. */
    Py_ssize_t position = 0;
    PyObject *key, *value;
    if (hooks.replayed != NULL)
        while (PyDict_Next(self->retained, &position, &key, &value))
            hooks.replayed(value, stream, stream_obj);
    Py_RETURN_NONE;
}

static PyObject *graph_get_num_nodes(mg_graph *self, void *closure)
{
    if (self->state != GRAPH_READY)
        return state_error(self);
    size_t count = 0;
    if (mg_cu_check(mg_cu.cuGraphGetNodes(self->graph, NULL, &count), "cuGraphGetNodes") < 0)
        return NULL;
    return PyLong_FromSize_t(count);
}

static PyObject *graph_get_ready(mg_graph *self, void *closure)
{
    return PyBool_FromLong(self->state == GRAPH_READY);
}

static PyObject *graph_get_capturing(mg_graph *self, void *closure)
{
    return PyBool_FromLong(self->state == GRAPH_CAPTURING);
}

static PyObject *graph_repr(mg_graph *self)
{
    static const char *names[] = {"new", "capturing", "ready", "discarded"};
    return PyUnicode_FromFormat("<mlirgpu.Graph %s, stream %p>", names[self->state], (void *)self->stream);
}

static PyMethodDef graph_methods[] = {
    {"__enter__", (PyCFunction)graph_enter, METH_NOARGS, "Begins capturing the stream's work (thread-local mode)."},
    {"__exit__", (PyCFunction)(void (*)(void))graph_exit, METH_FASTCALL,
     "Ends the capture and instantiates the graph; discards it when the block raised."},
    {"replay", (PyCFunction)(void (*)(void))graph_replay, METH_VARARGS | METH_KEYWORDS,
     "replay(stream=None): launches the captured work on `stream` (default: the capture's stream), not "
     "waited for."},
    {NULL},
};

static PyGetSetDef graph_getset[] = {
    {"num_nodes", (getter)graph_get_num_nodes, NULL, "The number of nodes (launches, copies, ...) captured.", NULL},
    {"ready", (getter)graph_get_ready, NULL, "True once captured and instantiated: replay() may be called.", NULL},
    {"capturing", (getter)graph_get_capturing, NULL, "True inside the with-block.", NULL},
    {NULL},
};

static PyMemberDef graph_members[] = {
    {"stream", T_OBJECT, offsetof(mg_graph, stream_obj), READONLY, "The stream the graph was captured on."},
    {"device", T_INT, offsetof(mg_graph, device), READONLY, NULL},
    {NULL},
};

static PyType_Slot graph_slots[] = {
    {Py_tp_doc, "Graph(stream=<a new non-blocking Stream>): `with g:` captures the work queued on `stream` "
                "into a CUDA graph, g.replay() runs it again. mlirgpu.graph() is the usual way to make one.\n\nFor example::\n\n"
                "    with mg.graph() as g:\n"
                "        kernel(x, grid=4, block=256, stream=g.stream)\n"
                "    g.replay()"},
    {Py_tp_new, graph_new},
    {Py_tp_dealloc, graph_dealloc},
    {Py_tp_traverse, graph_traverse},
    {Py_tp_clear, graph_clear},
    {Py_tp_repr, graph_repr},
    {Py_tp_methods, graph_methods},
    {Py_tp_getset, graph_getset},
    {Py_tp_members, graph_members},
    {0, NULL},
};

static PyType_Spec graph_spec = {
    .name = "mlirgpu.Graph",
    .basicsize = sizeof(mg_graph),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = graph_slots,
};

int mg_graph_init(PyObject *module)
{
    graph_type = mg_add_type(module, &graph_spec, NULL);   /* a strong ref for the life of the process */
    return graph_type == NULL ? -1 : 0;
}
