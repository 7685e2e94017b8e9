"""Exported kernels that take tensor maps (TMA): the function takes the
array's pointer and the map's open sizes, encodes the map itself and keeps
it. A TMA copy kernel runs its CPU build from Python and from C against
NumPy; the stand-in libcuda (tests/support/fake_cuda) shows what reaches the
driver (one encode per array and geometry, the map passed by value) and the
errors; the Hopper GEMM exports at one configuration; the gpu-marked tests
run both on a Hopper GPU."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support.checks import PYTHON_DIR, run_on_fake_driver

import mlirgpu as mg
from mlirgpu.ops import hopper_gemm

TILE = 32


@mg.kernel
def tma_double(src: mg.TensorMap, dst: mg.TensorMap):
    # One TILE x TILE tile per block: loaded by TMA, doubled by the block's threads, stored by TMA
    # (which clips the tile at dst's edges).
    smem = mg.shared.dynamic(mg.f32)
    bars = mg.mbarrier.array(1)
    base = mg.shared.address(smem)
    first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index) // 4
    row, col = mg.block_idx.y * TILE, mg.block_idx.x * TILE
    if mg.thread_idx.x == 0:
        bars.init(0, 1)
        mg.mbarrier.fence_init()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        bars.arrive_expect_tx(0, TILE * TILE * 4)
        mg.tma.load(src, smem, (row, col), bars, 0, offset=first)
    bars.wait(0, 0)
    for i in range(mg.thread_idx.x, TILE * TILE, 128):
        smem[first + i] = 2.0 * smem[first + i]
    mg.tma.fence_proxy_async()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        mg.tma.store(dst, smem, (row, col), offset=first)
        mg.tma.commit_group()
        mg.tma.wait_group(0)


# src and dst have the same rows and columns (the sizes rows and cols); src's rows may be padded.
TMA_MAPS = {"tma_double": {
    "src": {"dtype": mg.f32, "shape": ("rows", "cols"), "box": (TILE, TILE), "swizzle": "128B", "strides": (None,)},
    "dst": {"dtype": mg.f32, "shape": ("rows", "cols"), "box": (TILE, TILE), "swizzle": "128B"}}}
TMA_LAUNCH = {"tma_double": {"grid": (f"(cols + {TILE - 1}) / {TILE}", f"(rows + {TILE - 1}) / {TILE}"),
                             "block": (128,), "shared_mem": TILE * TILE * 4 + 1024}}


def export_tma(out, **options):
    return mg.export([tma_double], out, name="tma", chips=["sm_90a"], tensor_maps=TMA_MAPS, launch=TMA_LAUNCH,
                     **options)


@pytest.fixture(scope="module")
def tma_library(tmp_path_factory):
    return export_tma(tmp_path_factory.mktemp("tma"))


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setenv("MLIRGPU_BACKEND", "cpu")


def test_the_function_takes_the_arrays_and_the_maps_open_sizes(tma_library):
    header = (tma_library.parent / "tma.h").read_text()
    assert ("tma_status tma_tma_double(void *stream, float *src, float *dst, int64_t rows, int64_t cols, "
            "int64_t src_stride0);") in header
    assert "TMA_KERNEL_FAULT = 6" in header


@pytest.mark.parametrize("compiler", [["gcc", "-x", "c", "-std=c99"], ["g++", "-x", "c++"]])
def test_the_header_compiles_with_warnings_as_errors(tma_library, compiler):
    done = subprocess.run([*compiler, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                           str(tma_library.parent / "tma.h")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_library_with_tensor_maps_needs_only_libc(tma_library):
    dynamic = subprocess.run(["readelf", "-d", str(tma_library)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic))
    assert needed and needed <= {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}, needed


@pytest.mark.parametrize("rows, cols, pitch", [(64, 96, 96), (40, 72, 72), (100, 36, 40), (1, 4, 4)])
def test_the_cpu_build_of_a_tma_kernel_gives_numpys_result(tma_library, on_cpu, rows, cols, pitch):
    lib = mg.load_library(tma_library)
    assert lib.backend == "cpu"
    padded = np.random.default_rng(rows).random((rows, pitch), dtype=np.float32)
    src = padded[:, :cols]             # rows of `pitch` elements: the map's stride
    dst = np.full((rows, cols), -1.0, np.float32)
    lib.tma_double(None, src, dst, rows, cols, pitch)
    np.testing.assert_array_equal(dst, 2 * src)


def test_a_tensor_map_the_array_cannot_have_is_an_error(tma_library, on_cpu):
    lib = mg.load_library(tma_library)
    src, dst = np.zeros((8, 12), np.float32), np.zeros((8, 12), np.float32)
    # 12 floats are 48 bytes, but a stride of 10 elements is 40: not a multiple of 16.
    with pytest.raises(mg.LaunchError, match=r"tma_double: src's stride 0 is 10 elements: a tensor map needs a "
                                             r"positive multiple of 16 bytes below 2\*\*40"):
        lib.tma_double(None, src, dst, 8, 12, 10)
    with pytest.raises(mg.LaunchError, match=r"tma_double: rows is 0; sizes are positive"):
        lib.tma_double(None, src, dst, 0, 12, 12)


@mg.kernel
def tma_off_the_box(src: mg.TensorMap, out: mg.memref[1, mg.f32]):
    # The box lands 16 bytes past a 128-byte boundary: a fault the CPU build reports.
    smem = mg.shared.dynamic(mg.f32)
    bars = mg.mbarrier.array(1)
    base = mg.shared.address(smem)
    first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index) // 4
    if mg.thread_idx.x == 0:
        bars.init(0, 1)
        bars.arrive_expect_tx(0, TILE * TILE * 4)
        mg.tma.load(src, smem, (0, 0), bars, 0, offset=first + 4)
        bars.wait(0, 0)
        out[0] = smem[first + 4]


def test_a_kernels_fault_in_its_cpu_build_is_an_error_with_its_line(tmp_path, on_cpu):
    library = mg.export([tma_off_the_box], tmp_path, name="fault", chips=["sm_90a"],
                        tensor_maps={"tma_off_the_box": {"src": {**TMA_MAPS["tma_double"]["dst"], "shape": (64, 64)}}})
    lib = mg.load_library(library)
    src = np.ones((64, 64), np.float32)
    with pytest.raises(mg.LaunchError, match=r"tma_off_the_box: mg.tma.load: the shared memory is at byte \d+, not "
                                             r"128-byte aligned, by thread \(0, 0, 0\) of block \(0, 0, 0\) at line "
                                             r"\d+ of its source"):
        lib.tma_off_the_box(None, src, np.zeros(1, np.float32), grid=1, block=32, shared_mem=TILE * TILE * 4 + 1040)


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "tma.h"

/* 2 * src through the exported TMA kernel, on the library's backend, for a 50 x 44 array. */
int main(void)
{
    enum { ROWS = 50, COLS = 44 };
    static float src[ROWS][COLS], dst[ROWS][COLS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            src[r][c] = (float)(r * COLS + c) * 0.25f;
    void *dsrc, *ddst;
    if (tma_alloc(&dsrc, sizeof src) != TMA_SUCCESS || tma_alloc(&ddst, sizeof dst) != TMA_SUCCESS ||
        tma_copy_to_device(dsrc, src, sizeof src) != TMA_SUCCESS) {
        fprintf(stderr, "setup: %s\n", tma_last_error());
        return 1;
    }
    for (int call = 0; call < 2; call++) {   /* the second call finds its maps encoded */
        if (tma_tma_double(NULL, dsrc, ddst, ROWS, COLS, COLS) != TMA_SUCCESS) {
            fprintf(stderr, "tma_double: %s\n", tma_last_error());
            return 1;
        }
    }
    tma_copy_to_host(dst, ddst, sizeof dst);
    int wrong = 0;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            wrong += dst[r][c] != 2 * src[r][c];
    tma_status status = tma_tma_double(NULL, (float *)dsrc + 1, ddst, ROWS, COLS, COLS);
    printf("on the %s: %d wrong; misaligned: %d %s\n", tma_backend(), wrong, (int)status, tma_last_error());
    tma_free(dsrc);
    tma_free(ddst);
    return 0;
}
"""


def run_c_program(library, tmp_path, env):
    source = tmp_path / "main.c"
    source.write_text(C_PROGRAM)
    out = library.parent
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(source), f"-I{out}", f"-L{out}", "-ltma",
                    f"-Wl,-rpath,{out}", "-o", str(tmp_path / "main")], check=True)
    done = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_c_program_runs_the_tma_kernels_cpu_build(tma_library, tmp_path):
    stdout = run_c_program(tma_library, tmp_path, dict(os.environ, MLIRGPU_BACKEND="cpu"))
    assert stdout.startswith("on the cpu: 0 wrong; misaligned: 1 tma_double: src is at 0x"), stdout
    assert "a tensor map's array starts at a multiple of 16 bytes" in stdout


# --------------------------------------------------------------------------
# The driver's side, against the stand-in libcuda
# --------------------------------------------------------------------------

@mg.kernel
def tensor_map_first(m: mg.TensorMap, out: mg.memref[1, mg.i32]):
    # The stand-in logs the address and swizzle held in the first bytes of a launch's map.
    out[0] = 1


FAKE_DRIVER_CALLS = r"""
import ctypes, os, sys
fake, lib = ctypes.CDLL(sys.argv[1]), ctypes.CDLL(sys.argv[2])
fake.fake_log.restype = lib.maps_last_error.restype = lib.maps_backend.restype = ctypes.c_char_p
print("backend", lib.maps_backend().decode())
a, out = ctypes.c_void_p(), ctypes.c_void_p()
assert lib.maps_alloc(ctypes.byref(a), 1 << 20) == 0 and lib.maps_alloc(ctypes.byref(out), 64) == 0

def call(offset, rows, cols):
    status = lib.maps_tensor_map_first(None, ctypes.c_void_p(a.value + offset), out, ctypes.c_int64(rows),
                                       ctypes.c_int64(cols))
    log = fake.fake_log().decode().splitlines()
    encodes = [line.split(" address=")[1].split()[0] for line in log if line.startswith("cuTensorMapEncodeTiled")]
    launched = [line.split("address=")[1] for line in log if line.startswith("tensor_map_first")]
    last = [line for line in log if line.startswith("cuTensorMapEncodeTiled")][-1:]
    print(status, len(encodes), len(launched), launched[-1:] == [str(a.value + offset) + " swizzle=2"],
          " ".join(last[0].split()[4:]) if last else "", lib.maps_last_error().decode() if status else "")

call(0, 64, 32)
call(0, 64, 32)          # the same array and geometry: the map kept
call(0, 64, 48)          # another geometry
call(256, 64, 32)        # another array
call(8, 64, 32)          # not 16-byte aligned
os.environ["FAKE_CUDA_TENSOR_MAP_FAILS"] = "1"
call(512, 64, 32)        # the driver refuses to encode
"""


def test_the_library_encodes_each_map_once_and_passes_it_by_value(fake_libcuda, tmp_path):
    library = mg.export([tensor_map_first], tmp_path / "out", name="maps", chips=["sm_80"], cpu=False,
                        tensor_maps={"tensor_map_first": {"m": {"dtype": mg.bf16, "shape": (None, None),
                                                                "box": (16, 32), "swizzle": "64B",
                                                                "l2_promotion": None}}},
                        launch={"tensor_map_first": {"grid": (1,), "block": (1,)}})
    assert ("maps_status maps_tensor_map_first(void *stream, uint16_t *m, int32_t *out, int64_t m_extent0, "
            "int64_t m_extent1);") in (tmp_path / "out" / "maps.h").read_text()
    script = tmp_path / "calls.py"
    script.write_text(FAKE_DRIVER_CALLS)
    lines = run_on_fake_driver(script, fake_libcuda, library)
    # Sizes innermost first, byte strides of the outer dimensions, bf16 (9), the 64-byte swizzle (2).
    encoded = "dims=32,64 strides=64 box=32,16 element_strides=1,1 interleave=0 swizzle=2 l2=0 oob=0"
    assert lines[:5] == ["backend cuda", f"0 1 1 True {encoded} ", f"0 1 2 True {encoded} ",
                         f"0 2 3 True {encoded.replace('32,64 strides=64', '48,64 strides=96')} ",
                         f"0 3 4 True {encoded} "]
    assert lines[5].startswith("1 3 4 False ")
    assert lines[5].endswith("a tensor map's array starts at a multiple of 16 bytes"), lines[5]
    assert "tensor_map_first: m is at 0x" in lines[5]
    assert lines[6].startswith("5 3 4 False ")
    assert lines[6].endswith("(cuTensorMapEncodeTiled): CUDA error 1 (mock error text)"), lines[6]
    assert "tensor_map_first: encoding the tensor map m of the array at 0x" in lines[6]


# --------------------------------------------------------------------------
# What an export refuses
# --------------------------------------------------------------------------

@pytest.mark.parametrize("maps, message", [
    (None, r"tma_double takes tensor maps \(src, dst\): tensor_maps=\{'tma_double': ...\} describes each of them"),
    ({"tma_double": {"src": TMA_MAPS["tma_double"]["src"]}}, r"describes each of them .*got \['src'\]"),
    ({"tma_double": {**TMA_MAPS["tma_double"], "dst": {"dtype": mg.f32, "shape": (8, 8)}}},
     r"tma_double's dst takes dtype, shape, box"),
    ({"tma_double": {**TMA_MAPS["tma_double"], "dst": {"dtype": mg.f32, "shape": ("rows", "src"), "box": (8, 8)}}},
     r"each entry of shape is a positive int, None \(a parameter dst_extent<d>\) or a size's name \(one of the "
     r"kernel's, none, or a new parameter of the function\), not 'src'"),
    ({"tma_double": {**TMA_MAPS["tma_double"], "dst": {"dtype": mg.f32, "shape": (None, None), "box": (8, 64)}}},
     r"tma_double's dst: the box's rows are 256 bytes, wider than the 128B swizzle's 128"),
    ({"other": {}}, r"tensor_maps=...\) names kernels that are not exported: \['other'\]"),
])
def test_export_refuses_tensor_maps_it_cannot_encode(tmp_path, maps, message):
    with pytest.raises(ValueError, match=message):
        mg.export([tma_double], tmp_path, tensor_maps=maps)


# --------------------------------------------------------------------------
# The Hopper GEMM at one configuration
# --------------------------------------------------------------------------

GEMM_M, GEMM_N, GEMM_K = 256, 512, 192
GEMM_CONFIG = hopper_gemm.CONFIGS[0]   # 128 x 256 tiles, the TMA-store epilogue


def export_hopper_gemm(out):
    """The bf16 Hopper GEMM, C (f32) = A @ B for M = 256, N = 512 and any K, its maps as
    hopper_gemm.prepare and store_map make them."""
    config = GEMM_CONFIG.for_dtype(mg.bf16)
    gemm = hopper_gemm.kernel_for(config, mg.bf16)
    maps = {"a_map": {"dtype": mg.bf16, "shape": ("M", None), "box": (config.bm, config.bk)},
            "b_map": {"dtype": mg.bf16, "shape": (None, "N"), "box": (config.bk, 64)},
            "c_map": {"dtype": mg.f32, "shape": ("M", "N"), "box": (64, 32)}}
    return mg.export([gemm[GEMM_M, GEMM_N, mg.f32]], out, name="gemm", chips=["sm_90a"], cpu=False,
                     tensor_maps={"hopper_gemm": maps},
                     launch={"hopper_gemm": {"grid": ("(M / 128) * (N / 256)",), "block": (hopper_gemm.THREADS,),
                                             "shared_mem": config.shared_bytes()}})


def test_the_hopper_gemm_exports(tmp_path):
    library = export_hopper_gemm(tmp_path)
    header = (tmp_path / "gemm.h").read_text()
    assert ("gemm_status gemm_hopper_gemm(void *stream, uint16_t *a_map, uint16_t *b_map, float *c_map, "
            "const float *C, int32_t K, float scale_a, float scale_b, const int32_t *offsets, int64_t M, int64_t N, "
            "int64_t offsets_extent0, int64_t a_map_extent1, int64_t b_map_extent0);") in header
    done = subprocess.run(["gcc", "-x", "c", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                           str(tmp_path / "gemm.h")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert library.exists()


# --------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------

@pytest.fixture
def hopper():
    if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
        pytest.skip("needs a Hopper GPU (sm_90a)")


@pytest.mark.gpu
def test_the_tma_kernel_runs_on_the_gpu(tma_library, hopper):
    lib = mg.load_library(tma_library)
    assert lib.backend == "cuda"
    stream = mg.Stream()
    for rows, cols, pitch in ((64, 96, 96), (100, 36, 40), (257, 300, 304)):
        padded = np.random.default_rng(cols).random((rows, pitch), dtype=np.float32)
        src = mg.to_device(padded)
        dst = mg.to_device(np.full((rows, cols), -1.0, np.float32))
        for _ in range(2):   # the second launch finds its maps encoded
            lib.tma_double(stream, src, dst, rows, cols, pitch)
        stream.synchronize()
        np.testing.assert_array_equal(dst.get(), 2 * padded[:, :cols])


@pytest.mark.gpu
def test_a_c_program_runs_the_tma_kernel_on_the_gpu(tma_library, tmp_path, hopper):
    env = dict(os.environ)
    env.pop("MLIRGPU_BACKEND", None)
    stdout = run_c_program(tma_library, tmp_path, env)
    assert stdout.startswith("on the cuda: 0 wrong; misaligned: 1 tma_double: src is at 0x"), stdout


@pytest.mark.gpu
def test_the_exported_hopper_gemm_gives_numpys_result(tmp_path, hopper):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    lib = mg.load_library(export_hopper_gemm(tmp_path))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((GEMM_M, GEMM_K)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((GEMM_K, GEMM_N)).astype(ml_dtypes.bfloat16)
    A, B = mg.to_device(a), mg.to_device(b)
    C = mg.to_device(np.zeros((GEMM_M, GEMM_N), np.float32))
    offsets = mg.to_device(np.zeros(1, np.int32))
    stream = mg.Stream()
    lib.hopper_gemm(stream, A, B, C, C, GEMM_K, 1.0, 1.0, offsets, GEMM_M, GEMM_N, 1, GEMM_K, GEMM_K)
    stream.synchronize()
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(C.get(), expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())


def test_the_command_line_takes_tensor_maps(tmp_path):
    (tmp_path / "mapped_kernels.py").write_text(textwrap.dedent("""
        import mlirgpu as mg

        @mg.kernel
        def first(m: mg.TensorMap, out: mg.memref[1, mg.i32]):
            out[0] = 1
    """))
    maps = '{"first": {"m": {"dtype": "bf16", "shape": [null, 64], "box": [16, 64]}}}'
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    done = subprocess.run([sys.executable, "-m", "mlirgpu.export", "mapped_kernels:first", "-o", "out", "--name",
                           "cli", "--chips", "sm_80", "--no-cpu", "--tensor-maps", maps], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ("cli_status cli_first(void *stream, uint16_t *m, int32_t *out, int64_t m_extent0, cli_dim3 grid, "
            "cli_dim3 block, uint32_t shared_mem);") in (tmp_path / "out" / "cli.h").read_text()
