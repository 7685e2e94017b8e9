"""What the tests share: text checks and fresh interpreters (checks), the
backend a test runs on (backends), kernels and IR that several test files
launch or compile, the property-based fuzzers, and the fake CUDA driver
(fake_cuda/libcuda.c)."""
