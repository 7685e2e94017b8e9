/* Pinned host memory: pinned_empty and pinned_zeros (cuMemHostAlloc). */
#include "arrays/array.h"
#include "cuda/driver.h"
#include "cuda/device.h"
#include "cuda/stream.h"
#include "arrays/dlpack.h"
#include "cuda/graph.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "base/numpy_api.h"
#include "arrays/array_shared.h"
/* ---------------------------------------------------------------------- */
/* Pinned host memory                                                      */
/* ---------------------------------------------------------------------- */

/* The base object of the NumPy arrays pinned_empty returns: NumPy frees it
 * with the last array (view) on the memory, and it frees the memory. */
typedef struct {
    PyObject_HEAD
    void *ptr;          /* from cuMemHostAlloc (portable: every context may use it) */
    Py_ssize_t nbytes;
    int device;         /* the device whose context allocated it, and frees it */
} mg_pinned;

PyTypeObject *mg_arrays_pinned_type;

static void pinned_dealloc(mg_pinned *self)
{
    PyTypeObject *type = Py_TYPE(self);
    mg_cu_free_host_quietly(self->ptr, self->device);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *pinned_get_ptr(mg_pinned *self, void *closure)
{
    return PyLong_FromVoidPtr(self->ptr);
}

static PyObject *pinned_repr(mg_pinned *self)
{
    return PyUnicode_FromFormat("<mlirgpu.PinnedMemory %zd bytes at %p>", self->nbytes, self->ptr);
}

static PyGetSetDef pinned_getset[] = {
    {"ptr", (getter)pinned_get_ptr, NULL, "The host address.", NULL},
    {NULL},
};

static PyMemberDef pinned_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(mg_pinned, nbytes), READONLY, NULL},
    {"device", T_INT, offsetof(mg_pinned, device), READONLY, "The device whose context allocated it."},
    {NULL},
};

static PyType_Slot pinned_slots[] = {
    {Py_tp_doc, "Page-locked host memory (cuMemHostAlloc): the base of an array from mlirgpu.pinned_empty; "
                "freed with cuMemFreeHost when the last array on it dies."},
    {Py_tp_dealloc, pinned_dealloc},
    {Py_tp_repr, pinned_repr},
    {Py_tp_getset, pinned_getset},
    {Py_tp_members, pinned_members},
    {0, NULL},
};

PyType_Spec mg_arrays_pinned_spec = {
    .name = "mlirgpu.PinnedMemory",
    .basicsize = sizeof(mg_pinned),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = pinned_slots,
};

/* pinned_empty/pinned_zeros: a NumPy array in page-locked memory. With
 * `host` (the CPU backend's), and for zero bytes, ordinary NumPy memory. */
static PyObject *pinned_allocate(PyObject *args, PyObject *kwargs, const char *format, int zero)
{
    static char *keywords[] = {"shape", "dtype", "host", NULL};
    PyObject *shape_obj;
    mg_dtype *dtype = mg_arrays_dtypes[MG_DT_F32];
    int host = 0, ndim;
    Py_ssize_t shape[MG_MAX_NDIM], strides[MG_MAX_NDIM], size;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &shape_obj, mg_dtype_converter, &dtype, &host))
        return NULL;
    if (mg_arrays_parse_shape(shape_obj, &ndim, shape) < 0 || mg_arrays_c_strides(ndim, shape, dtype->itemsize, strides, &size) < 0)
        return NULL;
    PyArray_Descr *descr = (PyArray_Descr *)mg_dtype_numpy(dtype);
    if (descr == NULL)
        return NULL;
    size_t nbytes = (size_t)size * (size_t)dtype->itemsize;
    if (host || nbytes == 0)
        return zero ? PyArray_Zeros(ndim, shape, descr, 0) : PyArray_Empty(ndim, shape, descr, 0);   /* steal */
    mg_pinned *owner = NULL;
    void *memory = NULL;
    if (mg_cu_ensure_context() < 0 ||
        mg_cu_check(mg_cu.cuMemHostAlloc(&memory, nbytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc") < 0)
        goto error;
    owner = (mg_pinned *)mg_arrays_pinned_type->tp_alloc(mg_arrays_pinned_type, 0);
    if (owner == NULL) {
        mg_cu_free_host_quietly(memory, mg_cu_current_device());
        goto error;
    }
    owner->ptr = memory;
    owner->nbytes = (Py_ssize_t)nbytes;
    owner->device = mg_cu_current_device();
    if (zero)
        memset(memory, 0, nbytes);
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, shape, NULL, memory,
                                           NPY_ARRAY_CARRAY, NULL);   /* steals descr */
    descr = NULL;
    if (array == NULL) {
        Py_DECREF(owner);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)array, (PyObject *)owner) < 0) {   /* steals owner, even on failure */
        Py_DECREF(array);
        return NULL;
    }
    return array;
error:
    Py_XDECREF(descr);
    return NULL;
}

PyObject *mg_arrays_array_pinned_empty(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return pinned_allocate(args, kwargs, "O|O&$p:pinned_empty", 0);
}

PyObject *mg_arrays_array_pinned_zeros(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return pinned_allocate(args, kwargs, "O|O&$p:pinned_zeros", 1);
}

