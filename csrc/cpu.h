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

/* What mg.grid.sync() becomes: waits until every thread of the grid has arrived. */
void mg_cpu_grid_sync(int32_t line);

/* The other calls of the host trace (docs/design/cpu_backend.md): the block's shared memory
 * (0 static, 1 dynamic) as a memref<?xi8> through its C interface; a warp
 * shuffle; the tensor-core collectives (mma.sync, ldmatrix); printf; a failed bounds check. */
typedef struct mg_memref_1d mg_memref_1d;
void _mlir_ciface_mg_cpu_shared(mg_memref_1d *result, int32_t which);
int64_t mg_cpu_shuffle(int32_t mode, int64_t value, int32_t offset, int32_t width, int32_t line);
void mg_cpu_warp_put(int64_t bits);
void mg_cpu_warp_collective(int32_t mode, int32_t line);
int64_t mg_cpu_warp_get(int32_t k);
void mg_cpu_printf_arg(int64_t bits);
void mg_cpu_printf(int32_t format);
void mg_cpu_bounds_index(int64_t index, int64_t size);
void mg_cpu_out_of_bounds(int32_t name, int32_t kind, int32_t line);

#endif
