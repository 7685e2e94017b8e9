"""The Ampere-style (sm_80) half-precision GEMM of mlirgpu.ops on the tensor
cores, C = A @ B: mma.sync, ldmatrix and a cp.async pipeline, its blocks
fed by an mg.TileScheduler. The kernel is in python/mlirgpu/ops/ampere_gemm.py
(its text explains it); this script checks one product with it.

    python examples/tensorcore/ampere_gemm.py [M K N] [--dtype f16|bf16] [--out f16|bf16|f32] [--config I]
                                              [--mode data_parallel|split_k|stream_k|hybrid] [--split S]
                                              [--units U]

checks one product against float64 NumPy on the current backend
(MLIRGPU_BACKEND=cpu runs it without a GPU).
"""
import argparse
import sys

import numpy as np

import mlirgpu as mg
from mlirgpu.language.schedule import MODES
# The kernel's names, as this script's (the tests and benchmarks/gemm_tensorcore.py import them from here).
from mlirgpu.ops.ampere_gemm import (CONFIGS, Config, build, kernel_for, launch, plan,  # noqa: F401
                                     swizzle_for, workspace)


def operands(m, k, n, dtype, seed=0):
    """Random A, B as NumPy arrays of `dtype` (an mlirgpu dtype)."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (m, k)).astype(dtype.numpy), rng.uniform(-1, 1, (k, n)).astype(dtype.numpy))


def reference(A, B):
    return A.astype(np.float64) @ B.astype(np.float64)


def within_tolerance(C, expected, k, out_dtype):
    """C is the product up to f32 sums of k products of inputs in [-1, 1]
    and the rounding of the output type, element by element."""
    rounding = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}[out_dtype.name]
    return bool(np.all(np.abs(C.astype(np.float64) - expected) <= rounding * np.abs(expected) + k * 2.0 ** -22))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[300, 200, 260], help="M K N")
    parser.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    parser.add_argument("--out", default="f32", choices=["f16", "bf16", "f32"])
    parser.add_argument("--config", type=int, default=0, choices=range(len(CONFIGS)),
                        help="which of CONFIGS (default 0: " + CONFIGS[0].name + ")")
    parser.add_argument("--mode", default="data_parallel", choices=MODES,
                        help="how the blocks share the work (mg.TileScheduler)")
    parser.add_argument("--split", type=int, default=None, help="K slices per tile of --mode split_k")
    parser.add_argument("--units", type=int, default=None,
                        help="persistent blocks of the other modes than data_parallel (a block per tile); "
                             "default: one per SM")
    args = parser.parse_args(argv)
    if args.mode == "split_k" and args.split is None:
        parser.error("--mode split_k takes --split")
    if args.mode != "data_parallel" and args.units is None and mg.backend() == "cpu":
        args.units = 8  # the CPU has no multiprocessors to count
    m, k, n = args.sizes
    dtype, out_dtype, config = mg.dtype(args.dtype), mg.dtype(args.out), CONFIGS[args.config]
    A, B = operands(m, k, n, dtype)
    if mg.backend() == "cpu":  # NumPy arrays as they are (host DeviceArrays of bf16 have no NumPy view)
        C = np.zeros((m, n), out_dtype.numpy)
        launch(A, B, C, config, mode=args.mode, split=args.split, units=args.units)
    else:
        C = mg.zeros((m, n), out_dtype)
        launch(mg.to_device(A), mg.to_device(B), C, config, mode=args.mode, split=args.split,
               units=args.units)
        C = C.get()
    expected = reference(A, B)
    ok = within_tolerance(C, expected, k, out_dtype)
    print(f"{m}x{k}x{n} {args.dtype} -> {args.out} with {config.name}, {args.mode} on {mg.backend()}: max |error| "
          f"{np.abs(C.astype(np.float64) - expected).max():.3g}, {'correct' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
