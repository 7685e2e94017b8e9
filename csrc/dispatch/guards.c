/* A Dispatcher entry's guards, checked before each hit launches. A guard is
 * (namespace, key, value, witness):
 *   (dict, name, value, witness)  namespace[name] is `value` (UNBOUND: absent);
 *   (cell, None, value, witness)  the cell holds `value` (UNBOUND: empty);
 *   (function, None, code, None)  the function's __code__ is `code`.
 * Identity says all for a value compared by identity; a value compared by
 * content also has a witness: a list the tuple of its items (which must be
 * the same objects), a NumPy array a C-contiguous copy (same dtype object,
 * shape and bytes). A guard holds what it compares with, so an equal
 * address is the same object, never a new one at a freed one's address. */
#include "dispatch/guards.h"
#include "base/numpy_api.h"

#include <string.h>

PyObject *mg_guard_unbound;

/* ---------------------------------------------------------------------- */
/* Registering                                                             */
/* ---------------------------------------------------------------------- */

static int validate_witness(PyObject *value, PyObject *witness)
{
    if (witness == Py_None)
        return 0;
    if (PyList_CheckExact(value) && PyTuple_CheckExact(witness))
        return 0;
    if (PyArray_CheckExact(value) && PyArray_CheckExact(witness) &&
        PyArray_IS_C_CONTIGUOUS((PyArrayObject *)witness))
        return 0;
    PyErr_Format(PyExc_TypeError, "a guard's witness is None, a list's items as a tuple or a C-contiguous copy "
                 "of a NumPy array, not %.100s for a %.100s", Py_TYPE(witness)->tp_name, Py_TYPE(value)->tp_name);
    return -1;
}

static int validate_guard(PyObject *guard)
{
    if (!PyTuple_CheckExact(guard) || PyTuple_GET_SIZE(guard) != 4) {
        PyErr_Format(PyExc_TypeError, "a guard is a (namespace, key, value, witness) tuple, not %.100s",
                     Py_TYPE(guard)->tp_name);
        return -1;
    }
    PyObject *namespace = PyTuple_GET_ITEM(guard, 0), *key = PyTuple_GET_ITEM(guard, 1);
    PyObject *value = PyTuple_GET_ITEM(guard, 2), *witness = PyTuple_GET_ITEM(guard, 3);
    if (PyDict_CheckExact(namespace)) {
        /* An exact str's hash is cached: only a colliding key's __eq__ can run in a lookup. */
        if (!PyUnicode_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "a dict guard's key is a str, not %.100s", Py_TYPE(key)->tp_name);
            return -1;
        }
    }
    else if (PyCell_Check(namespace) || PyFunction_Check(namespace)) {
        if (key != Py_None) {
            PyErr_SetString(PyExc_TypeError, "a cell's or function's guard has the key None");
            return -1;
        }
        if (PyFunction_Check(namespace) && (!PyCode_Check(value) || witness != Py_None)) {
            PyErr_SetString(PyExc_TypeError, "a function's guard is (function, None, code, None)");
            return -1;
        }
    }
    else {
        PyErr_Format(PyExc_TypeError, "a guard's namespace is a dict, a cell or a function, not %.100s",
                     Py_TYPE(namespace)->tp_name);
        return -1;
    }
    return validate_witness(value, witness);
}

int mg_guards_validate(PyObject *guards)
{
    if (!PyTuple_CheckExact(guards)) {
        PyErr_Format(PyExc_TypeError, "guards must be a tuple of guards, not %.100s", Py_TYPE(guards)->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards); i++)
        if (validate_guard(PyTuple_GET_ITEM(guards, i)) < 0)
            return -1;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Checking                                                                */
/* ---------------------------------------------------------------------- */

/* Whether `value` (held by its guard) still has the content `witness` recorded. */
static int witness_holds(PyObject *value, PyObject *witness)
{
    if (witness == Py_None)
        return 1;
    if (PyList_CheckExact(value)) {
        Py_ssize_t n = PyTuple_GET_SIZE(witness);
        if (PyList_GET_SIZE(value) != n)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (PyList_GET_ITEM(value, i) != PyTuple_GET_ITEM(witness, i))
                return 0;
        return 1;
    }
    /* An array: reshaped, retyped or resized in place reads apart, as it does to its fingerprint. */
    PyArrayObject *now = (PyArrayObject *)value, *then = (PyArrayObject *)witness;
    int ndim = PyArray_NDIM(then);
    return PyArray_IS_C_CONTIGUOUS(now) && PyArray_DESCR(now) == PyArray_DESCR(then) &&
           PyArray_NDIM(now) == ndim &&
           memcmp(PyArray_DIMS(now), PyArray_DIMS(then), (size_t)ndim * sizeof(npy_intp)) == 0 &&
           memcmp(PyArray_DATA(now), PyArray_DATA(then), (size_t)PyArray_NBYTES(then)) == 0;
}

int mg_guards_hold(PyObject *guards)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards); i++) {
        PyObject *guard = PyTuple_GET_ITEM(guards, i);
        PyObject *namespace = PyTuple_GET_ITEM(guard, 0), *value = PyTuple_GET_ITEM(guard, 2);
        /* Borrowed, and only compared with `value`: nothing runs between the read and the comparison. */
        PyObject *now;
        if (PyDict_CheckExact(namespace)) {
            now = PyDict_GetItemWithError(namespace, PyTuple_GET_ITEM(guard, 1));
            if (now == NULL && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_Exception))
                    return -1;
                PyErr_Clear();
                return 0;
            }
        }
        else if (PyCell_Check(namespace)) {
            now = PyCell_GET(namespace);
        }
        else {
            now = PyFunction_GET_CODE(namespace);
        }
        if ((now == NULL ? mg_guard_unbound : now) != value || !witness_holds(value, PyTuple_GET_ITEM(guard, 3)))
            return 0;
    }
    return 1;
}

int mg_guards_init(void)
{
    mg_guard_unbound = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    return mg_guard_unbound == NULL ? -1 : 0;
}
