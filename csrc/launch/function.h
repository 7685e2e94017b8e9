/* Modules, kernels and their launch: the Python types mlirgpu.cuda.Module
 * (CudaModule), TensorMap (launch/module.c) and Function (launch/function.c).
 * A launch reads arrays of every kind and tensor maps of both backends, so
 * this area sits above arrays/ and cpu/. */
#ifndef MG_LAUNCH_FUNCTION_H
#define MG_LAUNCH_FUNCTION_H

#include "base/state.h"
#include "cuda/driver.h"
#include <stdint.h>

/* Adds CudaModule, Function, TensorMap and mlirgpu.cuda.load_module. */
int mg_launch_init(PyObject *module);

/* The device an mlirgpu.Function's module was loaded on. */
int mg_cu_function_device(PyObject *function);

/* The Python type objects (strong refs held for the life of the process). */
extern PyTypeObject *mg_cu_Module_type;
extern PyTypeObject *mg_cu_Function_type;
extern PyTypeObject *mg_cu_TensorMap_type;

/* Loads a PTX (str, or bytes without the ELF magic) or cubin (ELF bytes)
 * image into the current context: a new mlirgpu.Module, or NULL with
 * CudaError set (its message holds the JIT error log) or TypeError. */
PyObject *mg_cu_module_load(PyObject *image);

/* module.get_function(name, params): a new mlirgpu.Function. `params` is
 * NULL/None or a sequence of "ptr", "tensormap" and dtypes. */
PyObject *mg_cu_function_new(PyObject *module, const char *name, PyObject *params, PyObject *stores);

/* The raw handle of an mlirgpu.Function (borrowed; lives as long as it). */

/* The number of parameters of its signature, or -1 without one. */
int mg_cu_function_nparams(PyObject *function);

/* Most arguments a launch packs (one bit each in mg_cu_function_launch_known's mask). */
#define MG_CU_MAX_ARGS 64

/* A launch with Python arguments, exactly as func(*args, grid=, block=,
 * shared_mem=, cluster=, stream=): Py_None or NULL on error. */
PyObject *mg_cu_function_launch(PyObject *function, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames);

/* Whether `key` is one of those launch keywords. */
int mg_cu_is_launch_keyword(PyObject *key);

/* The shape of one array argument, as the caller read it. */
typedef Py_ssize_t mg_cu_extents[8];

/* What a launch's keywords say (grid=, block=, shared_mem=, cluster=, stream=). */
typedef struct {
    unsigned int grid[3], block[3], cluster[3];
    int have_cluster;
    unsigned long long shared_mem;
    CUstream stream;
    PyObject *stream_obj;                     /* borrowed from the call */
    int ran_python;                           /* reading the keywords ran user code */
} mg_cu_launch_config;

/* Reads a launch's keywords before its arguments, so that user code they run
 * (an __index__, a stream object's protocol) cannot invalidate pointers read
 * afterwards. 0, or -1 with the error set (its message names no kernel: a
 * caller that fails here lets the launch read them again and raise). */
int mg_cu_launch_config_parse(PyObject *const *values, PyObject *kwnames, mg_cu_launch_config *config);

/* A launch's arguments as its caller read them, once: bit i of `known` says
 * argument i is an array whose device pointer is pointers[i] and whose shape
 * is shapes[i] (read only for the extents the signature passes; the caller
 * keeps whatever owns it alive); bit i of `readonly` says that array must not
 * be written; `waits` are the `nwaits` producer streams that foreign arrays
 * among them named (CAI `stream`), which the launch's stream first waits for. */
typedef struct {
    uint64_t known;
    uint64_t readonly;
    int nwaits;
    CUdeviceptr pointers[MG_CU_MAX_ARGS];
    mg_cu_extents shapes[MG_CU_MAX_ARGS];
    CUstream waits[MG_CU_MAX_ARGS];
} mg_cu_read_args;

/* The launch where the caller already read the keywords (`config`, or NULL
 * to read them here) and some array arguments (`read`, or NULL): the other
 * arguments are packed as mg_cu_function_launch packs them. Where this call
 * reads keywords that run Python code, arguments read before are not
 * trusted (that code may have freed what they point to): every argument is
 * read again. */
PyObject *mg_cu_function_launch_known(PyObject *function, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames, const mg_cu_launch_config *config,
                                      const mg_cu_read_args *read);

#endif
