"""From MLIR to machine code: the NVVM pipeline to PTX and cubin
(nvvm.py), where ptxas comes from (toolkit.py), the CPU target's pass
pipeline (cpu.py), the compile cache (cache.py: the store; cache_key.py: keys
and why a kernel is compiled again; fingerprints.py: the globals a kernel
reads), and the MLIRGPU_LOG lines (log.py)."""
from .nvvm import CHIPS, CUDA_HOME, STAGES, Compilation, Target, compile_cubin, compile_ptx

__all__ = ["CHIPS", "CUDA_HOME", "STAGES", "Compilation", "Target", "compile_cubin", "compile_ptx"]
