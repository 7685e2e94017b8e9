"""The Hopper (sm_90a) GEMM of mlirgpu.ops, measured configuration by
configuration: TMA copies into a ring of shared-memory stages guarded by
mbarriers, and warp-specialized wgmma. The kernel and its options are in
python/mlirgpu/ops/hopper_gemm.py (its text explains them); this script
checks and times each of its CONFIGS at one size.

    python examples/tensorcore/hopper_gemm.py [M N K] [--dtype bf16|f16|f8e4m3|f8e5m2] [--out f32|bf16|f16]

Without a GPU it prints how many wgmma and TMA instructions the PTX has.
"""
import argparse
import sys
import time

import numpy as np

import mlirgpu as mg
# The kernel's names, as this script's (the tests and benchmarks/gemm_tensorcore.py import them from here).
from mlirgpu.ops.hopper_gemm import (CONFIGS, FLOATS8, Config, available, build, config_for,  # noqa: F401
                                     kernel_for, launch, matmul, prepare, store_map)


def _inputs(M, N, K, dtype, b_major, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K), dtype=np.float32).astype(dtype.numpy)
    b = rng.standard_normal((K, N), dtype=np.float32).astype(dtype.numpy)
    b_given = np.ascontiguousarray(b.T) if b_major == "K" else b
    return a, b, mg.to_device(a), mg.to_device(b_given)


def check(M, N, K, dtype=mg.bf16, out_dtype=mg.f32, config=None):
    """Largest error of C against a float64 product of the same (rounded) inputs, relative to its scale."""
    config = config_for(config, dtype)
    a, b, dA, dB = _inputs(M, N, K, dtype, config.b_major)
    C = matmul(dA, dB, out_dtype, config).get().astype(np.float64)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.max(np.abs(C - reference)) / (np.sqrt(K) + 1e-9))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[8192, 8192, 8192])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f8e4m3", "f8e5m2"])
    parser.add_argument("--out", default="bf16", choices=["f32", "bf16", "f16"])
    parser.add_argument("--b-major", default=None, choices=["MN", "K"],
                        help="how B is given: K x N (MN, the default for 2-byte inputs) or N x K (K)")
    args = parser.parse_args()
    M, N, K = (args.sizes * 3)[:3] if len(args.sizes) == 1 else args.sizes
    dtype, out_dtype = mg.dtype(args.dtype), mg.dtype(args.out)
    if dtype in FLOATS8 and args.b_major == "MN":
        parser.error("wgmma reads 8-bit inputs K-major only: B is given as N x K (--b-major K)")
    b_major = args.b_major or ("K" if dtype in FLOATS8 else "MN")
    if not mg.cuda.is_available():
        spec = kernel_for(CONFIGS[0].replace(b_major=b_major).for_dtype(dtype), dtype)[M, N, out_dtype]
        ptx = spec.ptx("sm_90a")
        print(f"no GPU: PTX for sm_90a has {ptx.count('wgmma.mma_async')} wgmma.mma_async and "
              f"{ptx.count('cp.async.bulk.tensor')} cp.async.bulk.tensor")
        return
    for listed in CONFIGS:
        config = listed.replace(b_major=b_major).for_dtype(dtype)
        a, b, dA, dB = _inputs(M, N, K, dtype, config.b_major)
        C = mg.empty((M, N), out_dtype)
        maps = prepare(dA, dB, config) + (store_map(C) if config.epilogue == "tma" else None,)
        matmul(dA, dB, out_dtype, config, C=C, maps=maps)
        # Checked on 64 rows spread over C (a float64 product of all of it takes minutes on the host).
        rows = np.linspace(0, M - 1, min(M, 64)).astype(int)
        exact = a[rows].astype(np.float64) @ b.astype(np.float64)
        error = np.max(np.abs(C.get()[rows].astype(np.float64) - exact)) / np.max(np.abs(exact))
        repeats = 20
        start = time.perf_counter()
        for _ in range(repeats):
            matmul(dA, dB, out_dtype, config, C=C, maps=maps)
        mg.cuda.synchronize()
        seconds = (time.perf_counter() - start) / repeats
        print(f"{config}: {M}x{N}x{K} {dtype.name}->{out_dtype.name}: {seconds * 1e3:.3f} ms, "
              f"{2 * M * N * K / seconds / 1e12:.1f} TFLOP/s, relative error {error:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
