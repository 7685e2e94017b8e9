"""Device functions that take shared memory, on both backends and in PTX, and
errors of the NVVM stages that point at the user's line."""
import numpy as np

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import ir, thread_idx

N, M = mg.generics("N M")


@mg.func
def stage(tile, i, value):
    tile[i] = value * 2.0


@mg.func
def neighbour_sum(tile, i, n):
    return tile[i] + tile[(i + 1) % n]


@mg.kernel
def through_functions(X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32]):
    tile = mg.shared.array((N,), mg.f32)
    t = thread_idx.x
    stage(tile, t, X[t])
    mg.syncthreads()
    Y[t] = neighbour_sum(tile, t, N)


def test_shared_memory_passed_to_device_functions(backend):
    X = np.arange(64, dtype=np.float32)
    Y = np.zeros(64, np.float32)
    through_functions(X, Y, grid=1, block=64)
    np.testing.assert_array_equal(Y, 2 * X + 2 * np.roll(X, -1))


def test_shared_memory_parameter_in_ptx(tmp_path):
    ptx = through_functions[64].ptx(chip="sm_90a")
    # The device function's parameter and stores are in the shared window.
    filecheck(ptx, r"st\.shared\.b32", r"ld\.shared\.b32")
    ptxas_accepts(ptx, "sm_90a", tmp_path)


def test_nvvm_stage_error_names_the_line():
    # memref.generic_atomic_rmw on floats has no NVVM lowering: the error carries the op's line.
    text = """
    module attributes {gpu.container_module} {
      gpu.module @kernels {
        gpu.func @k(%m: memref<4xf32>) kernel {
          %c0 = arith.constant 0 : index
          %r = memref.generic_atomic_rmw %m[%c0] : memref<4xf32> {
          ^bb0(%current: f32):
            %one = arith.constant 1.0 : f32
            memref.atomic_yield %one : f32
          } loc("user_kernel.py":17:0)
          gpu.return
        }
      }
    }"""
    with ir.Context():
        module = ir.Module.parse(text)
        try:
            mg.compile_ptx(module)
        except mg.CompileError as error:
            assert (error.filename, error.lineno) == ("user_kernel.py", 17)
            assert str(error).startswith("user_kernel.py:17: ")
        else:
            raise AssertionError("compiled a float generic_atomic_rmw")
