/* What the files of launch/ share with each other (signature.c,
 * function.c), hidden from the world by -fvisibility=hidden. */
#ifndef MG_LAUNCH_SHARED_H
#define MG_LAUNCH_SHARED_H

#include "launch/function.h"
#include "arrays/array.h"

/* A parameter kind: a dtype id (a scalar), or one of these. */
enum { KIND_PTR = -1, KIND_ANY = -2, KIND_TENSOR_MAP = -3 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    CUfunction handle;
    PyObject *module;     /* strong: the CUmodule outlives its functions */
    PyObject *name;       /* str */
    PyObject *params;     /* tuple of "ptr", ("ptr", dims), "tensormap" and DTypes, or None */
    int nparams;          /* -1 without a signature */
    uint64_t stores;      /* bit i: the kernel may store through parameter i */
    /* A cooperative kernel (its module has mg.grid.sync()'s counter) is launched
     * with every block resident, after the module's previous such launch. */
    int cooperative;
    int fit_threads, fit_blocks;    /* the last answer of cooperative_blocks ... */
    unsigned long long fit_shared;  /* ... and the shared memory it was for */
    signed char kinds[MG_CU_MAX_ARGS];
    uint8_t extents[MG_CU_MAX_ARGS]; /* bit d: the array's extent d follows its pointer, as an i64 */
} mg_function;

int mg_launch_parse_signature(mg_function *self, PyObject *params);
int mg_launch_parse_stores(mg_function *self, PyObject *stores);


#endif
