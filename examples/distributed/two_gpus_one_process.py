"""One process driving two GPUs: a kernel on each, on a stream of that
GPU, running at the same time. Events recorded around each kernel time it on
its own GPU; the printed timeline shows when each was launched (host clock),
how long it ran, and the wall time of the pair against the two run one after
the other. Results are checked against NumPy.

    python examples/distributed/two_gpus_one_process.py [ITERATIONS]

A kernel launch runs on the device of its arrays: the arrays (and the
stream, and the events) are made inside `with mg.cuda.device(i):`, the
launches need nothing more.
"""
import sys
import time

import numpy as np

import mlirgpu as mg

N = mg.generics("N")


@mg.kernel
def relax(X: mg.memref[N, mg.f32], iterations: mg.i32):
    """x <- 0.5 * x + 0.25, `iterations` times per element: long-running on purpose."""
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < N:
        x = X[i]
        for _ in range(iterations):
            x = x * 0.5 + 0.25
        X[i] = x


def reference(x, iterations):
    # Each step halves the distance to 0.5: after enough steps every element sits at 0.5.
    out = x.astype(np.float64)
    for _ in range(min(iterations, 200)):
        out = out * 0.5 + 0.25
    return out


def main():
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    if mg.cuda.device_count() < 2:
        print(f"this example needs two GPUs; {mg.cuda.device_count()} found")
        return 1
    n = 132 * 2048
    rng = np.random.default_rng(0)
    hosts, work = [], []
    for ordinal in (0, 1):
        with mg.cuda.device(ordinal) as device:
            host = rng.standard_normal(n).astype(np.float32)
            hosts.append(host)
            work.append({"device": device, "X": mg.to_device(host), "stream": mg.Stream(non_blocking=True),
                         "start": mg.Event(), "end": mg.Event()})
    grid, block = (n + 255) // 256, 256
    for w in work:   # compile and load on both devices before timing
        relax(w["X"], 1, grid=grid, block=block, stream=w["stream"])
    for w in work:
        w["stream"].synchronize()

    begin = time.perf_counter()
    for w in work:
        w["launched"] = (time.perf_counter() - begin) * 1e3
        w["start"].record(w["stream"])
        relax(w["X"], iterations, grid=grid, block=block, stream=w["stream"])
        w["end"].record(w["stream"])
    for w in work:
        w["end"].synchronize()
    wall = (time.perf_counter() - begin) * 1e3

    print(f"{'device':<28} {'launched at':>12} {'ran':>10}")
    for w in work:
        w["ran"] = w["start"].elapsed_time(w["end"])
        bar = " " * int(40 * w["launched"] / wall) + "#" * max(1, int(40 * w["ran"] / wall))
        print(f"{w['device'].ordinal}: {w['device'].name:<25} {w['launched']:>9.3f} ms {w['ran']:>7.2f} ms  |{bar}")
    serial = sum(w["ran"] for w in work)
    print(f"wall time {wall:.2f} ms for both kernels; one after the other they take {serial:.2f} ms "
          f"({serial / wall:.2f}x)")

    ok = True
    for w, host in zip(work, hosts):
        # one warm-up pass of 1 iteration, then `iterations` more
        expected = reference(reference(host, 1), iterations)
        ok &= np.allclose(w["X"].get(), expected, atol=1e-6)
    print("both results match NumPy" if ok else "MISMATCH against NumPy")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
