"""What this mlirgpu installation runs on: `python -m mlirgpu.info`.

Prints the versions of mlirgpu, MLIR, Python and NumPy, the CUDA driver and
each GPU with its chip, the compile cache's directory, and how kernels
become machine code: ptxas (which one) or the driver's JIT. Needs no GPU.
"""
import os
import platform
import sys

import numpy

from . import _mlirgpu, cuda
from ._version import __version__
from .compiler import cache, toolkit

__all__ = ["report", "main"]


def _mlir_linking():
    """Where MLIR's code is: in the extension itself, or libMLIR.so."""
    for path in _mlirgpu.shared_objects():
        if os.path.basename(path).startswith("libMLIR.so"):
            return f"from {os.path.realpath(path)}"
    return "linked into the extension"


def _ptxas():
    found = toolkit.PTXAS
    if found is None:
        return "none found: kernels load as PTX, compiled by the driver's JIT"
    return f"{found.ptxas} ({found.source})"


def report():
    """The lines `python -m mlirgpu.info` prints, as (label, value) pairs."""
    lines = [("mlirgpu", f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})"),
             ("MLIR", f"{_mlirgpu.MLIR_VERSION}, {_mlir_linking()}"),
             ("Python", f"{platform.python_version()} ({sys.executable})"),
             ("NumPy", numpy.__version__)]
    if cuda.is_available():
        version = cuda.driver_version()
        lines.append(("CUDA driver", f"{version // 1000}.{version % 1000 // 10}"))
        for index in range(cuda.device_count()):
            device = cuda.Device(index)
            lines.append((f"GPU {index}", f"{device.name}, {device.chip}, "
                                          f"{device.total_memory / 2**30:.1f} GiB"))
    else:
        try:
            cuda.driver_version()
            reason = "no GPU"
        except cuda.CudaError as error:
            reason = str(error)
        lines.append(("CUDA driver", f"none: {reason} (kernels can still run on the CPU backend)"))
    lines.append(("cache", str(cache.default_directory())))
    lines.append(("ptxas", _ptxas()))
    return lines


def main():
    lines = report()
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
