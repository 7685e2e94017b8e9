"""Dynamic extents: `mg.memref[None, N, mg.f32]` takes any size in that
dimension, read in the kernel as `A.shape[0]`, with one compile for every
size: results on both backends, the kernel's parameters (a pointer and the
extents), the C dispatcher's signature (None where dynamic), the launch's
packed extents on the fake CUDA driver, and errors."""
import json

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts, run_isolated
from mlirgpu import block_dim, block_idx, thread_idx

N, D = mg.generics("N D")


@mg.kernel
def row_softmax(X: mg.memref[None, None, mg.f32], Y: mg.memref[None, None, mg.f32]):
    # One block a row, of any number of rows and columns.
    row, t = block_idx.x, thread_idx.x
    n = X.shape[1]
    m = mg.constant(float("-inf"), mg.f32)
    for j in range(t, n, block_dim.x):
        m = mg.math.max(m, X[row, j])
    m = mg.block.reduce(m, "max")
    s = mg.constant(0.0, mg.f32)
    for j in range(t, n, block_dim.x):
        s += mg.math.exp(X[row, j] - m)
    s = mg.block.reduce(s, "add")
    for j in range(t, n, block_dim.x):
        Y[row, j] = mg.math.exp(X[row, j] - m) / s


def softmax(X):
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_softmax_over_changing_shapes_compiles_once(backend):
    for shape in [(3, 100), (5, 37), (1, 1000), (7, 64)]:
        X = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
        Y = np.zeros_like(X)
        row_softmax(X, Y, grid=shape[0], block=64)
        np.testing.assert_allclose(Y, softmax(X), rtol=1e-5, atol=1e-7)
    assert len(row_softmax._specializations) == 1


@mg.kernel
def scale_rows(X: mg.memref[None, D, mg.f32], factor: mg.f32):
    # Rows dynamic, columns a generic: A.shape mixes a traced size and an int.
    i = block_idx.x * block_dim.x + thread_idx.x
    rows, columns = X.shape
    if i < rows * columns:
        X[i // columns, i % columns] = X[i // columns, i % columns] * factor


def test_dynamic_and_generic_extents(backend):
    for rows in (3, 10):
        X = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
        expected = X * 2
        scale_rows(X, 2.0, grid=(rows * 8 + 31) // 32, block=32)
        np.testing.assert_array_equal(X, expected)
    assert list(scale_rows._specializations) == [(8,)]  # one per value of D, none per row count


def test_kernel_parameters_are_pointer_and_extents(tmp_path):
    spec = scale_rows[8]
    assert spec.function_params() == [("ptr", (0,)), mg.f32]
    ir = spec.ir()
    filecheck(ir, r"gpu\.func @scale_rows\(%arg0: memref<f32>.*, %arg1: index.*, %arg2: f32",
              r"memref\.reinterpret_cast %arg0 to offset: \[0\], sizes: \[%arg1, 8\], strides: \[8, 1\] : "
              r"memref<f32> to memref<\?x8xf32>")
    ptx = spec.ptx(chip="sm_90a")
    filecheck(ptx, r"\.param \.u64 \.ptr .*scale_rows_param_0,", r"\.param \.u64 scale_rows_param_1,",
              r"\.param \.f32 scale_rows_param_2")
    ptxas_accepts(ptx, "sm_90a", tmp_path)


def test_dispatcher_signature_leaves_dynamic_extents_out():
    first = row_softmax.signature((np.zeros((3, 100), np.float32), np.zeros((3, 100), np.float32)))
    second = row_softmax.signature((np.zeros((9, 7), np.float32), np.zeros((9, 7), np.float32)))
    assert first == second and first[0][2] == (None, None)
    static = scale_rows.signature((np.zeros((3, 8), np.float32), 1.0))
    assert static[0][2] == (None, 8)


def test_launch_packs_the_extents_after_the_pointer(fake_libcuda):
    """On the fake CUDA driver, whose record_params kernel copies its
    parameters out: a dispatcher hit for a new size passes the new extents."""
    code = '''
import json, os
import numpy as np
import mlirgpu._mlirgpu as C
module = C.load_module(".visible .entry record_params(\\\\n")
record = module.get_function("record_params", params=["ptr", C.u32, ("ptr", (0, 2)), "ptr"])
misses = []
def miss(args, kwargs):
    misses.append(1)
    d.register(args, record)
    return record(*args, **kwargs)
d = C.Dispatcher(miss, "record_params")
d.set_dynamic([[], [], [0, 2], []])
buf = C.zeros(8, C.u64)
out = []
for shape in [(2, 3, 4), (5, 3, 7)]:
    a, b = C.empty(shape), C.empty(4)
    d(buf, np.uint32(4), a, b, grid=1, block=1)
    out.append([int(x) for x in buf.get()[:4]] == [a.ptr, shape[0], shape[2], b.ptr])
record(buf, np.uint32(4), C.empty((6, 1, 2)), C.empty(4), grid=1, block=1)
out.append([int(x) for x in buf.get()[1:3]])
try:
    record(buf, np.uint32(4), C.empty(6), C.empty(4), grid=1, block=1)
except C.LaunchError as e:
    out.append(str(e))
print(json.dumps([out, len(misses), len(d)]))
'''
    proc = run_isolated(f"import os\nos.environ['MLIRGPU_LIBCUDA'] = {fake_libcuda!r}\n" + code)
    assert proc.returncode == 0, proc.stderr
    out, misses, entries = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out[:2] == [True, True] and misses == 1 and entries == 1
    assert out[2] == [6, 2]
    assert "the kernel takes the extent of dimension 2, but the array has 1 dimensions" in out[3]


@mg.kernel
def wrong_rank(X: mg.memref[None, mg.f32]):
    X[0] = 1.0


def test_dynamic_extent_still_checks_rank_and_dtype(backend):
    with pytest.raises(mg.LaunchError, match="1-d memref, got a 2-d array"):
        wrong_rank(np.zeros((2, 2), np.float32), grid=1, block=1)
    with pytest.raises(mg.LaunchError, match="element type f32"):
        wrong_rank(np.zeros(4, np.float64), grid=1, block=1)


@mg.kernel
def len_of_dynamic(X: mg.memref[None, mg.f32]):
    X[0] = mg.cast(len(X), mg.f32)  # len of a dynamic size


def test_len_of_a_dynamic_extent_is_an_error():
    with pytest.raises(mg.CompileError, match=r"use A\.shape\[0\]"):
        len_of_dynamic.specialize({}).ir()


def test_bad_extent_annotation():
    with pytest.raises(mg.CompileError, match="positive ints, generics or None"):
        mg.memref[0, mg.f32]


@pytest.mark.parametrize("name", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_dynamic_shapes_example(name):
    """examples/dynamic_shapes.py: softmax and LayerNorm over five shapes, one
    specialization each (and on the GPU one build each in the compile log)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from support.checks import PYTHON_DIR
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MLIRGPU_BACKEND=name)
    proc = subprocess.run([sys.executable, str(root / "examples" / "dynamic_shapes.py")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "every result matches NumPy" in proc.stdout
    builds = "|             1 |" if name == "cuda" else "|     n/a (CPU) |"
    assert proc.stdout.count(f"|               1 {builds}") == 2, proc.stdout


@pytest.mark.gpu
def test_new_sizes_hit_the_dispatcher_on_the_gpu():
    """DeviceArrays of three shapes: one dispatcher entry, one compile, right
    results (rows of sizes off 16 bytes, so that all take the unaligned variant)."""
    from support.backends import current_backend
    with current_backend("cuda"):
        row_softmax.clear()
        for rows, columns in [(3, 101), (40, 257), (7, 63)]:
            X = np.random.default_rng(rows).standard_normal((rows, columns)).astype(np.float32)
            dX, dY = mg.to_device(X), mg.empty((rows, columns), mg.f32)
            row_softmax(dX, dY, grid=rows, block=64)
            np.testing.assert_allclose(dY.get(), softmax(X), rtol=1e-5, atol=1e-7)
        assert len(row_softmax) == 1 and len(row_softmax._specializations) == 1


@mg.func
def row_total(X: mg.memref[None, None, mg.f32], row) -> mg.f32:
    total = mg.constant(0.0, mg.f32)
    for j in range(X.shape[1]):
        total += X[row, j]
    return total


@mg.func
def put(y, i, value):
    y[i] = value


@mg.kernel
def row_totals(X: mg.memref[None, None, mg.f32], y: mg.memref[None, mg.f32]):
    # Dynamic extents pass on to device functions (as the array's strided metadata).
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < X.shape[0]:
        put(y, i, row_total(X, i))


def test_device_functions_take_arrays_with_dynamic_extents(backend):
    for rows, columns in [(5, 3), (70, 33)]:
        X = np.arange(rows * columns, dtype=np.float32).reshape(rows, columns)
        y = np.zeros(rows, np.float32)
        row_totals(X, y, grid=(rows + 63) // 64, block=64)
        np.testing.assert_array_equal(y, X.sum(1))
    assert len(row_totals._specializations) == 1


def test_device_functions_with_dynamic_extents_reach_ptxas(tmp_path):
    ptx = row_totals.specialize({}).ptx("sm_90a")
    assert ".func" in ptx   # the device functions stay functions
    ptxas_accepts(ptx, "sm_90a", tmp_path)
