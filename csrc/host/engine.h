/* mlirgpu._mlirgpu.ExecutionEngine: a module lowered to the llvm dialect,
 * JIT-compiled for the host by MLIR's ExecutionEngine. Its functions that
 * carry llvm.emit_c_interface are called with NumPy arrays, DeviceArrays
 * (as memref descriptors over their memory) and scalars; memref results come
 * back as NumPy arrays. With runtime=True the mgpu* functions of runtime.c
 * are registered, so host code lowered from the gpu dialect runs on the GPU.
 * docs/design/host_runtime.md has the design. */
#ifndef MG_ENGINE_H
#define MG_ENGINE_H

#include "mlir/ir.h"
#include <mlir-c/ExecutionEngine.h>

int mg_engine_init(PyObject *module);

/* What a host program calls at the top of each loop's body (HostProgram puts
 * the calls there): once Ctrl-C was pressed during an invoke, it leaves the
 * program, and invoke raises KeyboardInterrupt. */
void mg_host_poll(void);

/* `op` as the text mg_engine_create_detached reads (NUL-terminated; the
 * caller frees out->data); -1 with MemoryError set. */
int mg_engine_print_source(mg_ir_Operation *op, mg_buf *out);

/* MLIR's ExecutionEngine for the module `source` (verified IR, printed with
 * mg_engine_print_source or by lower()), parsed into an MLIR context of its
 * own and JIT-compiled with the GIL released: translation to LLVM IR and
 * LLVM's optimization at `opt_level` run while other threads go on. NULL
 * with MLIRError (it does not parse) or CompileError set if it cannot be
 * made; `what` names the module in the messages. */
MlirExecutionEngine mg_engine_create_detached(MlirStringRef source, int allow_unregistered, int opt_level,
                                              const char *what);

#endif
