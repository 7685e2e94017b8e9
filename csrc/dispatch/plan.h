/* mlirgpu.LaunchPlan: what a library call launches for arguments of one
 * signature (an op such as mlirgpu.ops.matmul), made once by its Python
 * slow path and then run from C by a Dispatcher hit: the Function, its
 * launch configuration, and each kernel parameter as a call argument, a
 * tensor map of a call argument (re-encoded where its address changed), or
 * a value kept with the plan (workspaces, scalars). The stream is read per
 * call (torch's current stream, say); a plan whose values belong to one
 * stream, or that a graph capture must not reuse, says so and misses. */
#ifndef MG_DISPATCH_PLAN_H
#define MG_DISPATCH_PLAN_H

#include "base/state.h"
#include "launch/function.h"

extern PyTypeObject *mg_LaunchPlan_type;

/* Runs `plan` for a call whose arguments the dispatcher read into `read`:
 * 1 with *result set (a new reference) when it launched, 0 where the plan
 * does not apply to this call (another stream, a capture) and the call
 * must miss, -1 with the error set. */
int mg_launch_plan_call(PyObject *plan, PyObject *const *args, Py_ssize_t nargs, const mg_cu_read_args *read,
                        PyObject **result);

int mg_launch_plan_init(PyObject *module);

#endif
