"""Per-kernel cost of many tiny launches: launched one by one, or replayed from a CUDA graph.

    python benchmarks/graphs.py [--kernels 1000] [--repeats 15]

Each path runs the same work: K launches in a row of a trivial kernel
(x[i] += 1 on 1024 float32, 4 blocks of 256 threads) on one non-blocking
stream. Per path, two ways:

- plain: the K launches called from Python one after another;
- graph: the same K launches captured once into a CUDA graph, then one
  replay per run.

Two figures per way, each the median over R runs, divided by K:

- wall: host clock around the batch and the stream's synchronise, which is
  what a caller waits for;
- GPU: CUDA events recorded on the stream before and after the batch, the
  device's time from the first kernel's start to the last one's end (for the
  plain launches it is set by how fast the host feeds the GPU).

Paths: mlirgpu (`@mg.kernel` and `mg.graph`), and as peers in the same run,
where importable, torch (`x.add_(1)`, `torch.cuda.CUDAGraph`) and CuPy (a
RawKernel, stream capture). Each path's result is checked after its runs.
"""
import argparse
import statistics
import time

import numpy as np

import mlirgpu as mg

N_ELEMENTS = 1024
BLOCK = 256

L = mg.generics("L")


@mg.kernel
def add_one(x: mg.memref[L, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    x[i] = x[i] + 1.0


CUDA_SOURCE = r"""
extern "C" __global__ void add_one(float *x) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] += 1.0f;
}
"""


class Path:
    """One library's way to run K tiny kernels on its stream: `plain()` queues
    the K launches, `replay()` one replay of the graph they were captured in;
    `synchronize()`, `new_event()`, `record(event)` and `elapsed_ms(start,
    end)` are the library's own stream and events; `value()` reads the array
    back. `added` counts the increments the array has seen."""

    added = 1   # each path launches its kernel once before capturing (compiling, loading, warming up)

    def measure(self, way):
        """(wall us, GPU us) per kernel of one run of `way` (plain or replay)."""
        start, end = self.new_event(), self.new_event()
        self.synchronize()
        begin = time.perf_counter()
        self.record(start)
        way()
        self.record(end)
        self.synchronize()
        wall = time.perf_counter() - begin
        self.added += self.kernels
        return wall / self.kernels * 1e6, self.elapsed_ms(start, end) / self.kernels * 1e3


class MlirgpuPath(Path):
    name = "mlirgpu (@mg.kernel, mg.graph)"

    def __init__(self, kernels):
        self.kernels = kernels
        self.x = mg.zeros(N_ELEMENTS)
        self.stream = mg.Stream(non_blocking=True)
        add_one(self.x, grid=N_ELEMENTS // BLOCK, block=BLOCK, stream=self.stream)   # compiles and loads
        with mg.graph(self.stream) as self.graph:
            self.plain()

    def plain(self):
        for _ in range(self.kernels):
            add_one(self.x, grid=N_ELEMENTS // BLOCK, block=BLOCK, stream=self.stream)

    def replay(self):
        self.graph.replay()

    def synchronize(self):
        self.stream.synchronize()

    def new_event(self):
        return mg.Event()

    def record(self, event):
        event.record(self.stream)

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def value(self):
        return self.x.get()


class TorchPath(Path):
    name = "torch (x.add_(1), torch.cuda.CUDAGraph)"

    def __init__(self, kernels):
        import torch
        self.torch, self.kernels = torch, kernels
        self.stream = torch.cuda.Stream()
        self.x = torch.zeros(N_ELEMENTS, device="cuda")
        with torch.cuda.stream(self.stream):
            self.x.add_(1)                    # warm-up on the side stream, as torch asks before capturing
        self.stream.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self.stream):
            self.plain_on_current()

    def plain_on_current(self):
        for _ in range(self.kernels):
            self.x.add_(1)

    def plain(self):
        with self.torch.cuda.stream(self.stream):
            self.plain_on_current()

    def replay(self):
        with self.torch.cuda.stream(self.stream):
            self.graph.replay()

    def synchronize(self):
        self.stream.synchronize()

    def new_event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, event):
        event.record(self.stream)

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def value(self):
        return self.x.cpu().numpy()


class CupyPath(Path):
    name = "CuPy (RawKernel, stream capture)"

    def __init__(self, kernels):
        import cupy
        self.cupy, self.kernels = cupy, kernels
        self.kernel = cupy.RawKernel(CUDA_SOURCE, "add_one")
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self.x = cupy.zeros(N_ELEMENTS, dtype=cupy.float32)
            self.kernel((N_ELEMENTS // BLOCK,), (BLOCK,), (self.x,))   # compiles and loads
            self.stream.begin_capture()
            self.plain_on_current()
            self.graph = self.stream.end_capture()

    def plain_on_current(self):
        for _ in range(self.kernels):
            self.kernel((N_ELEMENTS // BLOCK,), (BLOCK,), (self.x,))

    def plain(self):
        with self.stream:
            self.plain_on_current()

    def replay(self):
        self.graph.launch(self.stream)

    def synchronize(self):
        self.stream.synchronize()

    def new_event(self):
        return self.cupy.cuda.Event()

    def record(self, event):
        event.record(self.stream)

    def elapsed_ms(self, start, end):
        return self.cupy.cuda.get_elapsed_time(start, end)

    def value(self):
        return self.x.get()


def measure_all(paths, repeats):
    """{name: (plain wall, plain GPU, graph wall, graph GPU)} medians in us per
    kernel; the paths and ways take turns run after run, so that drift in
    clocks or load falls on all of them alike."""
    for path in paths:
        for way in (path.plain, path.replay):   # warm up: the first replay uploads the graph
            path.measure(way)
    runs = {path.name: [] for path in paths}
    for _ in range(repeats):
        for path in paths:
            runs[path.name].append(path.measure(path.plain) + path.measure(path.replay))
    for path in paths:
        expected = np.full(N_ELEMENTS, path.added, np.float32)
        assert np.array_equal(path.value(), expected), f"{path.name} computed a wrong result"
    return {name: tuple(statistics.median(r[i] for r in rs) for i in range(4)) for name, rs in runs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if not mg.cuda.is_available():
        raise SystemExit("graphs.py needs a CUDA GPU: mlirgpu.cuda.is_available() is False")
    mg.set_backend("cuda")
    paths = [MlirgpuPath(args.kernels)]
    for peer in (TorchPath, CupyPath):
        try:
            paths.append(peer(args.kernels))
        except ImportError as missing:
            print(f"{peer.name}: not importable ({missing})")
        except Exception as error:   # a peer that cannot capture here must not cost the run
            print(f"{peer.name}: failed to set up ({type(error).__name__}: {error})")
    rows = measure_all(paths, args.repeats)
    print(f"\nus per kernel, {mg.cuda.Device(0).name}: {args.kernels} tiny kernels a run, medians of "
          f"{args.repeats} runs; wall: host clock around the batch and its synchronise, GPU: CUDA events")
    print(f"| {'path':<42} | {'plain wall':>10} | {'graph wall':>10} | {'plain/graph':>11} "
          f"| {'plain GPU':>9} | {'graph GPU':>9} |")
    print(f"|{'-' * 44}|{'-' * 12}|{'-' * 12}|{'-' * 13}|{'-' * 11}|{'-' * 11}|")
    for name, (plain_wall, plain_gpu, graph_wall, graph_gpu) in rows.items():
        print(f"| {name:<42} | {plain_wall:10.2f} | {graph_wall:10.2f} | {plain_wall / graph_wall:10.2f}x "
              f"| {plain_gpu:9.2f} | {graph_gpu:9.2f} |")


if __name__ == "__main__":
    main()
