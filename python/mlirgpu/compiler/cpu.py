"""The CPU target's pass pipeline: a kernel lowered for the host
(mlirgpu.targets.cpu) down to the llvm dialect, for MLIR's ExecutionEngine."""

__all__ = ["PIPELINE"]

# Every dialect a traced kernel uses, down to the llvm dialect. math-to-llvm
# takes what LLVM has intrinsics for; math-to-libm the rest (tanh, atan, ...).
# arith goes to llvm before memref too: memref.generic_atomic_rmw (mg.atomic.cas)
# lowers only once the arith ops of its body have.
PIPELINE = ("builtin.module(lower-affine, convert-scf-to-cf, convert-vector-to-llvm, expand-strided-metadata, "
            "convert-arith-to-llvm, finalize-memref-to-llvm, convert-math-to-llvm, convert-math-to-libm, "
            "convert-arith-to-llvm, convert-index-to-llvm, convert-cf-to-llvm, convert-func-to-llvm, "
            "reconcile-unrealized-casts)")
