/* mlirgpu.Stream and mlirgpu.Event, and the stream= converter every area
 * uses. */
#include "cuda/stream.h"

#include <stddef.h>
#include <stdint.h>
#include <structmember.h>

/* ---------------------------------------------------------------------- */
/* Interned strings (made once at init)                                    */
/* ---------------------------------------------------------------------- */

static PyObject *str_cuda_stream_protocol, *str_cuda_stream, *str_ptr;

/* Gets attribute `name` of `obj`: 1 with *out set, 0 when absent, -1 on error. */
static int get_optional_attr(PyObject *obj, PyObject *name, PyObject **out)
{
    *out = PyObject_GetAttr(obj, name);
    if (*out != NULL)
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Stream                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    CUstream handle;
    int device;        /* -1 for the legacy default stream: every device has one */
    int owned;         /* destroyed at dealloc */
    char non_blocking; /* a char: read through T_BOOL */
} mg_stream;

PyTypeObject *mg_cu_Stream_type;
static PyObject *default_stream;

/* An int stream handle: 0 and 1 are the legacy default stream, 2 the
 * per-thread default stream, anything else a CUstream pointer. */
static int stream_from_int(PyObject *value, CUstream *out)
{
    if (PyBool_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "stream must be a stream or an int handle, not bool");
        return 0;
    }
    unsigned long long handle = PyLong_AsUnsignedLongLong(value);
    if (handle == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "stream handle %R is not a pointer value", value);
        }
        return 0;
    }
    *out = handle <= 1 ? NULL : (CUstream)(uintptr_t)handle;
    return 1;
}


int mg_cu_stream_converter(PyObject *obj, CUstream *out)
{
    if (obj == Py_None) {
        *out = NULL;
        return 1;
    }
    if (PyObject_TypeCheck(obj, mg_cu_Stream_type)) {
        *out = ((mg_stream *)obj)->handle;
        return 1;
    }
    if (PyLong_Check(obj))
        return stream_from_int(obj, out);

    PyObject *attr = NULL, *value = NULL;
    int ok = 0, found;
    /* The CUDA stream protocol: __cuda_stream__() -> (version 0, handle). */
    if ((found = get_optional_attr(obj, str_cuda_stream_protocol, &attr)) < 0)
        goto error;
    if (found) {
        value = PyCallable_Check(attr) ? PyObject_CallNoArgs(attr) : Py_NewRef(attr);
        if (value == NULL)
            goto error;
        if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 2 ||
            !PyLong_Check(PyTuple_GET_ITEM(value, 1))) {
            PyErr_Format(PyExc_TypeError, "%.100s.__cuda_stream__() must return (version, handle), got %R",
                         Py_TYPE(obj)->tp_name, value);
            goto error;
        }
        ok = stream_from_int(PyTuple_GET_ITEM(value, 1), out);
        goto error;
    }
    /* torch.cuda.Stream. */
    if ((found = get_optional_attr(obj, str_cuda_stream, &attr)) < 0)
        goto error;
    if (found && PyLong_Check(attr)) {
        ok = stream_from_int(attr, out);
        goto error;
    }
    Py_CLEAR(attr);
    /* cupy.cuda.Stream / ExternalStream; the class name guards against
     * taking some array's .ptr for a stream. */
    const char *type_name = Py_TYPE(obj)->tp_name;
    size_t length = strlen(type_name);
    if (length >= 6 && strcmp(type_name + length - 6, "Stream") == 0) {
        if ((found = get_optional_attr(obj, str_ptr, &attr)) < 0)
            goto error;
        if (found && PyLong_Check(attr)) {
            ok = stream_from_int(attr, out);
            goto error;
        }
    }
    PyErr_Format(PyExc_TypeError,
                 "stream must be None, an mlirgpu.Stream, an int handle or an object with "
                 "__cuda_stream__ or cuda_stream, not %.100s", Py_TYPE(obj)->tp_name);
error:
    Py_XDECREF(attr);
    Py_XDECREF(value);
    return ok;
}

int mg_cu_stream_device(PyObject *obj)
{
    if (obj != NULL && PyObject_TypeCheck(obj, mg_cu_Stream_type) && ((mg_stream *)obj)->device >= 0)
        return ((mg_stream *)obj)->device;
    return mg_cu_tls_device;
}

static PyObject *stream_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"non_blocking", NULL};
    int non_blocking = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:Stream", keywords, &non_blocking))
        return NULL;
    if (mg_cu_ensure_context() < 0)
        return NULL;
    CUstream handle;
    if (mg_cu_check(mg_cu.cuStreamCreate(&handle, non_blocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT),
                    "cuStreamCreate") < 0)
        return NULL;
    mg_stream *self = (mg_stream *)type->tp_alloc(type, 0);
    if (self == NULL) {
        mg_cu.cuStreamDestroy(handle);
        return NULL;
    }
    self->handle = handle;
    self->device = mg_cu_tls_device;
    self->owned = 1;
    self->non_blocking = (char)non_blocking;
    return (PyObject *)self;
}

static void stream_dealloc(mg_stream *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (self->owned) {
        int pushed = mg_cu_push_quietly(self->device);
        if (pushed >= 0) {
            /* Pending work still completes; the driver frees the stream after. */
            mg_cu.cuStreamDestroy(self->handle);
            mg_cu_pop(pushed);
        }
    }
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *stream_synchronize(mg_stream *self, PyObject *unused)
{
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return NULL;
    CUresult r;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuStreamSynchronize(self->handle);
    Py_END_ALLOW_THREADS
    mg_cu_pop(pushed);
    if (r != CUDA_SUCCESS) {
        mg_cu_raise_on(r, "cuStreamSynchronize", NULL, &self->handle);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *stream_query(mg_stream *self, PyObject *unused)
{
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return NULL;
    CUresult r = mg_cu.cuStreamQuery(self->handle);
    mg_cu_pop(pushed);
    if (r == CUDA_ERROR_NOT_READY)
        Py_RETURN_FALSE;
    if (mg_cu_check(r, "cuStreamQuery") < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyTypeObject *event_type;

typedef struct {
    PyObject_HEAD
    CUevent handle;
    int device;
    char timing;       /* a char: read through T_BOOL */
    int recorded;
} mg_event;

static PyObject *stream_wait(mg_stream *self, PyObject *event)
{
    if (!PyObject_TypeCheck(event, event_type))
        return PyErr_Format(PyExc_TypeError, "Stream.wait takes an mlirgpu.Event, not %.100s",
                            Py_TYPE(event)->tp_name);
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return NULL;
    CUresult r = mg_cu.cuStreamWaitEvent(self->handle, ((mg_event *)event)->handle, 0);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuStreamWaitEvent") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *stream_handle_object(CUstream handle)
{
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)handle);
}

static PyObject *stream_get_handle(mg_stream *self, void *closure)
{
    return stream_handle_object(self->handle);
}

static PyObject *stream_cuda_stream(mg_stream *self, PyObject *unused)
{
    return Py_BuildValue("(iN)", 0, stream_handle_object(self->handle));
}

static PyObject *stream_repr(mg_stream *self)
{
    if (self->handle == NULL)
        return PyUnicode_FromString("<mlirgpu.Stream legacy default>");
    return PyUnicode_FromFormat("<mlirgpu.Stream %p on device %d%s>", (void *)self->handle,
                                self->device, self->non_blocking ? ", non-blocking" : "");
}

static PyMethodDef stream_methods[] = {
    {"synchronize", (PyCFunction)stream_synchronize, METH_NOARGS, "Blocks until the stream's work is done."},
    {"query", (PyCFunction)stream_query, METH_NOARGS, "True when the stream's work is done."},
    {"wait", (PyCFunction)stream_wait, METH_O, "Makes later work on this stream wait for `event`."},
    {"__cuda_stream__", (PyCFunction)stream_cuda_stream, METH_NOARGS, "CUDA stream protocol: (0, handle)."},
    {NULL},
};

static PyGetSetDef stream_getset[] = {
    {"handle", (getter)stream_get_handle, NULL, "The CUstream as an int (0: legacy default).", NULL},
    {NULL},
};

static PyMemberDef stream_members[] = {
    {"device", T_INT, offsetof(mg_stream, device), READONLY, "CUDA ordinal (-1 for the default stream)."},
    {"non_blocking", T_BOOL, offsetof(mg_stream, non_blocking), READONLY, NULL},
    {NULL},
};

static PyType_Slot stream_slots[] = {
    {Py_tp_doc, "Stream(non_blocking=False): a CUDA stream of the current device. Work on one stream runs "
                "in order; work on two may overlap.\n\nFor example::\n\n"
                "    s = mg.Stream()\n"
                "    kernel(x, grid=4, block=256, stream=s)\n"
                "    s.synchronize()"},
    {Py_tp_new, stream_new},
    {Py_tp_dealloc, stream_dealloc},
    {Py_tp_repr, stream_repr},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {Py_tp_members, stream_members},
    {0, NULL},
};

static PyType_Spec stream_spec = {
    .name = "mlirgpu.Stream",
    .basicsize = sizeof(mg_stream),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = stream_slots,
};

/* ---------------------------------------------------------------------- */
/* Event                                                                   */
/* ---------------------------------------------------------------------- */

static PyObject *event_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"timing", NULL};
    int timing = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:Event", keywords, &timing))
        return NULL;
    if (mg_cu_ensure_context() < 0)
        return NULL;
    CUevent handle;
    if (mg_cu_check(mg_cu.cuEventCreate(&handle, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
                    "cuEventCreate") < 0)
        return NULL;
    mg_event *self = (mg_event *)type->tp_alloc(type, 0);
    if (self == NULL) {
        mg_cu.cuEventDestroy(handle);
        return NULL;
    }
    self->handle = handle;
    self->device = mg_cu_tls_device;
    self->timing = (char)timing;
    return (PyObject *)self;
}

static void event_dealloc(mg_event *self)
{
    PyTypeObject *type = Py_TYPE(self);
    int pushed = mg_cu_push_quietly(self->device);
    if (pushed >= 0) {
        mg_cu.cuEventDestroy(self->handle);
        mg_cu_pop(pushed);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *event_record(mg_event *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stream", NULL};
    CUstream stream = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:record", keywords, mg_cu_stream_converter, &stream))
        return NULL;
    int pushed;
    if (mg_cu_push(self->device, &pushed) < 0)
        return NULL;
    CUresult r = mg_cu.cuEventRecord(self->handle, stream);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuEventRecord") < 0)
        return NULL;
    self->recorded = 1;
    Py_RETURN_NONE;
}

static PyObject *event_synchronize(mg_event *self, PyObject *unused)
{
    CUresult r;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuEventSynchronize(self->handle);
    Py_END_ALLOW_THREADS
    if (mg_cu_check(r, "cuEventSynchronize") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *event_query(mg_event *self, PyObject *unused)
{
    CUresult r = mg_cu.cuEventQuery(self->handle);
    if (r == CUDA_ERROR_NOT_READY)
        Py_RETURN_FALSE;
    if (mg_cu_check(r, "cuEventQuery") < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *event_elapsed_time(mg_event *self, PyObject *end)
{
    if (!PyObject_TypeCheck(end, event_type))
        return PyErr_Format(PyExc_TypeError, "elapsed_time takes an mlirgpu.Event, not %.100s",
                            Py_TYPE(end)->tp_name);
    mg_event *other = (mg_event *)end;
    /* The driver's answer for an unrecorded event varies by version; say it plainly. */
    if (!self->recorded || !other->recorded) {
        mg_cu_raise(CUDA_ERROR_INVALID_HANDLE, "Event.elapsed_time",
                    !self->recorded ? "the start event was never recorded" : "the end event was never recorded");
        return NULL;
    }
    float milliseconds = 0.0f;
    if (mg_cu_check(mg_cu.cuEventElapsedTime(&milliseconds, self->handle, other->handle),
                    "cuEventElapsedTime") < 0)
        return NULL;
    return PyFloat_FromDouble(milliseconds);
}

static PyObject *event_get_handle(mg_event *self, void *closure)
{
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)self->handle);
}

static PyMethodDef event_methods[] = {
    {"record", (PyCFunction)(void (*)(void))event_record, METH_VARARGS | METH_KEYWORDS,
     "record(stream=None): captures the work queued on `stream` so far."},
    {"synchronize", (PyCFunction)event_synchronize, METH_NOARGS, "Blocks until the event fires."},
    {"query", (PyCFunction)event_query, METH_NOARGS, "True when the event has fired."},
    {"elapsed_time", (PyCFunction)event_elapsed_time, METH_O,
     "elapsed_time(end): milliseconds from this event to `end` (both recorded and fired)."},
    {NULL},
};

static PyGetSetDef event_getset[] = {
    {"handle", (getter)event_get_handle, NULL, "The CUevent as an int.", NULL},
    {NULL},
};

static PyMemberDef event_members[] = {
    {"device", T_INT, offsetof(mg_event, device), READONLY, NULL},
    {"timing", T_BOOL, offsetof(mg_event, timing), READONLY, NULL},
    {NULL},
};

static PyType_Slot event_slots[] = {
    {Py_tp_doc, "Event(timing=True): a CUDA event of the current device: a point in a stream, to wait "
                "for or to time.\n\nFor example::\n\n"
                "    start, end = mg.Event(), mg.Event()\n"
                "    start.record(s); kernel(x, grid=4, block=256, stream=s); end.record(s)\n"
                "    end.synchronize()\n"
                "    start.elapsed_time(end)      # milliseconds"},
    {Py_tp_new, event_new},
    {Py_tp_dealloc, event_dealloc},
    {Py_tp_methods, event_methods},
    {Py_tp_getset, event_getset},
    {Py_tp_members, event_members},
    {0, NULL},
};

static PyType_Spec event_spec = {
    .name = "mlirgpu.Event",
    .basicsize = sizeof(mg_event),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = event_slots,
};


static int intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

int mg_cu_stream_init(PyObject *module)
{
    if (intern(&str_cuda_stream_protocol, "__cuda_stream__") < 0 ||
        intern(&str_cuda_stream, "cuda_stream") < 0 || intern(&str_ptr, "ptr") < 0)
        return -1;
    /* Strong refs kept in statics: the module exists once per process. */
    if ((mg_cu_Stream_type = mg_add_type(module, &stream_spec, NULL)) == NULL ||
        (event_type = mg_add_type(module, &event_spec, NULL)) == NULL)
        return -1;
    /* The legacy default stream needs no driver call to exist. */
    mg_stream *stream = (mg_stream *)mg_cu_Stream_type->tp_alloc(mg_cu_Stream_type, 0);
    if (stream == NULL)
        return -1;
    stream->device = -1;   /* handle NULL, not owned */
    default_stream = (PyObject *)stream;
    if (PyModule_AddObjectRef(module, "default_stream", default_stream) < 0)
        return -1;
    return 0;
}
