/* The CPU backend's runtime: mlirgpu._mlirgpu.CpuEngine JIT-compiles a kernel
 * lowered for the host (a func.func with llvm.emit_c_interface taking the
 * kernel's arguments, then thread, block, block_dim and grid_dim x/y/z as
 * index) through MLIR's ExecutionEngine, and runs a launch block by block,
 * each thread of a block a fiber (ucontext) switched at mg_cpu_barrier. */
#ifndef MG_CPU_H
#define MG_CPU_H

#include "module.h"
#include <stdint.h>

int mg_cpu_init(PyObject *module);

/* What gpu.barrier becomes on the host: waits until every thread of the
 * block has arrived. `line` is the barrier's source line, for errors. */
void mg_cpu_barrier(int32_t line);

#endif
