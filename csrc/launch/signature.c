/* A kernel's signature, as get_function(name, params, stores) gives it:
 * each parameter's kind, the extents that follow an array, and which
 * arrays the kernel may store to. */
#include "launch/function.h"
#include "launch/tensor_map.h"
#include "arrays/array.h"
#include "cuda/graph.h"
#include "cuda/stream.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "base/numpy_api.h"
#include "launch/launch_shared.h"


/* The dims of ("ptr", dims), each in [0, MG_MAX_NDIM), as a bit mask. */
static int parse_extents(PyObject *dims, uint8_t *mask)
{
    PyObject *seq = PySequence_Fast(dims, "(\"ptr\", dims): dims must be a sequence of dimensions");
    if (seq == NULL)
        return -1;
    *mask = 0;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        long d = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, k));
        if (d < 0 || d >= MG_MAX_NDIM) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "(\"ptr\", dims): a dimension must be in [0, %d), got %ld",
                             MG_MAX_NDIM, d);
            Py_DECREF(seq);
            return -1;
        }
        *mask |= (uint8_t)(1u << d);
    }
    Py_DECREF(seq);
    return 0;
}

/* Parses a signature into self->kinds and a normalized tuple. */
int mg_launch_parse_signature(mg_function *self, PyObject *params)
{
    if (params == Py_None) {
        self->nparams = -1;
        self->params = Py_NewRef(Py_None);
        return 0;
    }
    if (PyUnicode_Check(params) || !PySequence_Check(params)) {
        PyErr_Format(PyExc_TypeError, "params must be a sequence of \"ptr\", \"tensormap\" and dtypes, not %.100s",
                     Py_TYPE(params)->tp_name);
        return -1;
    }
    /* A tuple of our own even when `params` is a tuple (PySequence_Tuple would
     * hand back the caller's, and normalizing writes into it). */
    PyObject *given = PySequence_Tuple(params);
    if (given == NULL)
        return -1;
    PyObject *items = PyTuple_New(PyTuple_GET_SIZE(given));
    for (Py_ssize_t i = 0; items != NULL && i < PyTuple_GET_SIZE(given); i++)
        PyTuple_SET_ITEM(items, i, Py_NewRef(PyTuple_GET_ITEM(given, i)));
    Py_DECREF(given);
    if (items == NULL)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n > MG_CU_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "a kernel takes at most %d parameters here, the signature has %zd",
                     MG_CU_MAX_ARGS, n);
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        self->extents[i] = 0;
        if (PyUnicode_Check(item) && PyUnicode_CompareWithASCIIString(item, "ptr") == 0) {
            self->kinds[i] = KIND_PTR;
            continue;
        }
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && PyUnicode_Check(PyTuple_GET_ITEM(item, 0)) &&
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(item, 0), "ptr") == 0) {
            /* ("ptr", dims): the pointer, then the extents of those dimensions (dynamic sizes). */
            if (parse_extents(PyTuple_GET_ITEM(item, 1), &self->extents[i]) < 0)
                goto error;
            self->kinds[i] = KIND_PTR;
            continue;
        }
        if (PyUnicode_Check(item) && PyUnicode_CompareWithASCIIString(item, "tensormap") == 0) {
            self->kinds[i] = KIND_TENSOR_MAP;
            continue;
        }
        mg_dtype *dtype;
        if (!mg_dtype_converter(item, &dtype))
            goto error;
        self->kinds[i] = (signed char)dtype->id;
        /* Normalize to the singleton so `params` reads back cleanly. */
        PyTuple_SET_ITEM(items, i, Py_NewRef((PyObject *)dtype));
        Py_DECREF(item);
    }
    self->nparams = (int)n;
    self->params = items;
    return 0;
error:
    Py_DECREF(items);
    return -1;
}

/* `stores`: None (any pointer parameter may be stored to) or the indices of those that may. */
int mg_launch_parse_stores(mg_function *self, PyObject *stores)
{
    self->stores = ~(uint64_t)0;
    if (stores == NULL || stores == Py_None)
        return 0;
    PyObject *items = PySequence_Check(stores) ? PySequence_Tuple(stores) : NULL;
    if (items == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "stores must be None or a sequence of parameter indices, not %.100s",
                         Py_TYPE(stores)->tp_name);
        return -1;
    }
    self->stores = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        Py_ssize_t index = PyLong_Check(item) ? PyLong_AsSsize_t(item) : -1;
        if (index < 0 || index >= MG_CU_MAX_ARGS || (self->nparams >= 0 && index >= self->nparams)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "stores holds parameter indices, got %R", item);
            Py_DECREF(items);
            return -1;
        }
        self->stores |= (uint64_t)1 << index;
    }
    Py_DECREF(items);
    return 0;
}

