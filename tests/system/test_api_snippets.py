"""The user-facing forms of the API as a user writes them: specializing, inspecting, compiling without a GPU, launching."""
import numpy as np
import pytest
from support import kernels_sgemm
from support.kernels_sgemm import sgemm_naive

import mlirgpu as mg


def test_specialize_inspect_compile_without_a_gpu():
    spec = sgemm_naive[256, 128, 256, mg.f32]   # generics in declared order
    text = spec.ir()                            # gpu dialect module, with Python file:line locations
    assert "gpu.func @sgemm_naive(%arg0: memref<256x128xf32>" in text
    lines = open(kernels_sgemm.example.__file__).read().splitlines()
    line = next(i for i, text_line in enumerate(lines, 1) if "tmp += A[r, k] * B[k, c]" in text_line)
    assert f'sgemm_naive.py":{line}:0' in text
    ptx = spec.ptx(chip="sm_90a")               # str; needs no GPU
    assert ".target sm_90a" in ptx and ".visible .entry sgemm_naive" in ptx
    cubin = spec.cubin(chip="sm_90a")           # bytes; needs no GPU
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF"


@pytest.mark.usefixtures("backend")   # once per backend: cpu, and cuda where there is a GPU
def test_launch():
    A = np.random.rand(256, 128).astype(np.float32)
    B = np.random.rand(128, 256).astype(np.float32)
    dA, dB = mg.to_device(A), mg.to_device(B)
    dC = mg.empty((256, 256), mg.f32)
    sgemm_naive(dA, dB, dC, grid=(16, 16), block=(16, 16))   # generics inferred from args
    spec = sgemm_naive[256, 128, 256, mg.f32]
    spec(dA, dB, dC, grid=(16, 16), block=(16, 16))          # or on a specialization
    C = dC.get()                                              # numpy.ndarray
    assert isinstance(C, np.ndarray)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B + 1.0, rtol=1e-5)


def test_ir_layer_underneath():
    from mlirgpu import ir, passes
    text = """
    module attributes {gpu.container_module} {
      gpu.module @kernels {
        gpu.func @add(%a: memref<4xf32>, %b: memref<4xf32>) kernel {
          %i = gpu.thread_id x
          %x = memref.load %a[%i] : memref<4xf32>
          %y = arith.addf %x, %x : f32
          memref.store %y, %b[%i] : memref<4xf32>
          gpu.return
        }
      }
    }"""
    m = ir.Module.parse(text)            # raises mg.MLIRError with the diagnostics on bad IR
    m.verify(); print(m)
    passes.run(m, "builtin.module(canonicalize,cse)")
    ptx = mg.compile_ptx(m, chip="sm_90a")
    assert ".visible .entry add" in ptx
    with pytest.raises(mg.MLIRError) as error:
        ir.Module.parse(text.replace("arith.addf %x, %x", "arith.addf %x, %i"))
    assert error.value.diagnostics[0][0] == "error"


@pytest.mark.usefixtures("backend")
def test_element_wise_kernels_from_scalar_functions():
    @mg.vectorize
    def foo(a, b, c):
        x = a + 1.0
        y = b - 2.0
        z = c + 3.0
        return x + y + z

    ary = np.arange(100, dtype=np.float64).reshape(10, 10)
    got = foo(ary, ary, ary)          # NumPy in, NumPy out; device arrays in, device array out
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, 3 * ary + 2.0)
    dary = mg.to_device(ary)
    dgot = foo(dary, dary, dary)
    assert isinstance(dgot, mg.DeviceArray)
    np.testing.assert_array_equal(dgot.get(), 3 * ary + 2.0)
