"""Hopper on the GPU (sm_90a: H100, H200): clusters launch, and the
warp-specialized wgmma GEMM of examples/tensorcore matches float64 products
at tile multiples and odd sizes, for every input and output type."""
import os
import sys

import numpy as np
import pytest

import mlirgpu as mg

pytestmark = pytest.mark.gpu

ml_dtypes = pytest.importorskip("ml_dtypes")  # NumPy's bf16
EXAMPLES = os.path.abspath(os.path.join(__file__, os.pardir, os.pardir, os.pardir, "examples", "tensorcore"))
sys.path.insert(0, EXAMPLES)
import hopper_gemm  # noqa: E402
sys.path.remove(EXAMPLES)


@pytest.fixture(autouse=True)
def hopper():
    if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
        pytest.skip("needs a Hopper GPU (sm_90a)")


# --------------------------------------------------------------------------
# Clusters (TMA boxes on each backend: test_cpu_hopper.py)
# --------------------------------------------------------------------------

@mg.kernel
def cluster_ranks(X: mg.memref[8, mg.i32]):
    if mg.thread_idx.x == 0:
        X[mg.block_idx.x] = mg.warpgroup.cluster_rank()
    mg.warpgroup.cluster_sync()


def test_cluster_launch_gives_each_block_its_rank():
    X = mg.to_device(np.full(8, -1, np.int32))
    cluster_ranks(X, grid=8, block=32, cluster=(2, 1, 1))
    assert X.get().tolist() == [0, 1, 0, 1, 0, 1, 0, 1]


# --------------------------------------------------------------------------
# The GEMM
# --------------------------------------------------------------------------

TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}


def run_gemm(M, N, K, dtype, out_dtype, config, seed=0):
    a, b, dA, dB = hopper_gemm._inputs(M, N, K, dtype, config.b_major, seed)
    C = mg.to_device(np.full((M, N), np.nan, out_dtype.numpy))  # poisoned: every element must be written
    hopper_gemm.matmul(dA, dB, out_dtype, config, C=C)
    got = C.get().astype(np.float64)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isfinite(got).all(), "elements of C were not written"
    error = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    assert error < TOLERANCE[out_dtype.numpy.name], (M, N, K, error)


@pytest.mark.parametrize("b_major", ["MN", "K"])
@pytest.mark.parametrize("M, N, K", [(128, 256, 64), (512, 768, 1024), (1024, 1024, 4096)])
def test_gemm_at_tile_multiples(M, N, K, b_major):
    run_gemm(M, N, K, mg.bf16, mg.f32, hopper_gemm.Config(256, 64, 4, b_major))


@pytest.mark.parametrize("b_major", ["MN", "K"])
@pytest.mark.parametrize("M, N, K", [(1000, 520, 77), (129, 257, 65), (1, 8, 8), (77, 1000, 1000), (300, 7, 9)])
def test_gemm_at_odd_sizes(M, N, K, b_major):
    run_gemm(M, N, K, mg.bf16, mg.f32, hopper_gemm.Config(256, 64, 4, b_major))


@pytest.mark.parametrize("dtype", [mg.bf16, mg.f16])
@pytest.mark.parametrize("out_dtype", [mg.f32, mg.bf16, mg.f16])
def test_gemm_every_type(dtype, out_dtype):
    run_gemm(640, 384, 320, dtype, out_dtype, hopper_gemm.Config(256, 64, 4, "MN"))


@pytest.mark.parametrize("config", hopper_gemm.CONFIGS, ids=repr)
def test_gemm_every_config(config):
    run_gemm(1000, 1000, 1000, mg.bf16, mg.bf16, config)


# The epilogue through shared memory and TMA stores, the tiles shared by
# multicast in clusters of 2, and the ping-pong schedule: at tile multiples (of the cluster's tile too),
# at odd sizes (TMA clips the stores at C's edges; a C whose rows are not
# 16-byte multiples falls back to the register epilogue), every type.
TMA_STORE = hopper_gemm.Config(256, 64, 4, epilogue="tma")
OPTIONS = [TMA_STORE, hopper_gemm.Config(256, 64, 4, epilogue="tma", multicast="B"),
           hopper_gemm.Config(256, 64, 4, multicast="B"), hopper_gemm.Config(128, 64, 6, epilogue="tma", multicast="A"),
           hopper_gemm.Config(128, 64, 6, epilogue="tma", schedule="pingpong"),
           hopper_gemm.Config(128, 64, 6, multicast="B", schedule="pingpong")]


@pytest.mark.parametrize("b_major", ["MN", "K"])
@pytest.mark.parametrize("config", OPTIONS, ids=lambda c: c.name)
def test_gemm_options_at_tile_multiples(config, b_major):
    run_gemm(512, 768, 1024, mg.bf16, mg.f32, config.replace(b_major=b_major))


@pytest.mark.parametrize("M, N, K, b_major", [(1000, 520, 77, "MN"), (1000, 520, 77, "K"), (300, 7, 9, "MN")])
@pytest.mark.parametrize("config", OPTIONS, ids=lambda c: c.name)
def test_gemm_options_at_odd_sizes(config, M, N, K, b_major):
    run_gemm(M, N, K, mg.bf16, mg.bf16, config.replace(b_major=b_major))


@pytest.mark.parametrize("dtype", [mg.bf16, mg.f16])
@pytest.mark.parametrize("out_dtype", [mg.f32, mg.bf16, mg.f16])
@pytest.mark.parametrize("config", OPTIONS[1:2], ids=lambda c: c.name)
def test_gemm_options_every_type(config, dtype, out_dtype):
    run_gemm(640, 392, 320, dtype, out_dtype, config)


# --------------------------------------------------------------------------
# 8-bit inputs: B given as N x K, a scale per tensor
# --------------------------------------------------------------------------

# The tensor cores sum 8-bit products in an accumulator of less than f32's
# precision (cuBLAS's "fast accumulation"): about 1e-3 of the largest value
# at K = 4096. The output's rounding (bf16: 2**-9) comes on top.
FP8_TOLERANCE = {"float32": 4e-3, "bfloat16": 1e-2, "float16": 4e-3}


def run_fp8_gemm(M, N, K, config, dtype=mg.f8e4m3, out_dtype=mg.bf16, scale_a=0.25, scale_b=3.0, seed=0):
    config = config.replace(b_major="K")
    a, b, dA, dB = hopper_gemm._inputs(M, N, K, dtype, "K", seed)
    C = mg.to_device(np.full((M, N), np.nan, out_dtype.numpy))  # poisoned: every element must be written
    hopper_gemm.matmul(dA, dB, out_dtype, config, C=C, scale_a=scale_a, scale_b=scale_b)
    got = C.get().astype(np.float64)
    # The float64 product of the dequantized inputs.
    expected = (a.astype(np.float64) * scale_a) @ (b.astype(np.float64) * scale_b)
    assert np.isfinite(got).all(), "elements of C were not written"
    error = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    assert error < FP8_TOLERANCE[out_dtype.numpy.name], (M, N, K, error)


@pytest.mark.parametrize("M, N, K", [(128, 256, 128), (512, 768, 1024), (1024, 1024, 4096)])
def test_fp8_gemm_at_tile_multiples(M, N, K):
    run_fp8_gemm(M, N, K, hopper_gemm.CONFIGS[0])


@pytest.mark.parametrize("M, N, K", [(1000, 520, 77), (129, 257, 65), (1, 16, 16), (300, 7, 9)])
def test_fp8_gemm_at_odd_sizes(M, N, K):
    run_fp8_gemm(M, N, K, hopper_gemm.CONFIGS[0])


@pytest.mark.parametrize("dtype", [mg.f8e4m3, mg.f8e5m2])
@pytest.mark.parametrize("out_dtype", [mg.f32, mg.bf16, mg.f16])
def test_fp8_gemm_every_type(dtype, out_dtype):
    run_fp8_gemm(640, 384, 320, hopper_gemm.CONFIGS[0], dtype, out_dtype)


@pytest.mark.parametrize("config", hopper_gemm.CONFIGS, ids=repr)
def test_fp8_gemm_every_config(config):
    run_fp8_gemm(1000, 1000, 1000, config)


def test_fp8_gemm_scales_multiply_the_product():
    # Scales that are powers of two change only the exponent: the bits match exactly.
    config = hopper_gemm.CONFIGS[0].replace(b_major="K")
    a, b, dA, dB = hopper_gemm._inputs(256, 256, 256, mg.f8e4m3, "K")
    plain = hopper_gemm.matmul(dA, dB, mg.f32, config).get()
    scaled = hopper_gemm.matmul(dA, dB, mg.f32, config, scale_a=0.5, scale_b=8.0).get()
    np.testing.assert_array_equal(scaled, plain * 4)


def test_fp8_gemm_reads_torch_tensors():
    torch = pytest.importorskip("torch")
    config = hopper_gemm.CONFIGS[0].replace(b_major="K")
    a, b, dA, dB = hopper_gemm._inputs(256, 512, 384, mg.f8e4m3, "K")
    A = torch.from_numpy(a.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    B = torch.from_numpy(np.ascontiguousarray(b.T).view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    C = torch.empty((256, 512), dtype=torch.bfloat16, device="cuda")
    hopper_gemm.launch(A, B, C, config, scale_a=0.5, scale_b=0.25)
    torch.cuda.synchronize()
    expected = torch._scaled_mm(A, B.t(), torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda"),
                                out_dtype=torch.bfloat16)
    error = (C.float() - expected.float()).abs().max() / expected.float().abs().max()
    assert error.item() < 1e-2


def test_fp8_gemm_sass_runs_on_qgmma():
    # 8-bit wgmmas are QGMMA in SASS.
    import shutil
    import subprocess
    import tempfile
    cuobjdump = shutil.which("cuobjdump") or os.path.join(mg.compiler.CUDA_HOME, "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("no cuobjdump")
    config = hopper_gemm.CONFIGS[0].replace(b_major="K").for_dtype(mg.f8e4m3)
    cubin = hopper_gemm.kernel_for(config, mg.f8e4m3)[8192, 8192, mg.bf16].cubin("sm_90a")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    assert "QGMMA.64x256x32.F32" in sass  # (cuobjdump may add .E4M3.E4M3)
    assert "UTMALDG" in sass
    assert "HMMA" not in sass.replace("HGMMA", "") and "HGMMA" not in sass


def test_gemm_sass_runs_on_hgmma():
    # The instruction the H100 runs: HGMMA (not HMMA or FFMA), fed by UTMALDG.
    import shutil
    import subprocess
    import tempfile
    cuobjdump = shutil.which("cuobjdump") or os.path.join(mg.compiler.CUDA_HOME, "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("no cuobjdump")
    cubin = hopper_gemm.kernel_for(hopper_gemm.CONFIGS[0], mg.bf16)[8192, 8192, mg.bf16].cubin("sm_90a")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    assert "HGMMA.64x256x16.F32.BF16" in sass
    assert "UTMALDG" in sass
    if hopper_gemm.CONFIGS[0].epilogue == "tma":
        assert "UTMASTG" in sass  # C leaves by TMA stores
    assert "HMMA" not in sass.replace("HGMMA", "")
