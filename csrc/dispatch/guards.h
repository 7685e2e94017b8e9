/* A Dispatcher entry's guards: what a kernel's trace read besides its
 * arguments (globals, closure cells, its code), as it was when the entry was
 * registered. A hit launches only while every guard still holds; any other
 * call misses, and `miss` (runtime/compiled.py's TracedGlobals) recompiles
 * or raises as it would have anyway. */
#ifndef MG_DISPATCH_GUARDS_H
#define MG_DISPATCH_GUARDS_H

#include "base/state.h"

/* The value a guard expects where a name or cell is unbound: Dispatcher.UNBOUND. */
extern PyObject *mg_guard_unbound;

/* Checks that `guards` is a tuple of guards as Dispatcher.register documents
 * them. 0, or -1 with a TypeError or ValueError set. */
int mg_guards_validate(PyObject *guards);

/* 1 when every guard holds, 0 when one does not (or a dict lookup raised an
 * Exception, which `miss` meets again), -1 with an error that is no
 * Exception set. The caller holds a reference to `guards`: a lookup may run
 * user code (the __eq__ of a globals key that hashes like the name). */
int mg_guards_hold(PyObject *guards);

/* Creates mg_guard_unbound; 0, or -1 with an exception set. */
int mg_guards_init(void);

#endif
