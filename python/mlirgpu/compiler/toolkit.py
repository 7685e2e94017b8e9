"""Where ptxas comes from: the CUDA toolkit, NVIDIA's nvcc wheel, or nowhere.

A cubin needs ptxas. Where none is found, kernels still run: their PTX goes
to the driver, which compiles it when the module is loaded (its JIT keeps
the result in its own cache, ~/.nv/ComputeCache).

    PTXAS        the Toolkit found when mlirgpu was imported, or None
    find()       the same search again: a Toolkit or None

The search: with CUDA_HOME set, $CUDA_HOME/bin/ptxas and nothing else (an
explicit choice, an empty one included); else /usr/local/cuda (the toolkit
mlirgpu was built for), then the `nvidia-cuda-nvcc-cu12` wheel's ptxas, then
ptxas on PATH.
"""
import importlib.util
import os
from typing import NamedTuple

from .. import _mlirgpu

__all__ = ["PTXAS", "Toolkit", "find"]


class Toolkit(NamedTuple):
    """A ptxas and the toolkit directory it sits in (`home`/bin/ptxas)."""
    home: str
    ptxas: str
    source: str   # "CUDA_HOME", "toolkit", "nvidia-cuda-nvcc wheel" or "PATH"


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


def find():
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


PTXAS = find()
