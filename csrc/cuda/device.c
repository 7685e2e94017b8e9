/* mlirgpu.cuda.Device and the mlirgpu.cuda module functions. */
#include "cuda/device.h"
#include "cuda/stream.h"

#include <stddef.h>
#include <stdint.h>
#include <structmember.h>

/* ---------------------------------------------------------------------- */
/* Device                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int ordinal;
    CUdevice handle;
} mg_device;

static PyTypeObject *device_type;

static PyObject *device_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"ordinal", NULL};
    int ordinal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|i:Device", keywords, &ordinal))
        return NULL;
    CUdevice handle;
    if (mg_cu_check_device(ordinal) < 0 || mg_cu_check(mg_cu.cuDeviceGet(&handle, ordinal), "cuDeviceGet") < 0)
        return NULL;
    mg_device *self = (mg_device *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->ordinal = ordinal;
    self->handle = handle;
    return (PyObject *)self;
}

static void device_dealloc(mg_device *self)
{
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static int device_attribute(mg_device *self, CUdevice_attribute attribute, int *value)
{
    return mg_cu_check(mg_cu.cuDeviceGetAttribute(value, attribute, self->handle), "cuDeviceGetAttribute");
}

/* Getter for an int attribute; the closure carries the CUdevice_attribute. */
static PyObject *device_get_int(mg_device *self, void *closure)
{
    int value;
    if (device_attribute(self, (CUdevice_attribute)(intptr_t)closure, &value) < 0)
        return NULL;
    return PyLong_FromLong(value);
}

static int device_capability(mg_device *self, int *major, int *minor)
{
    if (device_attribute(self, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, major) < 0 ||
        device_attribute(self, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, minor) < 0)
        return -1;
    return 0;
}

static PyObject *device_get_capability(mg_device *self, void *closure)
{
    int major, minor;
    if (device_capability(self, &major, &minor) < 0)
        return NULL;
    return Py_BuildValue("(ii)", major, minor);
}

/* sm_XY; Hopper (9.0) gets the arch-specific sm_90a, which wgmma needs. */
static PyObject *device_get_chip(mg_device *self, void *closure)
{
    int major, minor;
    if (device_capability(self, &major, &minor) < 0)
        return NULL;
    return PyUnicode_FromFormat("sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
}

static PyObject *device_get_name(mg_device *self, void *closure)
{
    char name[256];
    if (mg_cu_check(mg_cu.cuDeviceGetName(name, (int)sizeof name, self->handle), "cuDeviceGetName") < 0)
        return NULL;
    return PyUnicode_FromString(name);
}

static PyObject *device_get_total_memory(mg_device *self, void *closure)
{
    size_t bytes;
    if (mg_cu_check(mg_cu.cuDeviceTotalMem(&bytes, self->handle), "cuDeviceTotalMem") < 0)
        return NULL;
    return PyLong_FromSize_t(bytes);
}

static PyObject *device_mem_info(mg_device *self, PyObject *unused)
{
    int pushed;
    if (mg_cu_push(self->ordinal, &pushed) < 0)
        return NULL;
    size_t free_bytes = 0, total_bytes = 0;
    CUresult r = mg_cu.cuMemGetInfo(&free_bytes, &total_bytes);
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuMemGetInfo") < 0)
        return NULL;
    return Py_BuildValue("(nn)", (Py_ssize_t)free_bytes, (Py_ssize_t)total_bytes);
}

static PyObject *device_synchronize(mg_device *self, PyObject *unused)
{
    int pushed;
    if (mg_cu_push(self->ordinal, &pushed) < 0)
        return NULL;
    CUresult r;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuCtxSynchronize();
    Py_END_ALLOW_THREADS
    mg_cu_pop(pushed);
    if (mg_cu_check(r, "cuCtxSynchronize") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *device_make_current(mg_device *self, PyObject *unused)
{
    if (mg_cu_set_device(self->ordinal) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *device_repr(mg_device *self)
{
    return PyUnicode_FromFormat("mlirgpu.cuda.Device(%d)", self->ordinal);
}

static PyObject *device_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, device_type) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    int equal = ((mg_device *)a)->ordinal == ((mg_device *)b)->ordinal;
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static Py_hash_t device_hash(mg_device *self)
{
    return self->ordinal + 1;   /* -1 is reserved for errors */
}

#define DEVICE_INT(name, attribute, doc) \
    {name, (getter)device_get_int, NULL, doc, (void *)(intptr_t)(attribute)}

static PyGetSetDef device_getset[] = {
    {"name", (getter)device_get_name, NULL, "The product name.", NULL},
    {"compute_capability", (getter)device_get_capability, NULL, "(major, minor).", NULL},
    {"chip", (getter)device_get_chip, NULL,
     "The PTX target: sm_XY, and sm_90a for compute capability 9.0 (Hopper's wgmma needs it).", NULL},
    {"total_memory", (getter)device_get_total_memory, NULL, "Bytes of device memory.", NULL},
    DEVICE_INT("multiprocessor_count", CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "Number of SMs."),
    DEVICE_INT("max_threads_per_block", CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, NULL),
    DEVICE_INT("warp_size", CU_DEVICE_ATTRIBUTE_WARP_SIZE, NULL),
    DEVICE_INT("shared_memory_per_block", CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
               "Bytes of shared memory a block gets without opting in."),
    DEVICE_INT("shared_memory_per_block_optin", CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
               "Bytes a block may get after Function.set_max_dynamic_shared_memory."),
    DEVICE_INT("shared_memory_per_multiprocessor", CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, NULL),
    {NULL},
};

static PyMethodDef device_methods[] = {
    {"mem_info", (PyCFunction)device_mem_info, METH_NOARGS, "(free, total) bytes."},
    {"synchronize", (PyCFunction)device_synchronize, METH_NOARGS, "Blocks until all work on the device is done."},
    {"make_current", (PyCFunction)device_make_current, METH_NOARGS,
     "Makes this device the calling thread's device (like set_device)."},
    {NULL},
};

static PyMemberDef device_members[] = {
    {"ordinal", T_INT, offsetof(mg_device, ordinal), READONLY, NULL},
    {NULL},
};

static PyType_Slot device_slots[] = {
    {Py_tp_doc, "Device(ordinal=0): a CUDA device and its properties."},
    {Py_tp_new, device_new},
    {Py_tp_dealloc, device_dealloc},
    {Py_tp_repr, device_repr},
    {Py_tp_richcompare, device_richcompare},
    {Py_tp_hash, device_hash},
    {Py_tp_getset, device_getset},
    {Py_tp_methods, device_methods},
    {Py_tp_members, device_members},
    {0, NULL},
};

static PyType_Spec device_spec = {
    .name = "mlirgpu.cuda.Device",
    .basicsize = sizeof(mg_device),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = device_slots,
};

int mg_cu_device_converter(PyObject *obj, int *out)
{
    long ordinal;
    if (device_type != NULL && PyObject_TypeCheck(obj, device_type)) {
        ordinal = ((mg_device *)obj)->ordinal;
    }
    else if (PyLong_Check(obj) && !PyBool_Check(obj)) {
        ordinal = PyLong_AsLong(obj);
        if (ordinal == -1 && PyErr_Occurred())
            return 0;
    }
    else {
        PyErr_Format(PyExc_TypeError, "a device is an int ordinal or an mlirgpu.cuda.Device, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    if (ordinal < 0 || ordinal > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "device %ld does not exist", ordinal);
        return 0;
    }
    if (mg_cu_check_device((int)ordinal) < 0)
        return 0;
    *out = (int)ordinal;
    return 1;
}

/* ---------------------------------------------------------------------- */
/* Module-level functions                                                  */
/* ---------------------------------------------------------------------- */

static PyObject *cu_is_available(PyObject *module, PyObject *unused)
{
    if (mg_cu_load() < 0) {
        PyErr_Clear();   /* documented never to raise */
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(mg_cu_device_count() > 0);
}

static PyObject *cu_driver_version(PyObject *module, PyObject *unused)
{
    /* Works without a device: only the library is needed. */
    CUresult refused;
    if (mg_cu_load() < 0 && !mg_cu_init_refused(&refused))
        return NULL;
    PyErr_Clear();
    int version = 0;
    if (mg_cu_check(mg_cu.cuDriverGetVersion(&version), "cuDriverGetVersion") < 0)
        return NULL;
    return PyLong_FromLong(version);
}

static PyObject *cu_device_count(PyObject *module, PyObject *unused)
{
    if (mg_cu_load() < 0) {
        CUresult refused;
        if (!mg_cu_init_refused(&refused) || refused != CUDA_ERROR_NO_DEVICE)
            return NULL;
        PyErr_Clear();   /* a driver without devices: zero, not an error */
    }
    return PyLong_FromLong(mg_cu_device_count());
}

static PyObject *cu_set_device(PyObject *module, PyObject *arg)
{
    int ordinal;
    if (!mg_cu_device_converter(arg, &ordinal) || mg_cu_set_device(ordinal) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *cu_current_device(PyObject *module, PyObject *unused)
{
    return PyLong_FromLong(mg_cu_tls_device);
}

static PyObject *cu_synchronize(PyObject *module, PyObject *unused)
{
    if (mg_cu_ensure_context() < 0)
        return NULL;
    CUresult r;
    Py_BEGIN_ALLOW_THREADS
    r = mg_cu.cuCtxSynchronize();
    Py_END_ALLOW_THREADS
    if (mg_cu_check(r, "cuCtxSynchronize") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef cu_functions[] = {
    {"is_available", cu_is_available, METH_NOARGS,
     "True when a CUDA driver loads, initializes, and sees at least one device. Never raises."},
    {"driver_version", cu_driver_version, METH_NOARGS, "The driver's CUDA version, e.g. 12080."},
    {"device_count", cu_device_count, METH_NOARGS, "Number of CUDA devices."},
    {"set_device", cu_set_device, METH_O,
     "set_device(device): the calling thread's device (an ordinal or a Device) from now on."},
    {"current_device", cu_current_device, METH_NOARGS, "The calling thread's device ordinal (0 by default)."},
    {"synchronize", cu_synchronize, METH_NOARGS, "Blocks until all work on the current device is done."},
    {NULL},
};

int mg_cu_init(PyObject *module)
{
    if (mg_cu_stream_init(module) < 0)
        return -1;
    /* A strong ref kept in a static: the module exists once per process. */
    if ((device_type = mg_add_type(module, &device_spec, NULL)) == NULL)
        return -1;
    return PyModule_AddFunctions(module, cu_functions);
}
