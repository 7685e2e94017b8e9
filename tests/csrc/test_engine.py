"""mlirgpu._mlirgpu.ExecutionEngine on the host: modules lowered to the llvm
dialect with cpu.PIPELINE, called with NumPy arrays, DeviceArrays (host memory)
and scalar bytes; results, ownership of result memory, errors, leaks."""
import gc
import threading

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import _mlirgpu, cpu, ir, passes
from support.leaks import MB, growth

ExecutionEngine = _mlirgpu.ExecutionEngine

STRIDED = "memref<?xf32, strided<[?], offset: ?>>"
STRIDED2 = "memref<?x?xf32, strided<[?, ?], offset: ?>>"

TEXT = f"""
func.func @axpy(%a: {STRIDED}, %b: {STRIDED}, %s: f32, %out: {STRIDED}) attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %out, %c0 : {STRIDED}
  scf.for %i = %c0 to %n step %c1 {{
    %x = memref.load %a[%i] : {STRIDED}
    %y = memref.load %b[%i] : {STRIDED}
    %m = arith.mulf %x, %s : f32
    %r = arith.addf %m, %y : f32
    memref.store %r, %out[%i] : {STRIDED}
  }}
  return
}}

func.func @scale2d(%a: {STRIDED2}, %s: f32, %out: {STRIDED2}) attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %rows = memref.dim %out, %c0 : {STRIDED2}
  %cols = memref.dim %out, %c1 : {STRIDED2}
  scf.for %i = %c0 to %rows step %c1 {{
    scf.for %j = %c0 to %cols step %c1 {{
      %x = memref.load %a[%i, %j] : {STRIDED2}
      %m = arith.mulf %x, %s : f32
      memref.store %m, %out[%i, %j] : {STRIDED2}
    }}
  }}
  return
}}

func.func @sum(%a: memref<?xf64>) -> f64 attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f64
  %n = memref.dim %a, %c0 : memref<?xf64>
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> f64 {{
    %x = memref.load %a[%i] : memref<?xf64>
    %t = arith.addf %acc, %x : f64
    scf.yield %t : f64
  }}
  return %r : f64
}}

func.func @count(%n: i64, %flag: i8) -> i64 attributes {{llvm.emit_c_interface}} {{
  %one = arith.constant 1 : i64
  %f = arith.extsi %flag : i8 to i64
  %r = arith.addi %n, %f : i64
  %s = arith.addi %r, %one : i64
  return %s : i64
}}

func.func @doubled(%a: memref<?xf32>) -> memref<?xf32> attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %a, %c0 : memref<?xf32>
  %o = memref.alloc(%n) : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {{
    %x = memref.load %a[%i] : memref<?xf32>
    %t = arith.addf %x, %x : f32
    memref.store %t, %o[%i] : memref<?xf32>
  }}
  return %o : memref<?xf32>
}}

func.func @outer(%a: memref<?xf64>, %b: memref<?xf64>) -> (memref<?x?xf64>, i32, memref<?xf64>) attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.dim %a, %c0 : memref<?xf64>
  %n = memref.dim %b, %c0 : memref<?xf64>
  %o = memref.alloc(%m, %n) : memref<?x?xf64>
  scf.for %i = %c0 to %m step %c1 {{
    scf.for %j = %c0 to %n step %c1 {{
      %x = memref.load %a[%i] : memref<?xf64>
      %y = memref.load %b[%j] : memref<?xf64>
      %p = arith.mulf %x, %y : f64
      memref.store %p, %o[%i, %j] : memref<?x?xf64>
    }}
  }}
  %k = arith.constant 42 : i32
  return %o, %k, %b : memref<?x?xf64>, i32, memref<?xf64>
}}

func.func @same_twice(%n: index) -> (memref<?xi32>, memref<?xi32>) attributes {{llvm.emit_c_interface}} {{
  %o = memref.alloc(%n) : memref<?xi32>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %n step %c1 {{
    %v = arith.index_cast %i : index to i32
    memref.store %v, %o[%i] : memref<?xi32>
  }}
  return %o, %o : memref<?xi32>, memref<?xi32>
}}

memref.global "private" constant @table : memref<3xi16> = dense<[7, 8, 9]>

func.func @constant_table() -> memref<3xi16> attributes {{llvm.emit_c_interface}} {{
  %g = memref.get_global @table : memref<3xi16>
  return %g : memref<3xi16>
}}

func.func @scalar_memref(%a: memref<f32>, %out: memref<f32>) attributes {{llvm.emit_c_interface}} {{
  %x = memref.load %a[] : memref<f32>
  %y = arith.mulf %x, %x : f32
  memref.store %y, %out[] : memref<f32>
  return
}}

func.func @on_stack() -> memref<4xf32> attributes {{llvm.emit_c_interface}} {{
  %o = memref.alloca() : memref<4xf32>
  return %o : memref<4xf32>
}}

func.func private @usleep(i32) -> i32

// Spins (sleeping 1 ms a turn, at most 5000 turns) until flag[0] is set, and
// returns it: only a caller that released the GIL lets Python set it.
func.func @wait_for_flag(%flag: memref<1xi32>) -> i32 attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0 : i32
  %one = arith.constant 1 : i32
  %ms = arith.constant 1000 : i32
  %limit = arith.constant 5000 : i32
  %r:2 = scf.while (%turn = %zero) : (i32) -> (i32, i32) {{
    %v = memref.load %flag[%c0] : memref<1xi32>
    %unset = arith.cmpi eq, %v, %zero : i32
    %left = arith.cmpi slt, %turn, %limit : i32
    %go = arith.andi %unset, %left : i1
    scf.condition(%go) %turn, %v : i32, i32
  }} do {{
  ^bb0(%turn: i32, %v: i32):
    %s = func.call @usleep(%ms) : (i32) -> i32
    %next = arith.addi %turn, %one : i32
    scf.yield %next : i32
  }}
  return %r#1 : i32
}}
"""


def lowered(text):
    module = ir.Module.parse(text)
    passes.run(module, cpu.PIPELINE)
    return module


@pytest.fixture(scope="module")
def engine():
    return ExecutionEngine(lowered(TEXT))


def f32(value):
    return np.float32(value).tobytes()


def test_functions_listed(engine):
    assert set(engine.functions) == {"axpy", "scale2d", "sum", "count", "doubled", "outer", "same_twice",
                                     "constant_table", "scalar_memref", "on_stack", "wait_for_flag"}
    assert engine.runtime is False
    assert "ExecutionEngine" in repr(engine)


def test_strided_broadcast_and_scalar(engine):
    base = np.arange(20, dtype=np.float32)
    a = base[1::3]                                    # stride 3 elements, offset into the buffer
    b = np.broadcast_to(np.float32(0.5), a.shape)     # stride 0, read-only
    out_buffer = np.full(2 * a.size, -1.0, np.float32)
    out = out_buffer[::2]
    assert engine.invoke("axpy", [a, b, f32(3.0), out]) is None
    np.testing.assert_array_equal(out, a * np.float32(3.0) + np.float32(0.5))
    np.testing.assert_array_equal(out_buffer[1::2], -1.0)   # the gaps are untouched


def test_read_only_and_reversed_inputs(engine):
    a = np.arange(8, dtype=np.float32)[::-1]          # negative stride
    a.flags.writeable = False
    b = np.ones(8, np.float32)
    out = np.zeros(8, np.float32)
    engine.invoke("axpy", [a, b, f32(-2.0), out])
    np.testing.assert_array_equal(out, a * np.float32(-2.0) + 1)


def test_two_dimensional_strided(engine):
    base = np.arange(12 * 13, dtype=np.float32).reshape(12, 13)
    a = base[::2, 1::3].T                             # (4, 6), strides (3, 26) elements
    assert a.shape == (4, 6)
    out_buffer = np.zeros((8, 12), np.float32)
    out = out_buffer[1::2, ::2]                       # (4, 6), strides (24, 2) elements
    engine.invoke("scale2d", [a, f32(2.0), out])
    np.testing.assert_array_equal(out, a * 2)
    assert np.count_nonzero(out_buffer) == np.count_nonzero(a)


def test_host_device_array(engine):
    a = _mlirgpu.to_device(np.arange(6, dtype=np.float32), host=True)
    b = _mlirgpu.to_device(np.full(6, 2.0, np.float32), host=True)
    out = _mlirgpu.zeros((6,), mg.f32, host=True)
    engine.invoke("axpy", [a, b, f32(10.0), out])
    np.testing.assert_array_equal(out.get(), np.arange(6) * 10 + 2)


def test_scalar_results(engine):
    (total,) = engine.invoke("sum", [np.linspace(0, 1, 11)], [("scalar", "f64")])
    assert isinstance(total, np.float64) and total == pytest.approx(5.5)
    (n,) = engine.invoke("count", [np.int64(40).tobytes(), np.int8(1).tobytes()], [("scalar", mg.i64)])
    assert isinstance(n, np.int64) and n == 42


def test_rank_zero(engine):
    out = np.zeros((), np.float32)
    engine.invoke("scalar_memref", [np.array(3.0, np.float32), out])
    assert out == 9.0


def test_memref_result_is_copied(engine):
    a = np.arange(5, dtype=np.float32)
    (doubled,) = engine.invoke("doubled", [a], [("memref", 1, np.float32)])
    assert isinstance(doubled, np.ndarray) and doubled.dtype == np.float32 and doubled.flags.owndata
    np.testing.assert_array_equal(doubled, 2 * a)


def test_several_results_with_an_argument_returned(engine):
    a, b = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0])
    product, k, same = engine.invoke("outer", [a, b], [("memref", 2, "f64"), ("scalar", "i32"),
                                                         ("memref", 1, "f64")])
    np.testing.assert_array_equal(product, np.outer(a, b))
    assert k == 42 and isinstance(k, np.int32)
    # The argument comes back as a copy, and is not freed: b stays usable.
    np.testing.assert_array_equal(same, b)
    assert not np.shares_memory(same, b)
    b[0] = 5.0
    np.testing.assert_array_equal(b, [5.0, 20.0])


def test_one_allocation_returned_twice_is_freed_once(engine):
    first, second = engine.invoke("same_twice", [np.int64(4).tobytes()], [("memref", 1, "i32"),
                                                                          ("memref", 1, "i32")])
    np.testing.assert_array_equal(first, [0, 1, 2, 3])
    np.testing.assert_array_equal(second, [0, 1, 2, 3])


def test_get_global_result_is_copied_not_freed(engine):
    for _ in range(3):
        (table,) = engine.invoke("constant_table", [], [("memref", 1, "i16")])
        np.testing.assert_array_equal(table, [7, 8, 9])


def test_stack_memory_result_raises(engine):
    with pytest.raises(ValueError, match="stack memory"):
        engine.invoke("on_stack", [], [("memref", 1, "f32")])


def test_the_call_releases_the_gil(engine):
    flag = np.zeros(1, np.int32)
    results = []
    worker = threading.Thread(target=lambda: results.append(
        engine.invoke("wait_for_flag", [flag], [("scalar", "i32")])))
    worker.start()
    flag[0] = 7          # runs only if the worker's call let go of the GIL
    worker.join()
    assert results == [(7,)]


def test_unknown_function(engine):
    with pytest.raises(ValueError, match="no function 'nonesuch'"):
        engine.invoke("nonesuch", [])


def test_wrong_number_of_arguments(engine):
    with pytest.raises(TypeError, match="axpy takes 4 arguments, got 3"):
        engine.invoke("axpy", [np.zeros(2, np.float32)] * 3)


@pytest.mark.parametrize("bad", [[1.0], "text", None, object()])
def test_arguments_of_the_wrong_kind(engine, bad):
    with pytest.raises(TypeError):
        engine.invoke("sum", [bad], [("scalar", "f64")])


def test_args_not_a_sequence(engine):
    with pytest.raises(TypeError, match="args must be a sequence"):
        engine.invoke("sum", 3, [("scalar", "f64")])


def test_object_arrays_are_refused(engine):
    with pytest.raises(TypeError, match="cannot be passed"):
        engine.invoke("sum", [np.array([1.0, None])], [("scalar", "f64")])


def test_stride_not_a_multiple_of_the_itemsize(engine):
    record = np.zeros(4, dtype=[("x", np.float32), ("tag", np.int8)])["x"]   # stride 5 bytes
    ones = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="not a multiple of the item size"):
        engine.invoke("axpy", [record, ones, f32(1.0), ones])


def test_scalar_bytes_checked(engine):
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="1, 2, 4 or 8 bytes"):
        engine.invoke("axpy", [a, a, b"\0\0\0", a])
    with pytest.raises(ValueError, match="the parameter is f32"):
        engine.invoke("axpy", [a, a, np.float64(1.0).tobytes(), a])
    with pytest.raises(TypeError, match="not a memref"):
        engine.invoke("axpy", [a, a, a, a])


@pytest.mark.parametrize("results, match", [
    ([], "returns f64"),
    ([("scalar", "f32")], "returns f64"),
    ([("memref", 1, "f64")], "returns f64"),
    ([("scalar", "f64"), ("scalar", "f64")], "returns f64"),
    ([("tensor", "f64")], r"must be \('memref', rank, dtype\)"),
    ([("memref", -1, "f64")], "rank must be"),
])
def test_results_must_describe_the_return_type(engine, results, match):
    with pytest.raises(ValueError, match=match):
        engine.invoke("sum", [np.zeros(3)], results)


def test_result_rank_checked(engine):
    with pytest.raises(ValueError, match="does not describe"):
        engine.invoke("doubled", [np.zeros(3, np.float32)], [("memref", 2, "f32")])


def test_result_dtype_unknown(engine):
    with pytest.raises(ValueError):
        engine.invoke("sum", [np.zeros(3)], [("scalar", "float7")])


MISSING = """
func.func private @mlirgpu_no_such_function(f32) -> f32
func.func private @another_missing_one()
func.func @f(%x: f32) -> f32 attributes {llvm.emit_c_interface} {
  %y = func.call @mlirgpu_no_such_function(%x) : (f32) -> f32
  func.call @another_missing_one() : () -> ()
  return %y : f32
}
"""


def test_unresolved_symbols_raise_before_the_jit():
    with pytest.raises(mg.CompileError, match="mlirgpu_no_such_function, another_missing_one"):
        ExecutionEngine(lowered(MISSING))


def test_runtime_functions_need_runtime():
    text = """
    func.func private @mgpuStreamCreate() -> !llvm.ptr
    func.func @f() attributes {llvm.emit_c_interface} {
      %s = func.call @mgpuStreamCreate() : () -> !llvm.ptr
      return
    }
    """
    with pytest.raises(mg.CompileError, match=r"mgpuStreamCreate \(mgpu\* functions need runtime=True\)"):
        ExecutionEngine(lowered(text))


def test_runtime_functions_resolve_with_runtime():
    text = """
    func.func private @mgpuStreamCreate() -> !llvm.ptr
    func.func private @mgpuStreamDestroy(!llvm.ptr)
    func.func @stream() attributes {llvm.emit_c_interface} {
      %s = func.call @mgpuStreamCreate() : () -> !llvm.ptr
      func.call @mgpuStreamDestroy(%s) : (!llvm.ptr) -> ()
      return
    }
    func.func @nothing() attributes {llvm.emit_c_interface} {
      return
    }
    """
    engine = ExecutionEngine(lowered(text), runtime=True)
    assert engine.runtime is True
    assert engine.invoke("nothing", [], timeline=[]) is None     # no runtime call: no driver needed
    with pytest.raises(TypeError, match="timeline must be None or a list"):
        engine.invoke("nothing", [], timeline=())


def test_timeline_needs_the_runtime(engine):
    with pytest.raises(ValueError, match="runtime=True"):
        engine.invoke("sum", [np.zeros(2)], [("scalar", "f64")], timeline=[])


def test_libm_resolves_from_the_process():
    text = """
    func.func @f(%x: f64) -> f64 attributes {llvm.emit_c_interface} {
      %y = math.tanh %x : f64
      return %y : f64
    }
    """
    engine = ExecutionEngine(lowered(text), opt_level=0)
    (y,) = engine.invoke("f", [np.float64(0.5).tobytes()], [("scalar", "f64")])
    assert y == pytest.approx(np.tanh(0.5))


def test_a_module_not_lowered_raises_compile_error():
    module = ir.Module.parse("func.func @f() attributes {llvm.emit_c_interface} { return }")
    with pytest.raises(mg.CompileError, match="LLVM IR"):
        ExecutionEngine(module)


def test_a_module_that_does_not_verify_raises_mlir_error():
    module = lowered("func.func @f() attributes {llvm.emit_c_interface} { return }")
    with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown(context=module.context):
        ir.Operation.create("arith.constant", results=[ir.Type.f32(context=module.context)])
    with pytest.raises(mg.MLIRError, match="does not verify"):
        ExecutionEngine(module)


def test_bad_constructor_arguments():
    module = lowered("func.func @f() attributes {llvm.emit_c_interface} { return }")
    with pytest.raises(ValueError, match="opt_level"):
        ExecutionEngine(module, opt_level=4)
    with pytest.raises(TypeError):
        ExecutionEngine("func.func @f() { return }")


def test_translate_to_llvm_ir():
    text = _mlirgpu.translate_to_llvm_ir(lowered(TEXT))
    assert "define void @_mlir_ciface_axpy(" in text
    assert "declare i32 @usleep(i32)" in text


def test_invoke_does_not_leak(engine):
    a = np.arange(1000, dtype=np.float64)
    b = np.arange(300, dtype=np.float64)
    out = np.zeros(1000, np.float32)

    def invoke_cycle(i):
        product, k, same = engine.invoke("outer", [a[:200], b], [("memref", 2, "f64"), ("scalar", "i32"),
                                                                  ("memref", 1, "f64")])
        assert product.shape == (200, 300) and k == 42
        (doubled,) = engine.invoke("doubled", [out], [("memref", 1, "f32")])
        engine.invoke("axpy", [out, out, f32(1.0), out])
        (total,) = engine.invoke("sum", [a], [("scalar", "f64")])
        with pytest.raises(TypeError):
            engine.invoke("axpy", [out, out, f32(1.0)])
        with pytest.raises(ValueError):
            engine.invoke("on_stack", [], [("memref", 1, "f32")])
        with pytest.raises(ValueError):
            engine.invoke("sum", [a], [("memref", 3, "f64")])

    # Each cycle returns ~480 kB from malloc: a leak shows at once.
    assert growth(invoke_cycle, 500, 50) < 8 * MB


def test_engines_do_not_leak():
    module = lowered(TEXT)

    def engine_cycle(i):
        engine = ExecutionEngine(module)
        (total,) = engine.invoke("sum", [np.ones(4)], [("scalar", "f64")])
        assert total == 4.0
        del engine
        gc.collect()
        with pytest.raises(mg.CompileError):
            ExecutionEngine(lowered(MISSING))

    assert growth(engine_cycle, 40, 5) < 16 * MB


BF16 = """
func.func @to_bf16(%x: f32) -> i16 attributes {llvm.emit_c_interface, passthrough = ["noinline"]} {
  %y = arith.truncf %x : f32 to bf16
  %z = arith.bitcast %y : bf16 to i16
  return %z : i16
}
func.func @own_features(%x: f32) -> i16 attributes {llvm.emit_c_interface,
                                                    passthrough = [["target-features", "+sse2"]]} {
  %y = arith.truncf %x : f32 to bf16
  %z = arith.bitcast %y : bf16 to i16
  return %z : i16
}
"""


@pytest.mark.parametrize("opt_level", [0, 2, 3])
def test_f32_to_bf16_keeps_subnormals(opt_level):
    """On a CPU with AVX512-BF16, LLVM's own choice of instruction would flush
    1e-40 to zero; the engine rounds it as IEEE and the GPU do, to the smallest
    bf16, in a function with passthrough attributes of its own too. A function
    that names its own CPU features is compiled for those."""
    engine = ExecutionEngine(lowered(BF16), opt_level=opt_level)
    def bits(function, value):
        (result,) = engine.invoke(function, [np.float32(value).tobytes()], [("scalar", "i16")])
        return int(result) & 0xFFFF

    for value, expected in ((1e-40, 0x0001), (-1e-45, 0x8000), (1.0, 0x3F80), (1 + 2**-8, 0x3F80),
                            (1 + 3 * 2**-8, 0x3F82)):
        assert bits("to_bf16", value) == expected, value
    assert bits("own_features", 1.0) == 0x3F80
