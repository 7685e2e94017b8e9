"""Where ptxas comes from: the CUDA toolkit, NVIDIA's nvcc wheel, or nowhere.

A cubin needs ptxas. Where none is found, kernels still run: their PTX goes
to the driver, which compiles it when the module is loaded (its JIT keeps
the result in its own cache, ~/.nv/ComputeCache).

    PTXAS              the Toolkit found when mlirgpu was imported, or None
    find()             the same search again: a Toolkit or None
    cuda_version(home) the version of the CUDA toolkit in a directory

The search: with CUDA_HOME set, $CUDA_HOME/bin/ptxas and nothing else (an
explicit choice, an empty one included); else /usr/local/cuda (the toolkit
mlirgpu was built for), then the `nvidia-cuda-nvcc-cu12` wheel's ptxas, then
ptxas on PATH.
"""
from __future__ import annotations

import importlib.util
import json
import os
from typing import NamedTuple

from .. import _mlirgpu

__all__ = ["PTXAS", "Toolkit", "cuda_version", "find"]


class Toolkit(NamedTuple):
    """A ptxas and the toolkit directory it sits in (`home`/bin/ptxas)."""
    home: str
    ptxas: str
    source: str   # "CUDA_HOME", "toolkit", "nvidia-cuda-nvcc wheel" or "PATH"

    def version(self) -> str:
        """The CUDA version of this ptxas: the nvcc wheel's own version for
        the wheel's ptxas, else cuda_version(home)."""
        if self.source == "nvidia-cuda-nvcc wheel":
            import importlib.metadata  # here: importing it costs more than the rest of mlirgpu's modules

            try:
                return importlib.metadata.version("nvidia-cuda-nvcc-cu12")
            except importlib.metadata.PackageNotFoundError:
                pass
        return cuda_version(self.home)


def _in(home, source):
    ptxas = os.path.join(home, "bin", "ptxas")
    return Toolkit(home, ptxas, source) if os.access(ptxas, os.X_OK) else None


def _nvcc_wheel():
    """nvidia/cuda_nvcc of the nvidia-cuda-nvcc-cu12 wheel, if installed."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except (ImportError, ValueError):
        return None
    for home in (spec.submodule_search_locations or []) if spec else []:
        found = _in(home, "nvidia-cuda-nvcc wheel")
        if found:
            return found
    return None


def find() -> Toolkit | None:
    """The Toolkit whose ptxas makes cubins, or None (PTX to the driver's JIT)."""
    home = os.environ.get("CUDA_HOME")
    if home is not None:
        return _in(home, "CUDA_HOME")
    found = _in(_mlirgpu.CUDA_HOME, "toolkit") or _nvcc_wheel()
    if found is None:
        import shutil  # here: with its archive formats it costs more to import than this whole layer

        ptxas = shutil.which("ptxas")
        if ptxas:
            ptxas = os.path.realpath(ptxas)
            found = Toolkit(os.path.dirname(os.path.dirname(ptxas)), ptxas, "PATH")
    return found


def cuda_version(cuda_home: str) -> str:
    """The version of the CUDA toolkit in `cuda_home`: version.json, else
    the nvcc wheel's dist-info, else CUDA_VERSION in cuda.h, else "unknown"."""
    try:
        with open(os.path.join(cuda_home, "version.json")) as f:
            return str(json.load(f)["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        for name in sorted(os.listdir(os.path.join(cuda_home, "dist-info"))):
            if name.startswith("nvidia_cuda_nvcc-") and name.endswith(".dist-info"):
                return name[len("nvidia_cuda_nvcc-"):-len(".dist-info")]
    except OSError:
        pass
    try:
        with open(os.path.join(cuda_home, "include", "cuda.h")) as f:
            for line in f:
                if line.startswith("#define CUDA_VERSION "):
                    number = int(line.split()[2])
                    return f"{number // 1000}.{number % 1000 // 10}"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


PTXAS = find()
