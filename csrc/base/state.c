/* The module's state and what every area uses from it: the exception
 * classes, mg_raise, mg_add_type, and the NumPy C API's one table. */
#include "base/state.h"

#include <string.h>
#define MG_NUMPY_IMPORT /* this file defines the table */
#include "base/numpy_api.h"

mg_state *mg_st = NULL;

PyObject *mg_raise(PyObject *cls, const char *fmt, ...)
{
    va_list vargs;
    va_start(vargs, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, vargs);
    va_end(vargs);
    if (msg != NULL) {
        PyErr_SetObject(cls, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

PyTypeObject *mg_add_type_as(PyObject *module, PyType_Spec *spec, PyObject *base, const char *as)
{
    PyObject *type = PyType_FromModuleAndSpec(module, spec, base);
    if (type == NULL)
        return NULL;
    if (PyModule_GetDict(module) != NULL && PyDict_GetItemString(PyModule_GetDict(module), as) != NULL) {
        Py_DECREF(type);
        PyErr_Format(PyExc_SystemError, "mlirgpu._mlirgpu.%s is defined twice", as);
        return NULL;
    }
    if (PyModule_AddObjectRef(module, as, type) < 0) {
        Py_DECREF(type);
        return NULL;
    }
    return (PyTypeObject *)type;
}

PyTypeObject *mg_add_type(PyObject *module, PyType_Spec *spec, PyObject *base)
{
    const char *dot = strrchr(spec->name, '.');
    return mg_add_type_as(module, spec, base, dot ? dot + 1 : spec->name);
}

static PyObject *new_error(PyObject *module, const char *name, PyObject *bases, PyObject *dict,
                           const char *doc)
{
    char qualified[64];
    PyOS_snprintf(qualified, sizeof qualified, "mlirgpu.%s", name);
    PyObject *cls = PyErr_NewExceptionWithDoc(qualified, doc, bases, dict);
    if (cls == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, name, cls) < 0) {
        Py_DECREF(cls);
        return NULL;
    }
    return cls;
}

static int add_errors(PyObject *module, mg_state *st)
{
    st->Error = new_error(module, "Error", PyExc_Exception, NULL, "Base class of every mlirgpu error.\n\nFor example::\n\n"
        "    try:\n        kernel(x, grid=1, block=32)\n    except mg.Error as error:\n        print(error)");
    if (st->Error == NULL)
        return -1;
    /* The class attribute diagnostics = () is what an error raised from a
     * plain message (an invalid option, ptxas's output) carries; errors made
     * from MLIR's diagnostics set their own list on the instance. */
    PyObject *no_diagnostics = Py_BuildValue("{s:()}", "diagnostics");
    if (no_diagnostics == NULL)
        return -1;
    st->MLIRError = new_error(module, "MLIRError", st->Error, no_diagnostics,
        "MLIR reported errors. `diagnostics` lists (severity, location, message) tuples.\n\nFor example::\n\n"
        "    try:\n        mg.ir.Module.parse(\"func.func @f(\")\n    except mg.MLIRError as error:\n"
        "        print(error.diagnostics)");
    st->CompileError = new_error(module, "CompileError", st->Error, no_diagnostics,
        "Lowering to NVVM, PTX or cubin failed, or a compile option is invalid. "
        "`diagnostics` lists (severity, location, message) tuples (empty when the "
        "failure is not MLIR's). A kernel's message starts with its file and line.\n\nFor example::\n\n"
        "    try:\n        kernel[64].ptx(chip=\"sm_90a\")\n    except mg.CompileError as error:\n"
        "        print(error)");
    Py_DECREF(no_diagnostics);
    st->CudaError = new_error(module, "CudaError", st->Error, NULL,
        "A CUDA driver call failed, or there is no driver. `code` is the CUresult "
        "(-1 when no driver could be loaded) and `name` its enum name.\n\nFor example::\n\n"
        "    try:\n        mg.cuda.Device(0)\n    except mg.CudaError as error:\n"
        "        print(error.name)   # MLIRGPU_NO_DRIVER on a machine without one");
    PyObject *launch_bases = st->Error ? PyTuple_Pack(2, st->Error, PyExc_ValueError) : NULL;
    if (launch_bases == NULL)
        return -1;
    st->LaunchError = new_error(module, "LaunchError", launch_bases, NULL,
        "The arguments or configuration of a launch do not fit the kernel; the message names "
        "the parameter.\n\nFor example::\n\n"
        "    try:\n        add(x, y, grid=4, block=256)          # one argument short\n"
        "    except mg.LaunchError as error:\n        print(error)");
    Py_DECREF(launch_bases);
    st->KernelError = new_error(module, "KernelError", st->Error, NULL,
        "A kernel run on the CPU backend broke a rule of the GPU's execution model (a barrier "
        "not reached by every thread) or went out of bounds (with MLIRGPU_CHECK=bounds).\n\nFor example::\n\n"
        "    try:\n        kernel(x, grid=1, block=64)\n    except mg.KernelError as error:\n"
        "        print(error)   # names the array, index, thread, block and line");
    PyObject *invalid_bases = PyTuple_Pack(2, st->Error, PyExc_RuntimeError);
    if (invalid_bases == NULL)
        return -1;
    st->InvalidObjectError = new_error(module, "InvalidObjectError", invalid_bases, NULL,
        "The object refers to IR that was erased or rewritten by a pass, or to "
        "memory that was freed.\n\nFor example::\n\n"
        "    op = module.body.operations[0]\n    passes.run(module, \"canonicalize\")\n"
        "    op.name   # InvalidObjectError: a pass may have rewritten it");
    Py_DECREF(invalid_bases);
    if (!st->MLIRError || !st->CompileError || !st->CudaError || !st->LaunchError ||
        !st->KernelError || !st->InvalidObjectError)
        return -1;
    return 0;
}

int mg_base_init(PyObject *module)
{
    if (_import_array() < 0)
        return -1;
    mg_state *st = PyModule_GetState(module);
    if (add_errors(module, st) < 0)
        return -1;
    mg_st = st;
    return 0;
}
