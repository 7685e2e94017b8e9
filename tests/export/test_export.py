"""mg.export and mg.load_library: the library's files, its dependencies and
symbols, dispatch by size and by divisibility, its CPU builds, the command
line, the C program of examples/export, and bad input.

The CPU builds run here; the GPU path runs against the stand-in libcuda
(tests/support/fake_cuda), which shows what the library hands the driver,
and on a real GPU in the gpu-marked tests."""
import ctypes
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.checks import PYTHON_DIR, run_on_fake_driver

import mlirgpu as mg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "export"))
import sgemm as example  # noqa: E402

N = mg.generics("N")
L = mg.generics("L", dynamic=True)


@mg.kernel
def fill(out: mg.memref[N, mg.i32], value: mg.i32):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < N:
        out[i] = value * 100 + N


@mg.kernel
def reverse(x: mg.memref[L, mg.f32], y: mg.memref[L, mg.f32]):
    tile = mg.shared.array(64, mg.f32)
    t = mg.thread_idx.x
    if t < L:
        tile[t] = x[t]
    mg.syncthreads()
    if t < L:
        y[L - 1 - t] = tile[t]


@pytest.fixture(scope="module")
def sgemm_library(tmp_path_factory):
    out = tmp_path_factory.mktemp("sgemm")
    return mg.export([example.sgemm], out, name="sgemm", chips=["sm_80"], launch=example.LAUNCH)


@pytest.fixture
def on_cpu(monkeypatch):
    """The libraries loaded in this test run their CPU builds, GPU or not."""
    monkeypatch.setenv("MLIRGPU_BACKEND", "cpu")


def test_the_directory_holds_library_header_and_readme(sgemm_library):
    out = sgemm_library.parent
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "libsgemm.so", "sgemm.h"]
    header = (out / "sgemm.h").read_text()
    assert ("sgemm_status sgemm_sgemm(void *stream, const float *A, const float *B, float *C, float alpha, "
            "float beta, int64_t M, int64_t K, int64_t N);") in header
    assert "const char *sgemm_last_error(void);" in header
    readme = (out / "README.md").read_text()
    assert ("sgemm[M=dynamic(multiple of 16), K=dynamic(multiple of 16), N=dynamic(multiple of 16)], arrays "
            "16-byte aligned" in readme)
    assert "sgemm[M=dynamic, K=dynamic, N=dynamic]`" in readme
    assert "libc" in readme


@pytest.mark.parametrize("compiler", [["gcc", "-x", "c", "-std=c99"], ["g++", "-x", "c++"]])
def test_the_header_compiles_with_warnings_as_errors(sgemm_library, compiler, tmp_path):
    done = subprocess.run([*compiler, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                           str(sgemm_library.parent / "sgemm.h")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_library_needs_only_libc(sgemm_library):
    dynamic = subprocess.run(["readelf", "-d", str(sgemm_library)], capture_output=True, text=True,
                             check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic))
    assert needed and needed <= {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}, needed
    assert not any("cuda" in name for name in needed)


def test_the_library_shows_only_its_own_functions(sgemm_library):
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(sgemm_library)], capture_output=True, text=True,
                             check=True).stdout.split()[2::3]
    assert sorted(symbols) == ["sgemm_alloc", "sgemm_backend", "sgemm_copy_to_device", "sgemm_copy_to_host",
                               "sgemm_free", "sgemm_last_error", "sgemm_sgemm", "sgemm_signatures"]


def test_load_library_runs_the_cpu_build_for_sizes_of_every_variant(sgemm_library, on_cpu):
    lib = mg.load_library(sgemm_library)
    assert lib.backend == "cpu"
    assert "sgemm" in dir(lib)
    for m, k, n in ((32, 16, 48), (33, 16, 48), (16, 17, 5), (7, 9, 11)):
        a, b = np.random.rand(m, k).astype(np.float32), np.random.rand(k, n).astype(np.float32)
        c = np.random.rand(m, n).astype(np.float32)
        want = 2.0 * a.astype(np.float64) @ b + 0.5 * c
        lib.sgemm(None, a, b, c, 2.0, 0.5, m, k, n)
        np.testing.assert_allclose(c, want, rtol=1e-5)


def test_dispatch_by_size_among_specializations(tmp_path, on_cpu):
    library = mg.export([fill[4], fill[8]], tmp_path, name="fills", chips=["sm_80"])
    lib = mg.load_library(library)
    for size in (4, 8):
        out = np.zeros(size, np.int32)
        lib.fill(None, out, 3, size, grid=1, block=32)
        np.testing.assert_array_equal(out, 300 + size)
    with pytest.raises(mg.LaunchError, match="fill: no exported specialization serves N=5"):
        lib.fill(None, np.zeros(5, np.int32), 3, 5, grid=1, block=32)
    with pytest.raises(mg.LaunchError, match="fill: size N is 0; sizes are positive"):
        lib.fill(None, np.zeros(4, np.int32), 3, 0, grid=1, block=32)


@mg.kernel
def warp_reverse(x: mg.memref[L, mg.f32], y: mg.memref[L, mg.f32]):
    t = mg.thread_idx.x
    value = mg.warp.shfl_idx(x[t % L], 31 - t)
    if t < L:
        y[t] = value


def test_a_kernel_without_a_cpu_build_says_so(tmp_path, on_cpu):
    # Warp shuffles need more of the CPU backend's runtime than a library holds.
    lib = mg.load_library(mg.export([warp_reverse], tmp_path, name="rev", chips=["sm_80"]))
    x = np.arange(10, dtype=np.float32)
    with pytest.raises(mg.LaunchError, match=r"warp_reverse: there is no GPU \(MLIRGPU_BACKEND=cpu\) and the "
                                             r"library has no CPU build of warp_reverse\[L=dynamic\]"):
        lib.warp_reverse(None, x, np.zeros_like(x), 10, grid=1, block=32)


def test_the_cpu_build_of_a_kernel_with_shared_memory_and_barriers_runs(tmp_path, on_cpu):
    # Its threads run as fibers, switched at the barrier, over the block's shared memory.
    lib = mg.load_library(mg.export([reverse], tmp_path, name="rev", chips=["sm_80"]))
    x = np.arange(50, dtype=np.float32)
    y = np.zeros_like(x)
    lib.reverse(None, x, y, 50, grid=1, block=64)
    np.testing.assert_array_equal(y, x[::-1])


BLOCK = mg.generics("BLOCK")


@mg.autotune(configs=[dict(BLOCK=32), dict(BLOCK=64)], key=["N"], progress=False)
@mg.kernel(generics=(N, BLOCK))
def tiles(out: mg.memref[N, mg.i32]):
    i = mg.block_idx.x * BLOCK + mg.thread_idx.x
    if i < N:
        out[i] = mg.cast(BLOCK * 1000 + mg.block_idx.x, mg.i32)


TILES_LAUNCH = {"tiles": {"grid": ("(N + BLOCK - 1) / BLOCK",), "block": ("BLOCK",)}}


def test_an_autotuning_table_exports_each_tuned_config_chosen_by_size(tmp_path, on_cpu):
    table = {(100,): {"BLOCK": 32}, (256,): {"BLOCK": 64}}
    library = mg.export([tiles], tmp_path, name="tuned", chips=["sm_80"], tuned={"tiles": table},
                        launch=TILES_LAUNCH)
    # The tuned generic is no parameter: the size picks the config, and the launch rule reads it.
    assert "tuned_status tuned_tiles(void *stream, int32_t *out, int64_t N);" in (tmp_path / "tuned.h").read_text()
    readme = (tmp_path / "README.md").read_text()
    assert "tiles[N=100, BLOCK=32]" in readme and "tiles[N=256, BLOCK=64]" in readme
    lib = mg.load_library(library)
    for size, block in ((100, 32), (256, 64)):
        out = np.zeros(size, np.int32)
        lib.tiles(None, out, size)
        np.testing.assert_array_equal(out, block * 1000 + np.arange(size) // block)
    with pytest.raises(mg.LaunchError, match="tiles: no exported specialization serves N=7"):
        lib.tiles(None, np.zeros(7, np.int32), 7)


def test_an_autotuned_kernel_exports_the_choices_recorded_for_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(tmp_path / "cache"))
    tiles._store("NVIDIA H200", (512,), {"BLOCK": 64})
    tiles._store("NVIDIA A100-SXM4-80GB", (512,), {"BLOCK": 32})
    assert tiles.table("NVIDIA H200") == {(512,): {"BLOCK": 64}}
    assert tiles.table("NVIDIA A100-SXM4-80GB") == {(512,): {"BLOCK": 32}}
    library = mg.export([tiles], tmp_path / "out", chips=["sm_90a"], tuned={"tiles": tiles.table("NVIDIA H200")},
                        launch=TILES_LAUNCH)
    assert "tiles[N=512, BLOCK=64]" in (library.parent / "README.md").read_text()


@pytest.mark.parametrize("options, message", [
    ({"launch": TILES_LAUNCH}, r"tiles is autotuned and has no table: tune it on the GPU"),
    ({"tuned": {"tiles": {(100,): {"BLOCK": 32}}}}, r"tiles is autotuned: its launch shape depends on the tuned "
                                                    r"config, so give it a rule in launch= on its sizes and BLOCK"),
    ({"tuned": {"tiles": {(100,): {"WIDTH": 32}}}, "launch": TILES_LAUNCH},
     r"tiles's table maps the values of \(N\) to a config of BLOCK"),
    ({"tuned": {"other": {}}, "launch": TILES_LAUNCH}, r"names kernels that are not exported autotuned"),
])
def test_an_autotuned_export_refuses_what_it_cannot_build(tmp_path, options, message, monkeypatch):
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=message):
        mg.export([tiles], tmp_path, chips=["sm_80"], **options)


FAKE_DRIVER_CALLS = """
import ctypes, sys
fake = ctypes.CDLL(sys.argv[1])
fake.fake_log.restype = ctypes.c_char_p
lib = ctypes.CDLL(sys.argv[2])
lib.sgemm_last_error.restype = ctypes.c_char_p
lib.sgemm_backend.restype = ctypes.c_char_p
print("backend", lib.sgemm_backend().decode())
buffers = [ctypes.c_void_p() for _ in range(3)]
for b in buffers:
    assert lib.sgemm_alloc(ctypes.byref(b), 64 * 64 * 4) == 0
# The last call's A starts 4 bytes into its buffer: arrays not all 16-byte aligned.
for m, k, n, offset in ((32, 32, 32, 0), (33, 32, 32, 0), (48, 48, 48, 0), (48, 48, 48, 4)):
    a = ctypes.c_void_p(buffers[0].value + offset)
    status = lib.sgemm_sgemm(None, a, *buffers[1:], ctypes.c_float(1), ctypes.c_float(0), ctypes.c_int64(m),
                             ctypes.c_int64(k), ctypes.c_int64(n))
    assert status == 0, lib.sgemm_last_error()
    log = fake.fake_log().decode()
    print(m, k, n, "loads", log.count("cuModuleLoad"), "launches", log.count("cuLaunchKernel function=sgemm"))
"""


def test_dispatch_by_divisibility_on_the_driver(sgemm_library, fake_libcuda, tmp_path):
    script = tmp_path / "calls.py"
    script.write_text(FAKE_DRIVER_CALLS)
    # The stand-in is an sm_90 GPU: the library loads its sm_80 PTX, once per variant a call needs.
    assert run_on_fake_driver(script, fake_libcuda, sgemm_library) == ["backend cuda", "32 32 32 loads 1 launches 1", "33 32 32 loads 2 launches 2",
                                        "48 48 48 loads 2 launches 3", "48 48 48 loads 3 launches 4"]


def test_the_c_program_of_the_example_runs_on_the_cpu_build(tmp_path):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MLIRGPU_BACKEND="cpu")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "export" / "build.py"), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    errors = [float(e) for e in re.findall(r"on the cpu: relative error (\S+)", done.stdout)]
    assert len(errors) == 3 and all(e < 1e-5 for e in errors), done.stdout
    assert "a zero size: sgemm: size M is 0; sizes are positive" in done.stdout
    # Attention is in the library, and without a GPU its call fails with a status and a message.
    assert re.search(r"attention: not run on the cpu: attention_forward: there is no GPU \(MLIRGPU_BACKEND=cpu\) "
                     r"and the library has no CPU build of \S*attention_forward\[T=f16\]", done.stdout), done.stdout
    header = (tmp_path / "out" / "kernels.h").read_text()
    assert ("kernels_status kernels_attention_forward(void *stream, const uint16_t *q, const uint16_t *k, "
            "const uint16_t *v, uint16_t *o, float *lse, const int32_t *cu_q, const int32_t *cu_k, float scale_log2, "
            "int32_t left, int32_t right, int64_t q_extent0,") in header


def test_the_command_line_exports(tmp_path, on_cpu):
    (tmp_path / "mykernels.py").write_text(textwrap.dedent("""
        import mlirgpu as mg
        L = mg.generics("L", dynamic=True)

        @mg.kernel
        def scale(x: mg.memref[L, mg.f32], a: mg.f32):
            i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
            if i < L:
                x[i] = a * x[i]
    """))
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    done = subprocess.run([sys.executable, "-m", "mlirgpu.export", "mykernels:scale", "-o", "out", "--chips",
                           "sm_80", "--name", "mine", "--launch",
                           '{"scale": {"grid": ["(L + 63) / 64"], "block": [64]}}'],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lib = mg.load_library(tmp_path / "out" / "libmine.so")
    x = np.arange(100, dtype=np.float32)
    lib.scale(None, x, 3.0, 100)
    np.testing.assert_array_equal(x, 3.0 * np.arange(100))


def test_load_library_checks_its_arguments(sgemm_library, on_cpu):
    lib = mg.load_library(sgemm_library)
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(mg.LaunchError, match="sgemm takes the stream and 8 arguments"):
        lib.sgemm(None, a, a, a, 1.0, 0.0, 4, 4)
    with pytest.raises(mg.LaunchError, match="parameter 'B' is a 2-d f32 array, got a 2-d f64 one"):
        lib.sgemm(None, a, a.astype(np.float64), a, 1.0, 0.0, 4, 4, 4)
    with pytest.raises(mg.LaunchError, match="was exported with its own launch shape"):
        lib.sgemm(None, a, a, a, 1.0, 0.0, 4, 4, 4, grid=1, block=1)
    with pytest.raises(AttributeError, match="libsgemm.so exports no kernel 'gemm'"):
        lib.gemm


def test_load_library_refuses_other_files(tmp_path):
    with pytest.raises(ValueError, match="takes a lib<name>.so"):
        mg.load_library(tmp_path / "kernels.dll")
    with pytest.raises(ValueError, match="is no library mg.export wrote"):
        mg.load_library(tmp_path / "libmissing.so")


def test_export_needs_values_for_generics_that_are_not_dynamic(tmp_path):
    with pytest.raises(ValueError, match="fill has generics that are not dynamic \\(N\\)"):
        mg.export([fill], tmp_path)


@pytest.mark.parametrize("options, message", [
    ({"chips": ["sm80"]}, "'sm80' is not a chip name"),
    ({"name": "my-lib"}, "is a C identifier"),
    ({"launch": {"reverse": {"grid": ("L / 64; system(1)",), "block": (64,)}}}, "is not arithmetic on its sizes"),
    ({"launch": {"reverse": {"grid": ("(L + 63) / 64",)}}}, "takes grid, block and optionally shared_mem"),
    ({"launch": {"other": {"grid": (1,), "block": (1,)}}}, "names kernels that are not exported"),
    ({"cpu": "yes"}, "takes True, False or None"),
])
def test_export_refuses_bad_options(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        mg.export([reverse], tmp_path, **options)


@mg.kernel
def mapped(x_map: mg.TensorMap, x: mg.memref[L, mg.f32]):
    x[mg.thread_idx.x] = 1.0


def test_export_refuses_tensor_maps_it_is_not_told_of_naming_the_kernel_and_why(tmp_path):
    with pytest.raises(ValueError, match=r"mapped takes tensor maps \(x_map\): tensor_maps=\{'mapped': ...\} "
                                         r"describes each of them \(its dtype, shape, box, swizzle, as the kernel "
                                         r"reads it\)"):
        mg.export([mapped], tmp_path)


def test_export_takes_kernels_only(tmp_path):
    with pytest.raises(TypeError, match="takes kernels and specializations, not function"):
        mg.export([lambda: None], tmp_path)


@pytest.mark.gpu
def test_load_library_on_the_gpu(sgemm_library):
    lib = mg.load_library(sgemm_library)
    assert lib.backend == "cuda"
    stream = mg.Stream()
    for m, k, n in ((64, 32, 48), (33, 17, 21)):
        a, b = np.random.rand(m, k).astype(np.float32), np.random.rand(k, n).astype(np.float32)
        c = np.random.rand(m, n).astype(np.float32)
        dc = mg.to_device(c)
        lib.sgemm(stream, mg.to_device(a), mg.to_device(b), dc, 2.0, 0.5, m, k, n)
        stream.synchronize()
        np.testing.assert_allclose(dc.get(), 2.0 * a.astype(np.float64) @ b + 0.5 * c, rtol=1e-5)


@pytest.mark.gpu
def test_load_library_on_torch_tensors(sgemm_library):
    torch = pytest.importorskip("torch")
    lib = mg.load_library(sgemm_library)
    a, b = torch.rand(40, 24, device="cuda"), torch.rand(24, 56, device="cuda")
    c = torch.zeros(40, 56, device="cuda")
    lib.sgemm(torch.cuda.current_stream(), a, b, c, 1.0, 0.0, 40, 24, 56)
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_the_c_program_of_the_example_runs_on_the_gpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("MLIRGPU_BACKEND", None)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "export" / "build.py"), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    errors = [float(e) for e in re.findall(r"sgemm .* on the cuda: relative error (\S+)", done.stdout)]
    assert len(errors) == 3 and all(e < 1e-5 for e in errors), done.stdout
    attention = re.findall(r"attention 2x80x2x64 on the cuda: relative error (\S+), log-sum-exp error (\S+)",
                           done.stdout)
    assert len(attention) == 1 and float(attention[0][0]) < 1e-2 and float(attention[0][1]) < 1e-3, done.stdout


def test_the_library_holds_one_cpu_build_per_variant(sgemm_library):
    lib = ctypes.CDLL(str(sgemm_library))
    assert not hasattr(lib, "mgx_sgemm_sgemm_0")   # the CPU builds stay inside the library
