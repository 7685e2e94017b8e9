/* The launch fast path of @mlirgpu.kernel: mlirgpu.Dispatcher maps the
 * signature of a call's arguments (kinds, dtypes, shapes, layouts, devices),
 * computed in C, to a loaded Function through a hash table, and launches it
 * without Python-level binding once the entry's guards (dispatch/guards.h)
 * hold; a signature it has not seen, or a guard that fails, goes to a
 * Python `miss` callable that compiles, registers and launches. */
#ifndef MG_DISPATCH_H
#define MG_DISPATCH_H

#include "base/state.h"

int mg_dispatch_init(PyObject *module);

extern PyTypeObject *mg_Dispatcher_type;

#endif
