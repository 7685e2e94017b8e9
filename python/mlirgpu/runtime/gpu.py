"""The CUDA backend: kernels launch on the current GPU through the driver,
arrays live in device memory, and a kernel's C dispatcher launches the
signatures registered with it without calling back into Python.
docs/design/cuda_runtime.md has the rules.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _mlirgpu, cuda
from .._mlirgpu import Stream
from .backend_interface import Backend, Dims, KernelSpecialization, VectorizedCall
__all__ = ["CudaBackend"]

_device_names = {}   # ordinal -> name: asking the driver each launch of a tuned kernel costs


class CudaBackend(Backend):
    name, host, captures_graphs, dispatches_in_c = "cuda", False, True, True

    def launch(self, spec: KernelSpecialization, args: list, grid: Dims, block: Dims, shared_mem: int,
               stream: Stream | None, cluster: Dims | None) -> None:
        # Loaded and launched on the arrays' device, which is current meanwhile (NumPy arrays go there).
        with spec.loaded(args) as function:
            host = [(i, a) for i, a in enumerate(args) if isinstance(a, np.ndarray)]
            if host:
                args = list(args)
                for i, a in host:
                    args[i] = _mlirgpu.to_device(a, stream=stream)
            if cluster is None:
                function(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream)
            else:
                function(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream, cluster=cluster)
            for i, a in host:
                # NumPy arrays are copied in, and back after the launch.
                np.copyto(a, args[i].get(stream=stream))

    def max_cooperative_grid_blocks(self, spec: KernelSpecialization, block: Dims, shared_mem: int) -> int:
        return spec.function().max_cooperative_grid_blocks(block, shared_mem=shared_mem)

    def tuning_device(self) -> str:
        ordinal = cuda.current_device()
        name = _device_names.get(ordinal)
        if name is None:
            name = _device_names[ordinal] = cuda.Device(ordinal).name
        return name

    def run_vectorized(self, plan: VectorizedCall, stream: Stream | None) -> Any:
        return plan.run_gpu(stream)
