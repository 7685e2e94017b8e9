"""The lowerings: what the kernel language's target-dependent operations
become. gpu.py's GpuLowering emits the gpu and nvvm dialects for the CUDA
backend; cpu.py's CpuLowering emits a host function and calls of the CPU
runtime. A trace is given one (the GPU's by default) and the language asks
it, never knowing which it is."""
