/* The CPU backend's runtime: mlirgpu._mlirgpu.CpuEngine JIT-compiles a kernel
 * lowered for the host (a func.func with llvm.emit_c_interface taking the
 * kernel's arguments, then thread, block, block_dim and grid_dim x/y/z as
 * index) through MLIR's ExecutionEngine, and runs a launch block by block,
 * each thread of a block a fiber (ucontext) switched at mg_cpu_barrier. */
#ifndef MG_CPU_H
#define MG_CPU_H

#include "base/state.h"
#include <stdint.h>

int mg_cpu_init(PyObject *module);

/* What gpu.barrier becomes on the host: waits until every thread of the
 * block has arrived. `line` is the barrier's source line, for errors. */
void mg_cpu_barrier(int32_t line);

/* What mg.grid.sync() becomes: waits until every thread of the grid has arrived. */
void mg_cpu_grid_sync(int32_t line);

/* The other calls of the host trace (docs/design/cpu_backend.md): the block's shared memory
 * (0 static, 1 dynamic) as a memref<?xi8> through its C interface; a warp
 * shuffle; the tensor-core collectives (mma.sync, ldmatrix); printf; a failed bounds check or division. */
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
void mg_cpu_division_fault(int32_t overflow, int32_t line);

/* At the top of a loop's body that may run long: ends the launch (the block
 * abandoned, KeyboardInterrupt raised) once Ctrl-C was pressed. */
void mg_cpu_poll(int32_t line);

/* Before an access of `bytes` of shared memory at `address` (the checks
 * "races" and "uninitialized"): kind is the access's (0 load, 1 store, 3
 * vector load, 4 vector store) | 8 to check for races | 16 to check for
 * reads of bytes no thread of the block wrote. */
void mg_cpu_shared_access(int64_t address, int32_t bytes, int32_t kind, int32_t line);

/* Before a load or store of `count` elements of `size` bytes of an array
 * (the check "races"): the first at `address`, element `element` of the
 * array whose name is string `array`; kind as for mg_cpu_shared_access's
 * access (0 load, 1 store, 3 vector load, 4 vector store). */
void mg_cpu_global_access(int64_t address, int64_t element, int32_t size, int32_t count, int32_t kind,
                          int32_t array, int32_t line);

/* Hopper's operations on the host (docs/design/cpu_backend.md): mbarriers
 * (8 bytes of shared memory at a u32 shared address), named barriers, TMA
 * copies through a host tensor map, and wgmma on a thread's accumulators. */
void mg_cpu_mbarrier_init(int32_t address, int32_t count, int32_t line);
void mg_cpu_mbarrier_arrive(int32_t address, int32_t transaction_bytes, int32_t line);
void mg_cpu_mbarrier_wait(int32_t address, int32_t parity, int32_t line);
void mg_cpu_named_barrier(int32_t id, int32_t threads, int32_t wait, int32_t line);
void mg_cpu_tma_load(void *map, int32_t destination, int32_t barrier, int32_t rank, int32_t c0, int32_t c1,
                     int32_t c2, int32_t c3, int32_t c4, int32_t line);
void mg_cpu_tma_store(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                      int32_t c4, int32_t line);
void mg_cpu_tma_reduce_add(void *map, int32_t source, int32_t rank, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           int32_t c4, int32_t line);
void _mlir_ciface_mg_cpu_wgmma_buffer(mg_memref_1d *result);
void mg_cpu_wgmma(int32_t n, int64_t a, int64_t b, int32_t mode, int32_t line);
int32_t mg_cpu_float8x4(float x0, float x1, float x2, float x3, int32_t e5m2);

/* A tensor map made for the CPU backend (mlirgpu.TensorMap with host=True) is an
 * mg_cpu_tensor_map: cpu_tma.h, which the libraries mlirgpu.export writes share. */
#include "cpu_tma.h"

#endif
