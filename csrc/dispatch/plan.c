/* mlirgpu.LaunchPlan (dispatch/plan.h): a library call's launch, kept for
 * a Dispatcher to run from C. */
#include "dispatch/plan.h"
#include "cuda/driver.h"
#include "cuda/stream.h"
#include "launch/tensor_map.h"

#include <string.h>
#include <structmember.h>

enum { SLOT_ARG, SLOT_MAP, SLOT_VALUE, SLOT_VIEW };

typedef struct {
    int kind;
    Py_ssize_t index;    /* SLOT_ARG, SLOT_MAP, SLOT_VIEW: the call's argument */
    PyObject *object;    /* strong: SLOT_MAP's template map, SLOT_VALUE's value */
    PyObject *kept;      /* strong, SLOT_MAP: the map last made, at its address (or NULL) */
    mg_cu_extents extents;   /* SLOT_VIEW: the extents the kernel is passed */
} plan_slot;

typedef struct {
    PyObject_HEAD
    PyObject *function;                  /* strong: an mlirgpu Function */
    mg_cu_launch_config config;          /* grid, block, shared memory, cluster; the stream per call */
    PyObject *stream_getter;             /* strong: a builtin returning the stream, called with stream_argument */
    PyObject *stream_argument;           /* strong */
    CUstream stream;                     /* without a getter, the stream of every launch */
    int bound;                           /* only launches on bound_stream take the plan */
    CUstream bound_stream;
    int capture;                         /* whether a launch into a capturing stream takes the plan */
    Py_ssize_t result;                   /* the call's argument returned, or -1: None */
    PyObject *then;                      /* strong: a LaunchPlan run next on the same stream, or NULL */
    PyObject *lock;                      /* strong: held (acquire(False), release()) around the plans, or NULL */
    Py_ssize_t nslots;
    plan_slot slots[MG_CU_MAX_ARGS];
} mg_launch_plan;

PyTypeObject *mg_LaunchPlan_type;

/* One entry of params into `slot`: 0, or -1 with the error set. */
static int parse_slot(PyObject *entry, Py_ssize_t j, plan_slot *slot)
{
    static const char *kinds[] = {"arg", "map", "value", "view"};
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 0)))
        goto wrong;
    int kind = -1;
    for (int k = 0; k < 4; k++)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(entry, 0), kinds[k]) == 0)
            kind = k;
    Py_ssize_t size = PyTuple_GET_SIZE(entry);
    if (kind < 0 || size != (kind == SLOT_MAP || kind == SLOT_VIEW ? 3 : 2))
        goto wrong;
    slot->kind = kind;
    if (kind == SLOT_VALUE) {
        slot->object = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
        return 0;
    }
    slot->index = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 1));
    if (slot->index == -1 && PyErr_Occurred())
        return -1;
    if (slot->index < 0 || slot->index >= MG_CU_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "params[%zd] names argument %zd, not one of 0 to %d", j, slot->index,
                     MG_CU_MAX_ARGS - 1);
        return -1;
    }
    if (kind == SLOT_MAP) {
        PyObject *map = PyTuple_GET_ITEM(entry, 2);
        if (!Py_IS_TYPE(map, mg_cu_TensorMap_type) || ((mg_tensor_map *)map)->host) {
            PyErr_Format(PyExc_TypeError, "params[%zd]: a map entry's template is a TensorMap made for the GPU, "
                         "not %.100s", j, Py_TYPE(map)->tp_name);
            return -1;
        }
        slot->object = Py_NewRef(map);
        slot->kept = Py_NewRef(map);   /* at the address of the array it was made for */
    }
    if (kind == SLOT_VIEW) {
        PyObject *shape = PyTuple_GET_ITEM(entry, 2);
        Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
        if (ndim < 1 || ndim > (Py_ssize_t)(sizeof slot->extents / sizeof *slot->extents)) {
            PyErr_Format(PyExc_ValueError, "params[%zd]: a view's shape is a tuple of 1 to 8 extents, not %R", j,
                         shape);
            return -1;
        }
        for (Py_ssize_t d = 0; d < ndim; d++) {
            slot->extents[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (slot->extents[d] < 0) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "params[%zd]: a view's extents are ints >= 0, not %R", j, shape);
                return -1;
            }
        }
    }
    return 0;
wrong:
    PyErr_Format(PyExc_TypeError, "params[%zd] is (\"arg\", i), (\"map\", i, template), (\"view\", i, shape) or "
                 "(\"value\", v), not %R", j, entry);
    return -1;
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"function", "params", "grid", "block", "shared_mem", "cluster", "stream",
                               "stream_only", "capture", "result", "then", "lock", NULL};
    PyObject *function, *params, *grid, *block, *shared_mem = NULL, *cluster = Py_None, *stream = Py_None;
    PyObject *only = Py_None, *result = Py_None, *then = Py_None, *lock = Py_None;
    int capture = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO|OOOOpOOO:LaunchPlan", keywords, &function, &PyTuple_Type,
                                     &params, &grid, &block, &shared_mem, &cluster, &stream, &only, &capture,
                                     &result, &then, &lock))
        return NULL;
    if (then != Py_None && !Py_IS_TYPE(then, type))
        return PyErr_Format(PyExc_TypeError, "then is a LaunchPlan, not %.100s", Py_TYPE(then)->tp_name);
    if (lock != Py_None) {
        /* Taken after the call's arguments are read, as the stream is: by builtin code only, which runs
         * no Python code that could free what their pointers point to (a threading.Lock's). */
        PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
        int builtin = acquire != NULL && PyCFunction_Check(acquire);
        Py_XDECREF(acquire);
        if (!builtin) {
            PyErr_Clear();
            return PyErr_Format(PyExc_TypeError, "lock is a lock whose acquire() is builtin (a threading.Lock), "
                                "not %.100s", Py_TYPE(lock)->tp_name);
        }
    }
    if (!Py_IS_TYPE(function, mg_cu_Function_type))
        return PyErr_Format(PyExc_TypeError, "a LaunchPlan launches an mlirgpu Function, not %.100s",
                            Py_TYPE(function)->tp_name);
    Py_ssize_t nslots = PyTuple_GET_SIZE(params);
    int nparams = mg_cu_function_nparams(function);
    if (nslots > MG_CU_MAX_ARGS || (nparams >= 0 && nslots != nparams))
        return PyErr_Format(PyExc_ValueError, "params has %zd entries, the function takes %d parameters", nslots,
                            nparams >= 0 ? nparams : MG_CU_MAX_ARGS);
    mg_launch_plan *self = (mg_launch_plan *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->function = Py_NewRef(function);
    self->then = then != Py_None ? Py_NewRef(then) : NULL;
    self->lock = lock != Py_None ? Py_NewRef(lock) : NULL;
    self->result = -1;
    self->capture = capture;
    for (Py_ssize_t j = 0; j < nslots; j++) {
        if (parse_slot(PyTuple_GET_ITEM(params, j), j, &self->slots[j]) < 0)
            goto error;
        self->nslots = j + 1;
    }
    /* The launch configuration, read as a launch's keywords are. */
    PyObject *names = Py_BuildValue("(ssss)", "grid", "block", "shared_mem", "cluster");
    if (names == NULL)
        goto error;
    PyObject *values[] = {grid, block, shared_mem != NULL ? shared_mem : PyLong_FromLong(0), cluster};
    int parsed = values[2] != NULL ? mg_cu_launch_config_parse(values, names, &self->config) : -1;
    if (shared_mem == NULL)
        Py_XDECREF(values[2]);
    Py_DECREF(names);
    if (parsed < 0)
        goto error;
    if (PyTuple_Check(stream)) {
        if (PyTuple_GET_SIZE(stream) != 2 || !PyCFunction_Check(PyTuple_GET_ITEM(stream, 0))) {
            PyErr_SetString(PyExc_TypeError, "stream is None, a stream, or (getter, argument) with getter a "
                            "builtin function returning the stream");
            goto error;
        }
        /* A builtin: calling it runs no Python code that could free what the call's pointers point to. */
        self->stream_getter = Py_NewRef(PyTuple_GET_ITEM(stream, 0));
        self->stream_argument = Py_NewRef(PyTuple_GET_ITEM(stream, 1));
    }
    else if (!mg_cu_stream_converter(stream, &self->stream)) {
        goto error;
    }
    if (only != Py_None) {
        self->bound = 1;
        if (!mg_cu_stream_converter(only, &self->bound_stream))
            goto error;
    }
    if (result != Py_None) {
        self->result = PyLong_AsSsize_t(result);
        if (self->result == -1 && PyErr_Occurred())
            goto error;
        if (self->result < 0 || self->result >= MG_CU_MAX_ARGS) {
            PyErr_Format(PyExc_ValueError, "result names argument %zd, not one of 0 to %d", self->result,
                         MG_CU_MAX_ARGS - 1);
            goto error;
        }
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

/* Whether `self` takes a launch on `stream` with the call's arguments: 1 or 0. */
static int applies(const mg_launch_plan *self, CUstream stream, Py_ssize_t nargs, const mg_cu_read_args *read)
{
    /* Its values (workspaces) serve one stream; a capture keeps the addresses of what it was given. */
    if ((self->bound && stream != self->bound_stream) || (!self->capture && mg_cu_stream_capturing(stream)))
        return 0;
    if (self->result >= nargs)
        return 0;
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        const plan_slot *slot = &self->slots[j];
        /* Not this plan's arguments: the slow path says what is wrong with them. */
        if (slot->kind != SLOT_VALUE &&
            (slot->index >= nargs || (slot->kind != SLOT_ARG && !(read->known >> slot->index & 1))))
            return 0;
    }
    return 1;
}

/* Launches `self`'s kernel on `stream` with the call's arguments (applies() said
 * it takes them): 0, or -1 with the error set. */
static int launch(mg_launch_plan *self, PyObject *const *args, const mg_cu_read_args *read, CUstream stream)
{
    mg_cu_launch_config c = self->config;
    c.stream = stream;
    PyObject *kernel_args[MG_CU_MAX_ARGS] = {NULL}, *maps[MG_CU_MAX_ARGS];
    int nmaps = 0, status = -1;
    mg_cu_read_args known;
    known.known = known.readonly = 0;
    known.nwaits = read->nwaits;
    memcpy(known.waits, read->waits, (size_t)read->nwaits * sizeof *read->waits);
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        plan_slot *slot = &self->slots[j];
        Py_ssize_t i = slot->index;
        if (slot->kind == SLOT_VALUE) {
            kernel_args[j] = slot->object;
        }
        else if (slot->kind == SLOT_MAP) {
            /* A map of argument i: the one made last where the array is where it was then. */
            CUdeviceptr address = read->pointers[i];
            PyObject *map = slot->kept;
            if (map != NULL && ((mg_tensor_map *)map)->address == address) {
                Py_INCREF(map);
            }
            else {
                map = mg_tensor_map_at(slot->object, address);
                if (map == NULL)
                    goto done;
                Py_XSETREF(slot->kept, Py_NewRef(map));
            }
            maps[nmaps++] = map;
            kernel_args[j] = map;
        }
        else {
            kernel_args[j] = args[i];
            if (slot->kind == SLOT_VIEW || (read->known >> i & 1)) {
                known.known |= (uint64_t)1 << j;
                known.readonly |= (read->readonly >> i & 1) << j;
                known.pointers[j] = read->pointers[i];
                memcpy(known.shapes[j], slot->kind == SLOT_VIEW ? slot->extents : read->shapes[i],
                       sizeof known.shapes[j]);
            }
        }
    }
    PyObject *launched = mg_cu_function_launch_known(self->function, kernel_args, self->nslots, NULL, &c, &known);
    if (launched != NULL) {
        Py_DECREF(launched);
        status = 0;
    }
done:
    for (int m = 0; m < nmaps; m++)
        Py_DECREF(maps[m]);
    return status;
}

int mg_launch_plan_call(PyObject *plan, PyObject *const *args, Py_ssize_t nargs, const mg_cu_read_args *read,
                        PyObject **result)
{
    mg_launch_plan *self = (mg_launch_plan *)plan;
    CUstream stream = self->stream;
    if (self->stream_getter != NULL) {
        PyObject *got = PyObject_CallOneArg(self->stream_getter, self->stream_argument);
        int converted = got != NULL && mg_cu_stream_converter(got, &stream);
        Py_XDECREF(got);
        if (!converted)
            return -1;
    }
    for (const mg_launch_plan *p = self; p != NULL; p = (const mg_launch_plan *)p->then)
        if (!applies(p, stream, nargs, read))
            return 0;
    if (self->lock != NULL) {
        /* Without waiting, which would release the GIL while the call's pointers are held: a lock
         * another thread holds sends this call to the slow path, which waits for it. */
        PyObject *taken = PyObject_CallMethod(self->lock, "acquire", "O", Py_False);
        int held = taken != NULL ? PyObject_IsTrue(taken) : -1;
        Py_XDECREF(taken);
        if (held <= 0)
            return held;
    }
    int status = 0;
    for (mg_launch_plan *p = self; p != NULL && status == 0; p = (mg_launch_plan *)p->then)
        status = launch(p, args, read, stream);
    if (self->lock != NULL) {
        /* Released whatever happened; a launch's error is the one raised. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *released = PyObject_CallMethod(self->lock, "release", NULL);
        if (released == NULL && type != NULL)
            PyErr_Clear();
        if (released == NULL)
            status = -1;
        Py_XDECREF(released);
        if (type != NULL)
            PyErr_Restore(type, value, traceback);
    }
    if (status < 0)
        return -1;
    *result = Py_NewRef(self->result >= 0 ? args[self->result] : Py_None);
    return 1;
}

static int plan_traverse(mg_launch_plan *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->function);
    Py_VISIT(self->stream_getter);
    Py_VISIT(self->stream_argument);
    Py_VISIT(self->then);
    Py_VISIT(self->lock);
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        Py_VISIT(self->slots[j].object);
        Py_VISIT(self->slots[j].kept);
    }
    return 0;
}

static int plan_clear(mg_launch_plan *self)
{
    Py_CLEAR(self->function);
    Py_CLEAR(self->stream_getter);
    Py_CLEAR(self->stream_argument);
    Py_CLEAR(self->then);
    Py_CLEAR(self->lock);
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        Py_CLEAR(self->slots[j].object);
        Py_CLEAR(self->slots[j].kept);
    }
    return 0;
}

static void plan_dealloc(mg_launch_plan *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    plan_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMemberDef plan_members[] = {
    {"function", T_OBJECT, offsetof(mg_launch_plan, function), READONLY, "The Function it launches."},
    {NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_doc, "LaunchPlan(function, params, grid, block, shared_mem=0, cluster=None, stream=None, "
                "stream_only=None, capture=True, result=None, then=None, lock=None): a launch of `function` "
                "that a Dispatcher it is registered with (Dispatcher.register(args, plan)) runs from C for "
                "calls of that signature. params holds one entry per kernel parameter: (\"arg\", i) passes "
                "the call's argument i, (\"map\", i, template) a tensor map of argument i's array encoded as "
                "`template` (a GPU TensorMap of an array of the same geometry; the map last made is kept "
                "while the array stays where it is), (\"view\", i, shape) argument i's array as an array of "
                "`shape` (a reshape of it), (\"value\", v) passes v. `stream`: the stream of every "
                "launch, or (getter, argument), a builtin function whose getter(argument) is the stream of "
                "each launch (torch._C._cuda_getCurrentRawStream, device). `stream_only`: calls on another "
                "stream miss (the plan's values belong to that one); capture=False: calls into a capturing "
                "stream miss. `then`: a LaunchPlan launched next, on the same stream, for the same call "
                "(the checks of each come first). `lock`: a lock (threading.Lock) held around the launches, "
                "taken without waiting: a call that finds it held misses. A call returns its argument "
                "`result`, or None."},
    {Py_tp_new, plan_new},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_traverse, plan_traverse},
    {Py_tp_clear, plan_clear},
    {Py_tp_members, plan_members},
    {0, NULL},
};

static PyType_Spec plan_spec = {
    .name = "mlirgpu.LaunchPlan",
    .basicsize = sizeof(mg_launch_plan),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = plan_slots,
};

int mg_launch_plan_init(PyObject *module)
{
    mg_LaunchPlan_type = mg_add_type(module, &plan_spec, NULL);
    return mg_LaunchPlan_type == NULL ? -1 : 0;
}
