"""mlirgpu.ops.scaled_matmul: each bad input's exception, the kernel on the
CPU backend (which emulates its 8-bit wgmmas), the torch op's fake implementation, and
on an sm_90a GPU against torch._scaled_mm (float64 of the 8-bit values
where torch has none)."""
import sys

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops

from support.backends import current_backend
from support.checks import assert_each_close, on_two_streams

ml_dtypes = pytest.importorskip("ml_dtypes")
gemm = sys.modules["mlirgpu.ops.gemm"]
scaled_gemm = sys.modules["mlirgpu.ops.scaled_gemm"]

E4M3 = ml_dtypes.float8_e4m3fn


def operands(m, k, n, seed=0):
    """a (M, K) row-major and b (K, N) column-major, f8e4m3."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(E4M3), rng.standard_normal((n, k)).astype(E4M3).T


@pytest.mark.parametrize("m, k, n, out_dtype", [(100, 96, 48, "bf16"), (7, 272, 80, "f32")])
def test_the_cpu_backend_runs_the_kernel(m, k, n, out_dtype):
    # The Hopper FP8 GEMM, its TMA copies and 8-bit wgmmas emulated: odd rows, a K that ends
    # inside a step, the scales (a number and an array of one element) on the f32 sums.
    a, b = operands(m, k, n)
    with current_backend("cpu"):
        c = mlirgpu.ops.scaled_matmul(a, b, 0.5, np.array([2.0], np.float32), out_dtype=out_dtype)
    assert c.shape == (m, n) and c.dtype == np.dtype(mg.dtype(out_dtype).numpy)
    expected = 0.5 * 2.0 * (a.astype(np.float64) @ b.astype(np.float64))
    rounding = 2.0 ** -8 if out_dtype == "bf16" else 1e-6
    np.testing.assert_allclose(c.astype(np.float64), expected, rtol=rounding, atol=rounding * np.abs(expected).max())


def test_bad_shapes_layouts_and_dtypes_are_a_launch_error(device):
    device("sm_90a")
    a, b = operands(32, 64, 48)
    with pytest.raises(mg.LaunchError, match="do not multiply: a has 64 columns, b 48 rows"):
        mlirgpu.ops.scaled_matmul(a, b.T, 1.0, 1.0)
    with pytest.raises(mg.LaunchError, match="2-d arrays"):
        mlirgpu.ops.scaled_matmul(a.reshape(32, 8, 8), b, 1.0, 1.0)
    with pytest.raises(mg.LaunchError, match="f8e4m3"):
        mlirgpu.ops.scaled_matmul(a.astype(np.float16), b, 1.0, 1.0)
    with pytest.raises(mg.LaunchError, match="column-major"):
        mlirgpu.ops.scaled_matmul(a, b.copy(), 1.0, 1.0)
    a, b = operands(32, 40, 48)
    with pytest.raises(mg.LaunchError, match="K and N multiples of 16.*K = 40, N = 48"):
        mlirgpu.ops.scaled_matmul(a, b, 1.0, 1.0)
    assert issubclass(mg.LaunchError, ValueError)


def test_bad_scales_and_output_dtypes_are_a_launch_error(device):
    device("sm_90a")
    a, b = operands(32, 64, 48)
    with pytest.raises(mg.LaunchError, match=r"per-tensor scale.*shape \(2,\)"):
        mlirgpu.ops.scaled_matmul(a, b, np.ones(2, np.float32), 1.0)
    with pytest.raises(mg.LaunchError, match="out_dtype is bf16, f16 or f32"):
        mlirgpu.ops.scaled_matmul(a, b, 1.0, 1.0, out_dtype=mg.i32)


# ==========================================================================
# torch.ops.mlirgpu.scaled_matmul (where torch is installed)

def test_the_torch_op_has_a_fake_implementation_of_the_output_shape():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = scaled_gemm.register_torch()
    assert op is torch.ops.mlirgpu.scaled_matmul
    with FakeTensorMode():
        a = torch.empty((7, 32), dtype=torch.float8_e4m3fn)
        b = torch.empty((16, 32), dtype=torch.float8_e4m3fn).t()
        scale = torch.ones((), dtype=torch.float32)
        c = op(a, b, scale, scale, torch.float16)
        assert (tuple(c.shape), c.dtype) == ((7, 16), torch.float16)
        with pytest.raises(RuntimeError, match=r"multiplies \(M, K\) by \(K, N\)"):
            op(a, b.t(), scale, scale, torch.float16)


# ==========================================================================
# On an sm_90a GPU, against torch._scaled_mm

GPU_SHAPES = [(16, 4096, 4096), (4096, 4096, 4096), (1000, 512, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("m, k, n", GPU_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in GPU_SHAPES])
def test_scaled_matmul_on_the_gpu(m, k, n, out_dtype):
    torch = pytest.importorskip("torch")
    kind = {"bf16": torch.bfloat16, "f32": torch.float32}[out_dtype]
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            with pytest.raises(mg.LaunchError, match="needs an sm_90a GPU"):
                mlirgpu.ops.scaled_matmul(torch.zeros((16, 16), device="cuda").to(torch.float8_e4m3fn),
                                          torch.zeros((16, 16), device="cuda").to(torch.float8_e4m3fn).t(), 1.0, 1.0)
            return
        generator = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn((m, k), device="cuda", generator=generator).to(torch.float8_e4m3fn)
        b = torch.randn((n, k), device="cuda", generator=generator).to(torch.float8_e4m3fn).t()
        scale_a = torch.tensor(0.5, device="cuda")
        scale_b = torch.tensor(0.25, device="cuda")
        c = mlirgpu.ops.scaled_matmul(a, b, scale_a, scale_b, out_dtype=mg.dtype(out_dtype))
        op = torch.ops.mlirgpu.scaled_matmul(a, b, scale_a.reshape(1), scale_b.reshape(1), kind)
        torch.cuda.synchronize()
        exact = (a.double() @ b.double()) * 0.125
        try:
            # The peer that sums as wgmma does: FP8 products accumulate at reduced precision, with no
            # promotion to float32 every few steps.
            theirs = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=kind,
                                      use_fast_accum=True).double()
        except (AttributeError, RuntimeError):
            theirs = exact
    assert c.dtype == kind and tuple(c.shape) == (m, n)
    scale = exact.abs().max().item()
    ours = (c.double() - exact).abs().max().item()
    # Exact products of 8-bit values, summed by wgmma's FP8 accumulator, which keeps fewer bits than float32.
    assert ours / scale < 1e-2
    assert ours <= (theirs - exact).abs().max().item() + scale * 1e-3
    assert torch.equal(c, op)


@pytest.mark.gpu
def test_launches_from_c_follow_moved_arrays_scales_and_torchs_stream():
    # After the first call, calls with arrays of the same signature and scales that are Python numbers
    # launch from C: each passes its own scales, the maps are encoded anew where an array moved, and
    # each launch goes to torch's current stream.
    torch = pytest.importorskip("torch")
    m, k, n = 256, 1024, 512
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("scaled_matmul runs on sm_90a GPUs")
        a = [torch.randn((m, k), device="cuda").to(torch.float8_e4m3fn) for _ in range(4)]
        b = torch.randn((n, k), device="cuda").to(torch.float8_e4m3fn).t()
        products = [x.float() @ b.float() for x in a]
        # Each call its own scales: Python numbers, passed per call.
        scales = [[(0.5 + step, 0.25 * (i + 1)) for i in range(len(a))] for step in range(3)]
        results = on_two_streams(
            torch, len(a), lambda step, i, out: mlirgpu.ops.scaled_matmul(
                a[i], b, *scales[step][i], torch.bfloat16 if out is None else torch.float32, out=out),
            lambda: torch.empty((m, n), device="cuda", dtype=torch.float32))
        kept = len(scaled_gemm._KEPT)
    assert kept >= 2
    assert_each_close(results, lambda step, i: products[i] * (scales[step][i][0] * scales[step][i][1]))