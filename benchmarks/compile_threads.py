"""Compiling from several threads: 8 specializations of the naive SGEMM, each
compiled from its Python function to what a GPU loads (trace, MLIR pipeline,
LLVM's NVPTX back end, and ptxas where the CUDA toolkit has one) or, with
--cpu, to a CPU-backend engine (trace, MLIR pipeline, JIT), one after
another and then from 8 threads at once.

    python benchmarks/compile_threads.py [--repeats R] [--threads T] [--cpu]

The compile stages run without the GIL, so the threads' compiles overlap
where there are cores to run them; tracing (Python) still takes turns.
"cores busy" is the CPU time (ptxas's included) per wall-clock second: about
1 one after another, up to the free cores from threads. The compile cache is
bypassed: every figure is a full compile. Needs no GPU.
"""
import argparse
import os
import statistics
import threading
import time

import checkout  # noqa: E402,F401 (mlirgpu: the installed package, else this checkout's)
import mlirgpu as mg  # noqa: E402
from mlirgpu.runtime import cpu as cpu_backend  # noqa: E402

M, K, N, dtype = mg.generics("M K N dtype")


@mg.kernel(generics=(M, K, N, dtype))
def sgemm_naive(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype]):
    r = mg.block_dim.x * mg.block_idx.x + mg.thread_idx.x
    c = mg.block_dim.y * mg.block_idx.y + mg.thread_idx.y
    acc = mg.constant(0.0, dtype)
    for k in range(K):
        acc += A[r, k] * B[k, c]
    C[r, c] = acc


def compile_one(size, cpu):
    spec = sgemm_naive[size, 128, 256, mg.f32]  # a new size: a new specialization, nothing cached
    if cpu:
        cpu_backend.engine(spec)
    else:
        spec.compilation("sm_90a").image


def cpu_seconds():
    """CPU time of this process and of the ptxas processes it waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def one_after_another(sizes, cpu):
    start, cpu_start = time.perf_counter(), cpu_seconds()
    for size in sizes:
        compile_one(size, cpu)
    return time.perf_counter() - start, cpu_seconds() - cpu_start


def from_threads(sizes, cpu):
    errors = []

    def work(size):
        try:
            compile_one(size, cpu)
        except BaseException as error:  # reported below: a thread's error must not pass silently
            errors.append(error)

    threads = [threading.Thread(target=work, args=(size,)) for size in sizes]
    start, cpu_start = time.perf_counter(), cpu_seconds()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start, cpu_seconds() - cpu_start
    if errors:
        raise errors[0]
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--cpu", action="store_true", help="compile for the CPU backend instead of to cubin")
    args = parser.parse_args()
    compile_one(64, args.cpu)  # warm-up: dialects, LLVM targets, ptxas in the page cache
    sequential, threaded = [], []
    size = 65
    for _ in range(args.repeats):
        sizes = list(range(size, size + args.threads))
        size += args.threads
        sequential.append(one_after_another(sizes, args.cpu))
        sizes = list(range(size, size + args.threads))
        size += args.threads
        threaded.append(from_threads(sizes, args.cpu))
    image = sgemm_naive[64, 128, 256, mg.f32].compilation("sm_90a").image_format
    what = "CPU-backend engines" if args.cpu else f"{image} images (sm_90a)"
    print(f"{args.threads} SGEMM specializations compiled to {what}; {os.cpu_count()} cores; "
          f"median of {args.repeats}")
    # "cores busy": CPU seconds per wall-clock second, how many compiles ran at once.
    print(f"{'':24}{'total s':>10}{'per compile ms':>16}{'cores busy':>12}")
    medians = []
    for label, runs in (("one after another", sequential), (f"{args.threads} threads", threaded)):
        wall = statistics.median(w for w, _ in runs)
        busy = statistics.median(c / w for w, c in runs)
        medians.append(wall)
        print(f"{label:24}{wall:10.3f}{wall / args.threads * 1e3:16.1f}{busy:12.2f}")
    print(f"speed-up (one after another / threads): {medians[0] / medians[1]:.2f}x")


if __name__ == "__main__":
    main()
