/* mlirgpu._mlirgpu: module init, the top of the layers. Each area (mlir,
 * cuda, arrays, host, cpu, launch, dispatch) adds its own types and functions
 * through its mg_*_init hook, called here from the bottom layer up. */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include "base/state.h"
#include "base/stack_chunks.h"
#include "mlir/ir.h"
#include "mlir/pipeline.h"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "arrays/array.h"
#include "host/runtime.h"
#include "host/engine.h"
#include "cpu/cpu.h"
#include "launch/function.h"
#include "dispatch/dispatch.h"

#include <llvm/Config/llvm-config.h>
#include <link.h>
#include <string.h>

static int append_object(struct dl_phdr_info *info, size_t size, void *list)
{
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
        return 0;   /* the executable itself */
    PyObject *name = PyUnicode_DecodeFSDefault(info->dlpi_name);
    int failed = name == NULL || PyList_Append(list, name) < 0;
    Py_XDECREF(name);
    return failed ? -1 : 0;
}

/* The paths of the shared objects loaded in the process, from the loader's
 * own list: the compile cache finds libMLIR and libLLVM there, where reading
 * /proc/self/maps would cost a process with a CUDA context milliseconds. */
static PyObject *shared_objects(PyObject *module, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    if (dl_iterate_phdr(append_object, list) != 0) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

static PyMethodDef module_functions[] = {
    {"shared_objects", shared_objects, METH_NOARGS,
     "shared_objects(): the paths of the shared libraries loaded in the process."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module)
{
    if (mg_st != NULL) {
        PyErr_SetString(PyExc_ImportError,
            "mlirgpu._mlirgpu can be loaded once per process (MLIR and CUDA state is process-wide)");
        return -1;
    }
    if (mg_base_init(module) < 0)
        return -1;
    mg_stack_chunks_keep();
    /* The toolkit the build was made for; compiler/toolkit.py looks there first. */
    if (PyModule_AddStringConstant(module, "CUDA_HOME", MG_CUDA_HOME) < 0)
        return -1;
    /* The MLIR and LLVM release the extension was compiled against. */
    if (PyModule_AddStringConstant(module, "MLIR_VERSION", LLVM_VERSION_STRING) < 0)
        return -1;
    /* Bottom up, as the layers stand (docs/design/csrc.md): an area's init
     * may register callbacks with the areas below it. */
    if (mg_ir_init(module) < 0 || mg_pipeline_init(module) < 0 ||
        mg_cu_init(module) < 0 || mg_graph_init(module) < 0 || mg_array_init(module) < 0 ||
        mg_rt_init(module) < 0 || mg_engine_init(module) < 0 || mg_cpu_init(module) < 0 ||
        mg_launch_init(module) < 0 || mg_dispatch_init(module) < 0) {
        mg_st = NULL;
        return -1;
    }
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    mg_state *st = PyModule_GetState(module);
    Py_VISIT(st->Error);
    Py_VISIT(st->MLIRError);
    Py_VISIT(st->CompileError);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->LaunchError);
    Py_VISIT(st->KernelError);
    Py_VISIT(st->InvalidObjectError);
    return 0;
}

static int module_clear(PyObject *module)
{
    mg_state *st = PyModule_GetState(module);
    Py_CLEAR(st->Error);
    Py_CLEAR(st->MLIRError);
    Py_CLEAR(st->CompileError);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->LaunchError);
    Py_CLEAR(st->KernelError);
    Py_CLEAR(st->InvalidObjectError);
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mlirgpu._mlirgpu",
    .m_doc = "C core of mlirgpu: MLIR IR, the NVVM pipeline, the CUDA driver, device arrays.",
    .m_size = sizeof(mg_state),
    .m_methods = module_functions,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
};

PyMODINIT_FUNC PyInit__mlirgpu(void)
{
    return PyModuleDef_Init(&module_def);
}
