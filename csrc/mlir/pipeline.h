/* Pass pipelines (mlirgpu.passes) and the pieces of lowering to PTX/cubin
 * that need C: reading the objects out of gpu.binary, printing LLVM bitcode. */
#ifndef MG_PIPELINE_H
#define MG_PIPELINE_H

#include "base/state.h"

int mg_pipeline_init(PyObject *module);

#endif
