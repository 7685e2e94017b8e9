/* The runner utilities that MLIR's own runners link in (the printing
 * functions of mlir_c_runner_utils and mlir_runner_utils, and memrefCopy),
 * written here in C so that programs which print (vector.print,
 * printMemrefF32 and friends) run without MLIR's libraries. The output
 * matches MLIR's character for character; it goes to the process's standard
 * output (file descriptor 1) through C stdio, flushed by the engine after
 * each call. The ExecutionEngine registers them for every module that
 * declares them. */
#ifndef MG_RUNNER_UTILS_H
#define MG_RUNNER_UTILS_H

/* The runner utility called `name`, or NULL. */
void *mg_runner_symbol(const char *name);

typedef struct {
    const char *name;
    void *address;
} mg_runtime_symbol;

/* The conversions LLVM's code generation may call without the module
 * declaring them (float and double to bf16), which every engine registers.
 * Ends with {NULL, NULL}. */
extern const mg_runtime_symbol mg_conversion_symbols[];

#endif
