"""Running compiled code: the backends and device arrays (backend.py, which
chooses one of gpu.py's CudaBackend and cpu.py's CpuBackend), kernels and
their launches (kernel.py, compiled.py, scalars.py), the CPU backend's
launches (cpu.py), element-wise kernels (vectorize.py), autotuning
(autotune.py), streams and graphs (streams.py) and host programs
(host_program.py)."""
