/* Module state shared by every area of the extension: the exception classes,
 * mg_raise and mg_add_type. The bottom layer: it calls no other area.
 *
 * Naming, in every .c file: symbols shared between files are prefixed by
 * area (mg_ir_, mg_cu_, mg_array_, mg_cpu_, ...); a Python type's methods and
 * slots are TypeName_method (as CPython's own modules write them); every other
 * static function is lower_snake_case. Functions named mgpu* are MLIR's
 * runtime ABI and keep MLIR's names. */
#ifndef MG_BASE_STATE_H
#define MG_BASE_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject *Error;              /* mlirgpu.Error: base of all of ours */
    PyObject *MLIRError;          /* an MLIR diagnostic; .diagnostics */
    PyObject *CompileError;       /* lowering to PTX/cubin failed; .diagnostics */
    PyObject *CudaError;          /* a driver call failed; .code, .name */
    PyObject *LaunchError;        /* arguments of a launch do not fit */
    PyObject *InvalidObjectError; /* a handle whose IR or memory is gone */
    PyObject *KernelError;        /* a CPU-backend run broke the GPU's rules */
} mg_state;

/* The one instance of the module's state. MLIR's registries and the CUDA
 * driver are process-wide, so the module refuses a second instance. */
extern mg_state *mg_st;

/* Sets `cls` with a formatted message and returns NULL, like PyErr_Format. */
PyObject *mg_raise(PyObject *cls, const char *fmt, ...);

/* Imports the NumPy C API and adds the exception classes: the first of the
 * init hooks module.c calls. 0, or -1 with an exception set. */
int mg_base_init(PyObject *module);

/* Adds a heap type built from `spec` to `module` under the last part of its
 * name (or `as`, where two areas' types share a short name) and returns it. */
PyTypeObject *mg_add_type(PyObject *module, PyType_Spec *spec, PyObject *base);
PyTypeObject *mg_add_type_as(PyObject *module, PyType_Spec *spec, PyObject *base, const char *as);

#endif
