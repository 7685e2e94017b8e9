/* What the files of the ExecutionEngine share with each other (invoke.c,
 * engine.c), hidden from the world by -fvisibility=hidden. */
#ifndef MG_HOST_ENGINE_SHARED_H
#define MG_HOST_ENGINE_SHARED_H

#include "host/engine.h"
#include "host/runtime.h"
#include "arrays/array.h"
#include "base/numpy_api.h"

/* What memref.get_global puts in a descriptor's allocated pointer. */
#define MG_GLOBAL_MARKER ((uintptr_t)0xdeadbeef)

typedef void (*packed_fn)(void **);

typedef struct {
    char *name;         /* the func.func's name (PyMem) */
    packed_fn call;     /* the packed wrapper of _mlir_ciface_<name> */
    MlirType type;      /* llvm.func @<name>'s: its return type says how results come back */
    MlirType interface; /* llvm.func @_mlir_ciface_<name>'s */
} engine_function;

typedef struct {
    PyObject_HEAD
    MlirExecutionEngine engine;
    PyObject *context; /* the ir.Context the types above live in */
    engine_function *functions;
    Py_ssize_t nfunctions;
    int runtime;
    int launches; /* the module launches kernels: NumPy arguments are lent to the GPU */
    int prints;   /* it calls runner utilities or launches kernels (printf): output is ordered */
} mg_engine;

typedef struct {
    int memref;        /* ("memref", rank, dtype), else ("scalar", dtype) */
    int rank;
    mg_dtype *dtype;   /* borrowed singleton */
    size_t size, align, offset; /* in the result struct */
} result_spec;

/* Where an argument's memory is, to tell a returned view of it from
 * memory the function allocated. */
typedef struct {
    uintptr_t allocated;
    int device;          /* a DeviceArray in device memory */
    int64_t *descriptor; /* a NumPy array's, else NULL */
} borrowed;

typedef struct {
    int owner;
    int device; /* its memory is device memory */
} result_memory;

void mg_engine_lend(mg_rt_state *state, PyArrayObject *a, borrowed *b);
void mg_engine_flush_python_stdout(void);
engine_function *mg_engine_find_function(mg_engine *self, const char *name);
int mg_engine_check_results(engine_function *f, const char *name, PyObject *seq, result_spec *spec, size_t *struct_size);
PyObject *mg_engine_tuple_of(PyObject *seq, const char *message);
size_t mg_engine_descriptor_slots(PyObject *argseq);
int mg_engine_end_invocation(mg_rt_state *state, PyObject *timeline);
int mg_engine_pack_argument(engine_function *f, int by_pointer, Py_ssize_t i, PyObject *arg, int64_t *scalars,
                         void **pointers, void **packed, Py_ssize_t *k, int64_t **d, borrowed *lent);
int mg_engine_result_owners(mg_rt_state *state, const char *name, const result_spec *spec, result_memory *memory,
                         Py_ssize_t nresults, int64_t *returned, PyObject *argseq, const borrowed *lent, int skip);
PyObject *mg_engine_results_tuple(const result_spec *spec, const result_memory *memory, Py_ssize_t nresults,
                               int64_t *returned);
void mg_engine_free_function_results(const result_spec *spec, const result_memory *memory, Py_ssize_t nresults,
                                  int64_t *returned);


#endif
