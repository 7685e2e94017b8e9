/* The NumPy C API, one table for the whole extension: base/state.c defines it
 * and fills it (MG_NUMPY_IMPORT, then _import_array), every other file uses
 * it through NO_IMPORT_ARRAY. Include this before any other NumPy header:
 * NumPy 2.5's ndarraytypes.h already declares the table, and a file that saw
 * it before PY_ARRAY_UNIQUE_SYMBOL got a private `static void **PyArray_API =
 * NULL` instead, which gcc 13 compiled into a trap at the first
 * PyArray_Check (the CPU backend's crash on the GPU machine). */
#ifndef MG_NUMPY_API_H
#define MG_NUMPY_API_H

#ifdef NUMPY_CORE_INCLUDE_NUMPY_NPY_COMMON_H_
#error "a NumPy header was included before numpy_api.h"
#endif

#define PY_ARRAY_UNIQUE_SYMBOL mg_ARRAY_API
#ifndef MG_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#endif
