"""Python lines in NVIDIA's tools: kernels compile with line information
(the PTX's .file/.loc, the cubin's line table), so disassemblers, profilers
and compute-sanitizer name the kernel's .py file and line.

    python3 examples/line_info.py --out DIR       # writes DIR/axpy.cubin and DIR/axpy.ptx, runs axpy
    nvdisasm -g DIR/axpy.cubin                    # SASS, each block under its Python line
    compute-sanitizer python3 examples/line_info.py --out-of-bounds
                                                  # the bad read, reported at this file's line
    ncu --set full --import-source yes -k axpy python3 examples/line_info.py
                                                  # Nsight Compute: the Source page shows these lines

Without a GPU it writes the files and says so.
"""
import argparse
import os

import numpy as np

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

N = mg.generics("N")


@mg.kernel
def axpy(a: mg.f32, x: mg.memref[N, mg.f32], y: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        y[i] = a * x[i] + y[i]


@mg.kernel
def shifted(x: mg.memref[N, mg.f32], y: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    y[i] = x[i + 1]          # the last thread reads one element past the end of x


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory for axpy.cubin and axpy.ptx")
    parser.add_argument("--out-of-bounds", action="store_true", help="launch a kernel that reads past an array")
    args = parser.parse_args()
    n = 1 << 20
    if args.out_of_bounds:
        # x is allocated last, and its 1,024,000 bytes are not a multiple of the driver's
        # allocation granularity: the element past its end lies outside every allocation,
        # where compute-sanitizer sees the read (past the end of an earlier array it can
        # land in the next one, which is memory the kernel may read).
        n = 256 * 1000
        if mg.backend() == "cpu":
            os.environ["MLIRGPU_CHECK"] = "bounds"   # the CPU backend's own check names the line too
        try:
            y = mg.empty(n, mg.f32)
            x = mg.to_device(np.ones(n, np.float32))
            shifted(x, y, grid=n // 256, block=256)
            mg.cuda.synchronize() if mg.backend() == "cuda" else None
        except mg.KernelError as error:
            print(error)
        return
    spec = axpy[n]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "axpy.ptx"), "w") as f:
        f.write(spec.ptx())
    with open(os.path.join(args.out, "axpy.cubin"), "wb") as f:
        f.write(spec.cubin())
    print(f"wrote {args.out}/axpy.ptx and {args.out}/axpy.cubin")
    if mg.backend() != "cuda":
        print("no GPU: not launched")
        return
    x, y = mg.to_device(np.ones(n, np.float32)), mg.zeros(n, mg.f32)
    axpy(2.0, x, y, grid=n // 256, block=256)
    print("axpy ran, y[:4] =", y.get()[:4])


if __name__ == "__main__":
    main()
