"""@mg.vectorize: the IR it is traced to (linalg.generic), both GPU mappings'
IR and PTX, results against NumPy on every backend (conftest.py's `backend`:
the CPU everywhere, the GPU where there is one) for several dtypes, ranks,
layouts and broadcasts, and each error a call can make."""
import json
import warnings

import numpy as np
import pytest
from support.backends import current_backend
from support.checks import filecheck, run_isolated

import mlirgpu as mg


@mg.vectorize
def foo(a, b, c):
    x = a + 1.0
    y = b - 2.0
    z = c + 3.0
    return x + y + z


@mg.vectorize
def axpy(a, x, y):
    return a * x + y


@mg.vectorize
def clamp_and_scale(x, lo, hi, scale):
    # Control flow: an scf.if inside the element's body.
    if x < lo:
        y = lo
    else:
        y = mg.math.min(x, hi)
    return y * scale


@mg.vectorize
def divmod_(a, b):
    return a // b, a % b


@mg.vectorize
def logic(p, q):
    return (p & ~q) | (q & ~p)


@mg.vectorize
def add2(a, b):
    return a + b


@mg.vectorize(["f32(f32, f32)", "f64(f64, f64)"])
def hypot(a, b):
    return mg.math.sqrt(a * a + b * b)


@mg.vectorize(["f64(f32)"])
def widen(a):
    return a * 2.0


@mg.vectorize(mapping="parallel-loops")
def axpy_loops(a, x, y):
    return a * x + y


def line_of(function, text):
    import inspect
    lines, first = inspect.getsourcelines(function.function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# ---------------------------------------------------------------------------
# IR and PTX (no GPU needed)

def test_traced_to_one_linalg_generic():
    text = foo[mg.f64, mg.f64, mg.f64].ir()
    filecheck(text,
              r"#map = affine_map<\(d0\) -> \(d0\)>",
              r"func.func @foo\(%arg0: memref<\?xf64>.*%arg3: memref<\?xf64>.*\) attributes {llvm.emit_c_interface}",
              r"linalg.generic {indexing_maps = \[#map, #map, #map, #map\], iterator_types = \[\"parallel\"\]} "
              r"ins\(%arg0, %arg1, %arg2 : .*\) outs\(%arg3 : memref<\?xf64>\)",
              r"arith.addf %in, %cst.* loc\(#loc(\d+)\)",
              r"arith.subf %in_0",
              r"linalg.yield")
    assert f'test_vectorize.py":{line_of(foo, "x = a + 1.0")}:0' in text
    assert text.count("linalg.generic") == 1


def test_scalar_arguments_are_function_arguments_the_region_uses():
    spec = axpy.specialization([(mg.f32, False), (mg.f32, True), (mg.f32, True)])
    filecheck(spec.ir(),
              r"func.func @axpy\(%arg0: f32 .*, %arg1: memref<\?xf32>.*, %arg2: memref<\?xf32>.*, %arg3: memref<\?xf32>",
              r"ins\(%arg1, %arg2 : memref<\?xf32>, memref<\?xf32>\) outs\(%arg3",
              r"arith.mulf %arg0, %in")


def test_strided_form_takes_strided_memrefs_of_the_output_rank():
    spec = axpy.specialization([(mg.f32, False), (mg.f32, True), (mg.f32, True)], rank=3)
    text = spec.ir()
    filecheck(text, r"#map = affine_map<\(d0, d1, d2\) -> \(d0, d1, d2\)>",
              r"memref<\?x\?x\?xf32, strided<\[\?, \?, \?\], offset: \?>>",
              r"iterator_types = \[\"parallel\", \"parallel\", \"parallel\"\]")
    filecheck(spec.ir("gpu"), r"scf.for", r"arith.remsi", r"arith.divsi", r"memref.load %arg1\[")


def test_direct_mapping_reads_16_byte_vectors():
    spec = axpy.specialization([(mg.f32, False), (mg.f32, True), (mg.f32, True)])
    assert spec.width == 4
    text = spec.ir("gpu")
    filecheck(text, r"gpu.func @axpy\(.*\) kernel attributes {nvvm.maxntid = array<i32: 1024, 1, 1>}",
              r"scf.if", r"vector.load %arg1\[.*{alignment = 16 : i64} : memref<\?xf32>, vector<4xf32>",
              r"vector.store", r"} else {", r"scf.for")
    # unroll 1 (the default): one vector of each array a thread
    assert text.count("vector.load") == 2 and text.count("vector.store") == 1
    ptx = spec.ptx("sm_90a")
    filecheck(ptx, r"\.maxntid 1024, 1, 1", r"ld\.global\.v4\.(f32|b32)", r"st\.global\.v4\.(f32|b32)")
    assert ptx.count("ld.global.v4") == 2


@pytest.mark.parametrize("dtype, width", [(mg.f64, 2), (mg.f16, 8), (mg.i8, 8), (mg.i32, 4), (mg.bool_, 1)])
def test_vector_width_is_16_bytes_of_the_widest_array(dtype, width):
    spec = logic[dtype, dtype] if dtype in (mg.bool_, mg.i8, mg.i32) else foo[dtype, dtype, dtype]
    assert spec.width == width
    assert ("ld.global.v" in spec.ptx("sm_90a")) == (width > 1)


def test_options_shape_the_direct_kernel():
    @mg.vectorize(threads=128, unroll=4)
    def double(x):
        return x * 2.0
    spec = double[mg.f32]
    assert ".maxntid 128, 1, 1" in spec.ptx("sm_80")
    # every thread loads its 4 vectors before it computes
    text = spec.ir("gpu")
    assert text.count("vector.load") == 4
    assert text.rindex("vector.load") < text.index("arith.mulf")


def test_parallel_loops_mapping_uses_mlirs_passes():
    spec = axpy_loops.specialization([(mg.f32, False), (mg.f32, True), (mg.f32, True)])
    filecheck(spec.ir("gpu"), r"func.func @axpy_loops", r"gpu.launch blocks\(.*\) in \(.*\) threads\(.*\) in "
              r"\(%arg\d+ = %c256", r"scf.if", r"memref.load", r"memref.store")
    filecheck(spec.ptx("sm_90a"), r"\.entry axpy_loops_kernel", r"ld\.global\.(f32|b32)")
    # Over strided arrays its loops run in reversed order: threads along the last, contiguous dimension.
    strided = axpy_loops.specialization([(mg.f32, False), (mg.f32, True), (mg.f32, True)], rank=3)
    filecheck(strided.ir("gpu"), r"gpu.launch blocks\(.*\) in \(%arg10 = %0, %arg11 = %dim_0, %arg12 = %dim\) threads\(.*\) in "
              r"\(%arg13 = %c256, %arg14 = %c1, %arg15 = %c1\)")
    # The host function around the launch is a host program: lowered to LLVM, calling the mgpu* runtime.
    program = mg.HostProgram(strided.gpu_module(), "sm_90a")
    assert program.functions == ("axpy_loops",)
    filecheck(program.llvm_ir, r"declare .* @mgpuModuleGetFunction", r"declare void @mgpuLaunchKernel")


def test_signature_converts_the_result():
    text = widen["f64(f32)"].ir()
    filecheck(text, r"arith.mulf %in, %cst.* : f32", r"arith.extf .* : f32 to f64", r"linalg.yield .* : f64")
    assert [s.text for s in hypot.signatures] == ["f32(f32, f32)", "f64(f64, f64)"]


def test_two_outputs_are_two_outs_operands():
    spec = divmod_[mg.i32, mg.i32]
    assert spec.outputs == (mg.i32, mg.i32)
    filecheck(spec.ir(), r"outs\(%arg2, %arg3 : memref<\?xi32>, memref<\?xi32>\)", r"arith.divsi",
              r"arith.remsi", r"linalg.yield %\d+, %\d+ : i32, i32")


def test_control_flow_in_the_body_is_an_scf_if():
    spec = clamp_and_scale[mg.f32, mg.f32, mg.f32, mg.f32]
    filecheck(spec.ir(), r"linalg.generic", r"arith.cmpf olt", r"scf.if .* -> \(f32\)", r"linalg.yield")
    assert "ld.global.v4" in spec.ptx("sm_90a")


def test_cubin_without_a_gpu():
    assert axpy[mg.f32, mg.f32, mg.f32].cubin("sm_90a")[:4] == b"\x7fELF"


# ---------------------------------------------------------------------------
# Results, on each backend

pytestmark_backend = pytest.mark.usefixtures("backend")


def rng():
    return np.random.default_rng()


@pytestmark_backend
def test_the_documented_element_wise_example_runs_as_shown():
    ary = np.arange(100, dtype=np.float64).reshape(10, 10)
    got = foo(ary, ary, ary)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == (10, 10)
    np.testing.assert_array_equal(got, (ary + 1.0) + (ary - 2.0) + (ary + 3.0))


@pytestmark_backend
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_float_dtypes(dtype):
    x = rng().standard_normal(1001).astype(dtype)
    y = rng().standard_normal(1001).astype(dtype)
    got = axpy(dtype(1.5), x, y)
    assert got.dtype == dtype
    expected = (np.float64(1.5) * x.astype(np.float64) + y).astype(dtype)
    # a * x + y may be one fused multiply-add (rounded once): an absolute bound near zero
    tolerance = 1e-2 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


@pytestmark_backend
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_dtypes(dtype):
    info = np.iinfo(dtype)
    a = rng().integers(max(info.min, -1000), min(info.max, 1000), 777).astype(dtype)
    b = rng().integers(1, min(info.max, 50), 777).astype(dtype)
    q, r = divmod_(a, b)
    assert q.dtype == dtype and r.dtype == dtype
    # C's truncating division, as CUDA's
    expected_q = (np.trunc(a.astype(np.float64) / b)).astype(dtype)
    np.testing.assert_array_equal(q, expected_q)
    np.testing.assert_array_equal(r, (a - expected_q * b).astype(dtype))


@pytestmark_backend
def test_bool_arrays():
    p = rng().integers(0, 2, 300).astype(bool)
    q = rng().integers(0, 2, 300).astype(bool)
    got = logic(p, q)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, p ^ q)


@pytestmark_backend
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 5), (2, 2, 2, 2, 3)])
def test_ranks(shape):
    x = rng().standard_normal(shape).astype(np.float32)
    y = rng().standard_normal(shape).astype(np.float32)
    got = axpy(2.0, x, y)
    np.testing.assert_allclose(got, 2.0 * x + y, rtol=1e-6, atol=1e-6)
    assert np.shape(got) == shape


@pytestmark_backend
@pytest.mark.parametrize("xs, ys", [((3, 1, 5), (4, 5)), ((5,), (4, 5)), ((4, 1), (1, 6)), ((1,), (9,)),
                                    ((), (3, 3))])
def test_broadcasting(xs, ys):
    x = rng().standard_normal(xs).astype(np.float64)
    y = rng().standard_normal(ys).astype(np.float64)
    got = axpy(0.5, x, y)
    np.testing.assert_allclose(got, 0.5 * x + y, rtol=1e-12)


@pytestmark_backend
def test_python_and_numpy_scalars_broadcast():
    x = rng().standard_normal((8, 9)).astype(np.float32)
    np.testing.assert_allclose(axpy(3, x, 1.25), 3 * x + 1.25, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(axpy(np.float32(-2), x, x), -2 * x + x, rtol=1e-6, atol=1e-6)
    # A Python float beside float32 arrays stays float32 (NumPy 2's weak scalars)
    assert axpy(0.1, x, x).dtype == np.float32
    # a NumPy float64 scalar is not weak: the inputs are promoted to float64, as NumPy's ufuncs do
    got = axpy(np.float64(2.0), x, x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, 3.0 * x.astype(np.float64), rtol=1e-12)


@pytestmark_backend
def test_all_scalars_give_a_scalar():
    got = foo(1.0, 2.0, 3.0)
    assert isinstance(got, np.float64) and got == 2.0 + 0.0 + 6.0


@pytestmark_backend
def test_non_contiguous_views():
    base = rng().standard_normal((12, 10)).astype(np.float32)
    x = base[::2, 1::3]            # strided
    y = base.T[:6, :3]             # transposed
    got = axpy(2.0, x, y)
    np.testing.assert_allclose(got, 2.0 * x + y, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_out_numpy_and_in_place():
    x = rng().standard_normal(1000).astype(np.float32)
    y = rng().standard_normal(1000).astype(np.float32)
    out = np.full(1000, np.nan, np.float32)
    assert axpy(2.0, x, y, out=out) is out
    np.testing.assert_allclose(out, 2.0 * x + y, rtol=1e-6, atol=1e-6)
    expected = 2.0 * x + y
    axpy(2.0, x, y, out=y)         # in place: the same layout as an input
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    strided_out = np.zeros((10, 20), np.float32)[:, ::2]
    axpy(1.0, x[:100].reshape(10, 10), 1.0, out=strided_out)
    np.testing.assert_allclose(strided_out, x[:100].reshape(10, 10) + 1.0, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_two_outputs_and_out_tuple():
    a = np.arange(-20, 20, dtype=np.int32)
    q, r = divmod_(a, 7)
    np.testing.assert_array_equal(q, np.trunc(a / 7).astype(np.int32))
    oq, orr = np.zeros(40, np.int32), np.zeros(40, np.int32)
    assert divmod_(a, 7, out=(oq, orr)) == (oq, orr)
    np.testing.assert_array_equal(oq, q)
    np.testing.assert_array_equal(orr, r)


@pytestmark_backend
def test_device_arrays_in_give_a_device_array_out():
    x = rng().standard_normal((64, 33)).astype(np.float32)
    dx = mg.to_device(x)
    got = axpy(2.0, dx, dx)
    assert isinstance(got, mg.DeviceArray) and got.shape == (64, 33) and got.dtype == mg.f32
    np.testing.assert_allclose(got.get(), 3.0 * x, rtol=1e-6, atol=1e-6)
    out = mg.empty((64, 33), mg.f32)
    assert axpy(1.0, dx, x, out=out) is out       # NumPy and device arrays mixed: on the device
    np.testing.assert_allclose(out.get(), 2.0 * x, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_control_flow_and_math():
    x = rng().standard_normal(5000).astype(np.float32)
    got = clamp_and_scale(x, -0.5, 0.75, 2.0)
    np.testing.assert_allclose(got, np.clip(x, -0.5, 0.75) * 2.0, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_signatures_pick_the_first_safe_cast():
    a = rng().standard_normal(100).astype(np.float32)
    b = rng().standard_normal(100).astype(np.float32)
    got = hypot(a, b)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.hypot(a, b), rtol=1e-6, atol=1e-6)
    assert hypot(a.astype(np.float64), b).dtype == np.float64        # f32 -> f64 is safe
    i = np.arange(10, dtype=np.int16)
    np.testing.assert_allclose(hypot(i, i), np.hypot(i, i).astype(np.float32), rtol=1e-6, atol=1e-6)
    w = widen(a)
    assert w.dtype == np.float64
    np.testing.assert_allclose(w, a.astype(np.float64) * 2.0)


@pytestmark_backend
def test_empty_arrays():
    x = np.zeros((0, 4), np.float32)
    got = axpy(1.0, x, x)
    assert got.shape == (0, 4) and got.dtype == np.float32


@pytestmark_backend
def test_sizes_around_the_block():
    # the direct mapping's whole blocks (1024 threads x 1 vector x 4 floats) and its element-wise tail
    for n in (4095, 4096, 4097, 3 * 4096 + 5):
        x = rng().standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(axpy(2.0, x, x), 3.0 * x, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_large_with_a_tail(size):
    n = size(gpu=2 ** 24 + 7, cpu=2 ** 18 + 7)
    x = rng().standard_normal(n, dtype=np.float32)
    y = rng().standard_normal(n, dtype=np.float32)
    got = axpy(np.float32(2.5), mg.to_device(x), mg.to_device(y)).get()
    np.testing.assert_allclose(got, 2.5 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_parallel_loops_mapping_gives_the_same_results():
    for shape, xs in (((4099,), (4099,)), ((33, 65), (65,)), ((3, 4, 5), (4, 1))):
        x = rng().standard_normal(xs).astype(np.float32)
        y = rng().standard_normal(shape).astype(np.float32)
        got = axpy_loops(2.0, mg.to_device(x), mg.to_device(y)).get()
        np.testing.assert_allclose(got, 2.0 * x + y, rtol=1e-6, atol=1e-6)


@pytestmark_backend
def test_signature_refuses_a_device_array_of_another_dtype():
    @mg.vectorize(["f64(f64)"])
    def twice(x):
        return x * 2.0
    with pytest.raises(mg.LaunchError, match="device array of f32, but the signature 'f64\\(f64\\)' takes f64"):
        twice(mg.to_device(np.zeros(3, np.float32)))


# ---------------------------------------------------------------------------
# Errors

def test_argument_count():
    with pytest.raises(mg.LaunchError, match=r"foo takes 3 arguments \(a, b, c\), got 2"):
        foo(np.zeros(3), np.zeros(3))


def test_shapes_that_do_not_broadcast():
    with pytest.raises(mg.LaunchError, match=r"shapes \(3,\) \(x\), \(4,\) \(y\) do not broadcast"):
        axpy(1.0, np.zeros(3, np.float32), np.zeros(4, np.float32))


@pytest.mark.parametrize("out, message", [
    (np.zeros(4, np.float32), r"out\[0\] has shape \(4,\), but the arguments broadcast to \(3,\)"),
    (np.zeros(3, np.float64), r"out\[0\] has dtype f64, but axpy returns f32 there"),
    ((np.zeros(3, np.float32), np.zeros(3, np.float32)), r"axpy has 1 outputs; out= gives 2"),
    (5.0, r"out\[0\] must be an array"),
])
def test_bad_out(out, message):
    x = np.zeros(3, np.float32)
    with pytest.raises(mg.LaunchError, match=message):
        axpy(1.0, x, x, out=out)


def test_read_only_out():
    x = np.zeros(3, np.float32)
    out = np.zeros(3, np.float32)
    out.flags.writeable = False
    with pytest.raises(mg.LaunchError, match="read-only"):
        axpy(1.0, x, x, out=out)


def test_a_read_only_dlpack_out_is_refused_as_a_launch_refuses_it():
    read_only = np.zeros(3, np.float32)
    read_only.flags.writeable = False

    @mg.kernel
    def fill(y: mg.memref[3, mg.f32]):
        y[mg.thread_idx.x] = 1.0

    with current_backend("cpu"):
        out = mg.asarray(read_only)          # through DLPack, which carries the read-only flag
        assert out.readonly
        with pytest.raises(mg.LaunchError) as launched:
            fill(out, grid=1, block=3)
        with pytest.raises(mg.LaunchError) as vectorized:
            axpy(1.0, np.zeros(3, np.float32), np.zeros(3, np.float32), out=out)
    assert str(vectorized.value) == str(launched.value).replace("'y'", "'out[0]'").replace("fill", "axpy")
    np.testing.assert_array_equal(read_only, 0.0)


@pytestmark_backend
@pytest.mark.parametrize("shift", [1, -1, 2])
def test_out_overlapping_an_input_at_an_offset_gives_numpys_result(shift):
    x = np.arange(12, dtype=np.float32)
    want = x.copy()
    n = len(x) - abs(shift)
    given, written = (slice(0, n), slice(shift, None)) if shift > 0 else (slice(-shift, None), slice(0, n))
    np.add(want[given], want[given], out=want[written])
    add2(x[given], x[given], out=x[written])
    np.testing.assert_array_equal(x, want)
    y = np.arange(12, dtype=np.float32)
    add2(y, y, out=y)                       # in place, element by element: no copy needed
    np.testing.assert_array_equal(y, 2 * np.arange(12))


@pytestmark_backend
def test_integer_division_by_zero_gives_numpys_result_and_warning():
    @mg.vectorize
    def divide(a, b):
        return a // b, a % b

    lowest = np.iinfo(np.int32).min
    a = np.array([7, -7, lowest, 9], np.int32)
    b = np.array([0, 0, -1, 2], np.int32)
    with pytest.warns(RuntimeWarning) as warned:
        quotient, remainder = divide(a, b)
    np.testing.assert_array_equal(quotient, [0, 0, lowest, 4])
    np.testing.assert_array_equal(remainder, [0, 0, 0, 1])
    assert {str(w.message) for w in warned} == {"divide by zero encountered in floor_divide",
                                                "divide by zero encountered in remainder",
                                                "overflow encountered in floor_divide"}
    with np.errstate(divide="raise"), pytest.raises(FloatingPointError, match="divide by zero"):
        divide(a, b)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        divide(a, b)
        divide(np.arange(1, 5, dtype=np.int64), np.arange(1, 5, dtype=np.uint8))


@mg.vectorize
def divide_where_positive(a, b):
    if a > 0:
        c = a // b
    else:
        c = a + 1
    return c


@pytestmark_backend
def test_integer_division_under_control_flow_warns_only_where_it_ran():
    with pytest.warns(RuntimeWarning, match="divide by zero encountered in floor_divide"):
        got = divide_where_positive(np.array([7, -1, 4], np.int32), np.array([2, 0, 0], np.int32))
    np.testing.assert_array_equal(got, [3, 0, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(divide_where_positive(np.array([7, -1], np.int32),
                                                            np.array([2, 0], np.int32)), [3, 0])


def test_integer_division_faults_set_flags_that_every_form_takes_last():
    """One flag per warning, stored where the element faults: no output per
    element, no trap; a function without integer division has no flags."""
    flags = r"%arg4: memref<\?xi1>"
    spec = divmod_[mg.i32, mg.i32]
    assert spec.faults == ("divide by zero encountered in floor_divide", "overflow encountered in floor_divide",
                           "divide by zero encountered in remainder")
    filecheck(spec.ir(), flags, r"scf.if", r"memref.store %true, %arg4\[%c0\]", r"arith.divsi",
              r"memref.store %true, %arg4\[%c2\]", r"arith.remsi", r"linalg.yield %\d+, %\d+ : i32, i32")
    filecheck(spec.ir("gpu"), r"gpu.func @divmod_\(.*" + flags, r"memref.store %true, %arg4")
    ptx = spec.ptx("sm_90a")
    assert "st.global.b8" in ptx and "trap" not in ptx
    assert len(spec.function_params()) == 5 * 5
    loops = mg.vectorize(mapping="parallel-loops")(divmod_.function)[mg.i32, mg.i32]
    filecheck(loops.ir("gpu"), r"func.func @divmod_\(.*" + flags, r"gpu.launch", r"memref.store %true, %arg4")
    plain = add2[mg.i32, mg.i32]
    assert plain.faults == () and "i1" not in plain.ir() and len(plain.function_params()) == 3 * 5


def test_the_cuda_path_reads_the_fault_flags_back_only_where_integers_divide(fake_libcuda):
    """On the fake driver: the flags are cleared on the launch's stream, the
    kernel (here one that sets every flag) launched, and the flags copied back
    after it; a float-only call neither copies nor waits."""
    code = f"""
import os, json, warnings, ctypes
os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
import numpy as np
import mlirgpu as mg

@mg.vectorize
def divide(a, b):
    return a // b, a % b

@mg.vectorize
def add(a, b):
    return a + b

fake = ctypes.CDLL(os.environ["MLIRGPU_LIBCUDA"])
fake.fake_log.restype = ctypes.c_char_p
x, f = mg.to_device(np.arange(4, dtype=np.int32)), mg.to_device(np.arange(4, dtype=np.float32))
for vectorized, args, name in ((divide, (x, x), "set_fault_flags"), (add, (f, f), "float_only")):
    spec = vectorized.specialize(*args)
    module = mg._mlirgpu.load_module(f".visible .entry {{name}}(\\n")
    spec._functions[mg.cuda.current_device(), False] = module.get_function(name, params=spec.function_params())
fake.fake_log_clear()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    divide(x, x)
divide_log = fake.fake_log().decode().splitlines()
fake.fake_log_clear()
add(f, f)
print(json.dumps([sorted(str(w.message) for w in caught), divide_log, fake.fake_log().decode().splitlines()]))
"""
    proc = run_isolated(code)
    assert proc.returncode == 0, proc.stderr
    warned, divide_log, add_log = json.loads(proc.stdout.strip().splitlines()[-1])
    assert warned == ["divide by zero encountered in floor_divide", "divide by zero encountered in remainder",
                      "overflow encountered in floor_divide"]
    calls = [line.split()[0] for line in divide_log]
    clear, launch, copy = calls.index("cuMemsetD8Async"), calls.index("cuLaunchKernel"), calls.index("cuMemcpyDtoHAsync")
    assert clear < launch < copy < calls.index("cuStreamSynchronize")
    flags = divide_log[clear].split()[1].split("=")[1]
    assert "bytes=3" in divide_log[clear] and f"src={flags} bytes=3" in divide_log[copy]
    assert "function=set_fault_flags" in divide_log[launch]
    assert any("function=float_only" in line for line in add_log)
    assert not any(line.startswith(("cuMemcpyDtoH", "cuStreamSynchronize", "cuCtxSynchronize")) for line in add_log)


def test_no_signature_matches():
    with pytest.raises(mg.LaunchError, match=r"widen: no signature takes \(f64\); its signatures are f64\(f32\)"):
        widen(np.zeros(3))


def test_unsupported_arguments():
    with pytest.raises(mg.LaunchError, match="dtype complex128, which mlirgpu does not support"):
        axpy(1.0, np.zeros(3, np.complex128), np.zeros(3, np.complex128))
    with pytest.raises(mg.LaunchError, match=r"argument 'x'"):
        axpy(1.0, "not an array", np.zeros(3))


def test_scalar_that_does_not_fit():
    with pytest.raises(mg.LaunchError, match=r"argument 'b' is i8: 300 is out of its range -128..127"):
        divmod_(np.arange(3, dtype=np.int8), 300)


def test_errors_at_definition():
    with pytest.raises(TypeError, match="takes a function or a list of signatures"):
        mg.vectorize(42)
    with pytest.raises(TypeError, match="decorates a function, not int"):
        mg.vectorize()(42)
    with pytest.raises(ValueError, match="mapping must be one of direct, parallel-loops"):
        mg.vectorize(mapping="loops")(lambda x: x)
    with pytest.raises(ValueError, match="threads must be a multiple of 32"):
        mg.vectorize(threads=100)(lambda x: x)
    with pytest.raises(ValueError, match="unroll must be an int in 1..16"):
        mg.vectorize(unroll=0)(lambda x: x)
    with pytest.raises(mg.CompileError, match="malformed vectorize signature 'f32 f32'"):
        mg.vectorize(["f32 f32"])(lambda x: x)
    with pytest.raises(mg.CompileError, match="unknown dtype 'float99'"):
        mg.vectorize(["f32(float99)"])(lambda x: x)
    with pytest.raises(mg.CompileError, match="has 2 inputs, but .* takes 1"):
        mg.vectorize(["f32(f32, f32)"])(lambda x: x)

    def keyword_only(x, *, y):
        return x
    with pytest.raises(mg.CompileError, match="plain positional parameters"):
        mg.vectorize(keyword_only)


def test_a_signature_the_function_cannot_take_fails_at_definition():
    with pytest.raises(mg.CompileError, match=r"test_vectorize.py:\d+: a Python float meets a i32 value"):
        @mg.vectorize(["i32(i32)"])
        def bad(a):
            return a + 1.5


def test_returning_a_python_number_points_at_the_return():
    @mg.vectorize
    def constant(a):
        return 1.0
    with pytest.raises(mg.CompileError, match=r"test_vectorize.py:\d+: \S*constant returns a Python number"):
        constant(np.zeros(3))


def test_trace_errors_point_at_the_users_line():
    @mg.vectorize
    def uses_a_missing_name(a):
        b = a + undefined_name  # noqa: F821
        return b
    with pytest.raises(mg.CompileError, match=r"test_vectorize.py:\d+: NameError") as info:
        uses_a_missing_name(np.zeros(3))
    assert info.value.lineno == line_of(uses_a_missing_name, "undefined_name")


@pytestmark_backend
@pytest.mark.parametrize("a, b", [
    (np.float32, np.float64), (np.int32, np.float32), (np.int8, np.int16), (np.uint8, np.int8), (np.int64, np.float16),
])
def test_numpy_type_promotion(a, b):
    x = (np.arange(1, 7) % 5).astype(a)
    y = (np.arange(6) % 3).astype(b)
    got = add2(x, y)
    want = np.add(x, y)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-3)


@pytestmark_backend
def test_promotion_of_device_arrays():
    x = mg.to_device(np.arange(4, dtype=np.float32))
    y = mg.to_device(np.arange(4, dtype=np.float64))
    got = add2(x, y)
    assert isinstance(got, mg.DeviceArray) and got.dtype == mg.f64
    np.testing.assert_array_equal(got.get(), 2 * np.arange(4))


@pytestmark_backend
def test_bool_inputs_stay_bool():
    @mg.vectorize
    def where(c, a, b):
        return mg.select(c, a, b)

    c = np.array([True, False, True])
    got = where(c, np.float32(1), np.arange(3, dtype=np.float64))
    np.testing.assert_array_equal(got, [1.0, 1.0, 1.0])
    assert got.dtype == np.float64


@pytestmark_backend
def test_lists_scalars_and_zero_d_arrays():
    np.testing.assert_array_equal(add2([1.0, 2.0], [3.0, 4.0]), [4.0, 6.0])
    assert add2(np.array(1.5, np.float32), 2).dtype == np.float32
    assert add2(np.array(1.5, np.float32), np.array(2, np.float32)) == np.float32(3.5)
    np.testing.assert_array_equal(add2([[1], [2]], (10, 20)), [[11, 21], [12, 22]])


@pytestmark_backend
def test_dtype_keyword():
    x = np.arange(4, dtype=np.float32)
    got = add2(x, 1, dtype=np.float64)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.arange(4) + 1)
    out = np.zeros(4, np.float64)
    assert add2(x, x, dtype=np.float64, out=out) is out
    np.testing.assert_array_equal(out, 2 * np.arange(4))
    with pytest.raises(mg.LaunchError, match="convert it first"):
        add2(mg.to_device(x), x, dtype=np.float64)
