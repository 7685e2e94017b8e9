"""The runner utilities host programs link in (printMemrefF32 and friends,
vector.print's printF32, printI64, printNewline...): built into mlirgpu, they
print exactly what MLIR's own runner utility libraries print, checked
against those libraries (loaded with ctypes from the MLIR installation),
to the process's standard output in program order. No GPU needed."""
import ctypes
import os

import numpy as np
import pytest

import mlirgpu as mg

LIBDIR = os.environ.get("MLIR_PREFIX", "/usr/lib/llvm-22") + "/lib"
RUNNER_UTILS = os.path.join(LIBDIR, "libmlir_runner_utils.so")
C_RUNNER_UTILS = os.path.join(LIBDIR, "libmlir_c_runner_utils.so")

needs_mlir_libraries = pytest.mark.skipif(not os.path.exists(RUNNER_UTILS),
                                          reason="MLIR's runner utility libraries are not installed")

# (NumPy dtype, MLIR element type, the printer's suffix)
ELEMENTS = [(np.float32, "f32", "F32"), (np.float64, "f64", "F64"), (np.int32, "i32", "I32"),
            (np.int64, "i64", "I64"), (np.int8, "i8", "I8"), (np.int16, "i16", "I16")]


def printing_program(shape, element, suffix, strided):
    rank = len(shape)
    dims = "x".join("?" * rank) + "x" if rank else ""
    layout = f", strided<[{', '.join('?' * rank)}], offset: ?>" if strided else ""
    ranked = f"memref<{dims}{element}{layout}>"
    return f"""
module {{
  func.func @show(%a: {ranked}) {{
    %u = memref.cast %a : {ranked} to memref<*x{element}>
    call @printMemref{suffix}(%u) : (memref<*x{element}>) -> ()
    return
  }}
  func.func private @printMemref{suffix}(memref<*x{element}>) attributes {{llvm.emit_c_interface}}
}}
"""


class Descriptor(ctypes.Structure):
    """A ranked memref descriptor of rank 4 at most (the rank is passed next to it)."""
    _fields_ = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64),
                ("sizes_and_strides", ctypes.c_int64 * 8)]


def mlir_prints(library, suffix, array):
    """What MLIR's printMemref<suffix>(rank, descriptor) prints for `array`."""
    rank = array.ndim
    d = Descriptor(array.ctypes.data, array.ctypes.data, 0)
    for k in range(rank):
        d.sizes_and_strides[k] = array.shape[k]
        d.sizes_and_strides[rank + k] = array.strides[k] // array.itemsize
    unranked = (ctypes.c_int64 * 2)(rank, ctypes.addressof(d))
    getattr(library, f"_mlir_ciface_printMemref{suffix}")(unranked)


def sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    values = np.asarray(rng.standard_normal(shape) * 1000)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if dtype == np.int8:
            return np.asarray(rng.integers(33, 127, shape, dtype=dtype))   # printed as characters: printable ones
        return np.asarray(rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True))
    values.flat[:3] = [np.nan, np.inf, -0.0][:values.size] if values.size else []
    return values.astype(dtype)


@needs_mlir_libraries
@pytest.mark.parametrize("dtype, element, suffix", ELEMENTS, ids=[e[2] for e in ELEMENTS])
@pytest.mark.parametrize("shape", [(), (1,), (5,), (2, 3), (3, 1, 2), (2, 2, 2, 3), (0, 3)],
                         ids=lambda s: "x".join(map(str, s)) or "rank0")
def test_print_memref_matches_mlir(dtype, element, suffix, shape, capfd):
    library = ctypes.CDLL(RUNNER_UTILS)
    array = sample(dtype, shape, len(shape))
    prog = mg.HostProgram(printing_program(shape, element, suffix, strided=False))
    capfd.readouterr()
    prog("show", array)
    ours = capfd.readouterr().out
    mlir_prints(library, suffix, array)
    theirs = capfd.readouterr().out
    assert ours.startswith("Unranked Memref base@ = ")
    if 0 in shape:
        # MLIR's printer reads past the end of an empty memref and prints what it finds; ours prints [].
        assert ours.splitlines()[0] == theirs.splitlines()[0] and ours.splitlines()[1:] == ["[]"]
    else:
        assert ours == theirs


@needs_mlir_libraries
def test_strided_views_print_as_mlir_prints_them(capfd):
    library = ctypes.CDLL(RUNNER_UTILS)
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    view = base[1::2, ::3]
    prog = mg.HostProgram(printing_program(view.shape, "f32", "F32", strided=True))
    capfd.readouterr()
    prog("show", view)
    ours = capfd.readouterr().out
    mlir_prints(library, "F32", view)
    assert ours == capfd.readouterr().out
    assert "strides = [20, 3]" in ours


VECTOR_PRINT = """
module {
  func.func @main() {
    %v = arith.constant dense<[1.5, 2.0, -3.25]> : vector<3xf32>
    vector.print %v : vector<3xf32>
    %m = arith.constant dense<[[1, -2], [3, 4]]> : vector<2x2xi64>
    vector.print %m : vector<2x2xi64>
    %i = arith.constant -7 : i32
    vector.print %i : i32
    %t = arith.constant true
    vector.print %t : i1
    %x = arith.constant 42 : index
    vector.print %x : index
    %d = arith.constant 1.0e100 : f64
    vector.print %d : f64
    %h = arith.constant 0.5 : f16
    vector.print %h : f16
    %b = arith.constant -2.5 : bf16
    vector.print %b : bf16
    %u = arith.constant dense<[255, 1]> : vector<2xui8>
    vector.print %u : vector<2xui8>
    vector.print str "text, then a newline\\n"
    %e = arith.constant dense<[1.0e-7]> : vector<1xf32>
    vector.print %e : vector<1xf32> punctuation <no_punctuation>
    vector.print punctuation <newline>
    return
  }
}
"""


def test_vector_print(capfd):
    prog = mg.HostProgram(VECTOR_PRINT)
    declared = {line.split("@")[1].split("(")[0] for line in prog.llvm_ir.splitlines() if line.startswith("declare")}
    assert {"printF32", "printI64", "printU64", "printF64", "printF16", "printBF16", "printString",
            "printOpen", "printClose", "printComma", "printNewline"} <= declared
    print("before", end="|")          # Python's own output comes first
    prog("main")
    print("|after")
    assert capfd.readouterr().out == (
        "before|( 1.5, 2, -3.25 )\n( ( 1, -2 ), ( 3, 4 ) )\n-7\n1\n42\n1e+100\n0.5\n-2.5\n( 255, 1 )\n"
        "text, then a newline\n( 1e-07 )\n|after\n")


@needs_mlir_libraries
@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 1.0 / 3, 1e-30, 3.4e38, float("inf"), float("-inf"),
                                   float("nan"), -float("nan"), 123456789.0])
def test_scalar_printing_matches_mlir(value, capfd):
    library = ctypes.CDLL(C_RUNNER_UTILS)
    library.printF32.argtypes = [ctypes.c_float]
    library.printF64.argtypes = [ctypes.c_double]
    prog = mg.HostProgram("""
module {
  func.func @show(%x: f32, %y: f64) {
    vector.print %x : f32
    vector.print %y : f64
    return
  }
}""")
    capfd.readouterr()
    prog("show", np.float32(value), value)
    ours = capfd.readouterr().out
    library.printF32(value)
    library.printNewline()
    library.printF64(value)
    library.printNewline()
    assert ours == capfd.readouterr().out


def test_memref_copy_of_strided_memrefs():
    # memref.copy between non-contiguous memrefs calls the runner utility memrefCopy.
    prog = mg.HostProgram("""
module {
  func.func @copy(%a: memref<4x6xf32, strided<[?, ?], offset: ?>>, %b: memref<4x6xf32, strided<[?, ?], offset: ?>>) {
    memref.copy %a, %b : memref<4x6xf32, strided<[?, ?], offset: ?>> to memref<4x6xf32, strided<[?, ?], offset: ?>>
    return
  }
}""")
    assert "memrefCopy" in prog.llvm_ir
    source = np.arange(48, dtype=np.float32).reshape(8, 6)[::2]
    target = np.zeros((6, 8), np.float32).T[:4, :6]
    prog("copy", source, target)
    np.testing.assert_array_equal(target, source)


def test_vector_print_before_gpu_work_compiles():
    # Lowered, vector.print leaves a bare newline print that MLIR 22 prints so that it would take the
    # next line's value as its own: the lowering never goes through the text of its stages.
    prog = mg.HostProgram("""
module attributes {gpu.container_module} {
  func.func @main() {
    %v = arith.constant dense<[1.5, 2.0]> : vector<2xf32>
    vector.print %v : vector<2xf32>
    %t = gpu.wait async
    gpu.wait [%t]
    return
  }
}""", format="ptx")
    assert "printNewline" in prog.llvm_ir


@needs_mlir_libraries
@pytest.mark.parametrize("element, suffix, dtype", [("f32", "C32", np.complex64), ("f64", "C64", np.complex128)])
def test_complex_memrefs_print_as_mlir_prints_them(element, suffix, dtype, capfd):
    # Complex memrefs cannot be passed in: the program makes its own; the data lines are compared.
    prog = mg.HostProgram(f"""
module {{
  func.func @main() {{
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %m = memref.alloc() : memref<2xcomplex<{element}>>
    %re0 = arith.constant 1.5 : {element}
    %im0 = arith.constant -2.0 : {element}
    %re1 = arith.constant 0.0 : {element}
    %im1 = arith.constant 3.25 : {element}
    %z0 = complex.create %re0, %im0 : complex<{element}>
    %z1 = complex.create %re1, %im1 : complex<{element}>
    memref.store %z0, %m[%c0] : memref<2xcomplex<{element}>>
    memref.store %z1, %m[%c1] : memref<2xcomplex<{element}>>
    %u = memref.cast %m : memref<2xcomplex<{element}>> to memref<*xcomplex<{element}>>
    call @printMemref{suffix}(%u) : (memref<*xcomplex<{element}>>) -> ()
    memref.dealloc %m : memref<2xcomplex<{element}>>
    return
  }}
  func.func private @printMemref{suffix}(memref<*xcomplex<{element}>>)
}}""", pipeline="convert-complex-to-llvm")
    capfd.readouterr()
    prog("main")
    ours = capfd.readouterr().out.splitlines()
    mlir_prints(ctypes.CDLL(RUNNER_UTILS), suffix, np.array([1.5 - 2j, 3.25j], dtype))
    theirs = capfd.readouterr().out.splitlines()
    assert ours[1:] == theirs[1:] == ["[(1.5,-2),  (0,3.25)]"]
