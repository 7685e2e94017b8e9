"""Golden IR of the kernel language, one construct at a time (CPU only).

Each test traces a small @mg.kernel, checks its gpu-dialect module with
FileCheck-style regexes in order (checks.filecheck), and for each group of
constructs a representative kernel's PTX must be accepted by ptxas for sm_80
and sm_90a. The last tests walk every operation of a module: each carries
the user's file:line.
"""
import itertools
import re

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import block_dim, block_idx, grid_dim, thread_idx

CHIPS = ["sm_80", "sm_90a"]


def spec_of(kernel, *generic_values):
    """The specialization of `kernel` (no generics: the only one)."""
    return kernel[generic_values] if generic_values else kernel.specialize({})


def body(kernel, *generic_values):
    """The kernel's IR without the trailing #loc definitions."""
    text = spec_of(kernel, *generic_values).ir()
    return "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))


def ops(text, prefix=""):
    """Names of the operations in printed IR, in order (`%x = arith.addi ...` -> 'arith.addi')."""
    found = re.findall(r"^\s*(?:%[\w#:]+(?:, %[\w#:]+)* = )?([a-z_]+\.[a-z_.]+)\b", text, re.MULTILINE)
    return [name for name in found if name.startswith(prefix)]


def count(text, op):
    return ops(text).count(op)


def assert_ptxas(spec, chip, tmp_path):
    """The specialization's PTX for `chip` is accepted by ptxas -arch=chip."""
    ptx = spec.ptx(chip=chip)
    assert f".target {chip}" in ptx
    ptxas_accepts(ptx, chip, tmp_path)


# ==========================================================================
# Thread, block and grid indices
# ==========================================================================

@mg.kernel
def indices(A: mg.memref[4, 3, mg.index]):
    A[0, 0] = thread_idx.x
    A[0, 1] = thread_idx.y
    A[0, 2] = thread_idx.z
    A[1, 0] = block_idx.x
    A[1, 1] = block_idx.y
    A[1, 2] = block_idx.z
    A[2, 0] = block_dim.x
    A[2, 1] = block_dim.y
    A[2, 2] = block_dim.z
    A[3, 0] = grid_dim.x
    A[3, 1] = grid_dim.y
    A[3, 2] = grid_dim.z


def test_indices_of_all_four_on_every_axis():
    text = body(indices)
    patterns = []
    for op, name in [("thread_id", "thread_id"), ("block_id", "block_id"), ("block_dim", "block_dim"),
                     ("grid_dim", "grid_dim")]:
        for axis in "xyz":
            patterns += [rf"%{name}_{axis}\w* = gpu\.{op}\s+{axis} loc",
                         rf"memref\.store %{name}_{axis}\w*, %arg0\[%c\w+, %c\w+\] : memref<4x3xindex>"]
    filecheck(text, *patterns)
    assert len(ops(text, "gpu.thread_id")) == len(ops(text, "gpu.grid_dim")) == 3


def test_index_arithmetic_is_index_typed():
    text = body(sgemm_range, 64, 32, 64, mg.f32)
    filecheck(text, r"%(\w+) = arith\.muli %block_dim_x, %block_id_x : index",
              r"arith\.addi %\w+, %thread_id_x : index")


# ==========================================================================
# Operators
# ==========================================================================

@mg.kernel
def int_ops(A: mg.memref[12, mg.i32], x: mg.i32, y: mg.i32):
    A[0] = x + y
    A[1] = x - y
    A[2] = x * y
    A[3] = x // y
    A[4] = x % y
    A[5] = x & y
    A[6] = x | y
    A[7] = x ^ y
    A[8] = x << y
    A[9] = x >> y
    A[10] = -x
    A[11] = ~x


def test_signed_integer_operators():
    filecheck(body(int_ops),
              r"gpu\.func @int_ops\(%arg0: memref<12xi32> [^,]*, %arg1: i32 [^,]*, %arg2: i32 ",
              r"arith\.addi %arg1, %arg2 : i32", r"arith\.subi %arg1, %arg2 : i32",
              r"arith\.muli %arg1, %arg2 : i32", r"arith\.divsi %arg1, %arg2 : i32",
              r"arith\.remsi %arg1, %arg2 : i32", r"arith\.andi %arg1, %arg2 : i32",
              r"arith\.ori %arg1, %arg2 : i32", r"arith\.xori %arg1, %arg2 : i32",
              r"arith\.shli %arg1, %arg2 : i32", r"arith\.shrsi %arg1, %arg2 : i32",
              r"(%c0_i32\w*) = arith\.constant 0 : i32", r"arith\.subi %c0_i32\w*, %arg1 : i32",
              r"(%c-1_i32\w*) = arith\.constant -1 : i32", r"arith\.xori %arg1, %c-1_i32\w* : i32")


@mg.kernel
def unsigned_ops(A: mg.memref[6, mg.u32], x: mg.u32, y: mg.u32):
    A[0] = x // y
    A[1] = x % y
    A[2] = x >> y
    A[3] = -x
    A[4] = x + 3000000000  # > 2**31: the signless bits of a u32


def test_unsigned_division_remainder_and_shift_are_unsigned():
    filecheck(body(unsigned_ops),
              r"%arg0: memref<6xi32>", r"%arg1: i32",
              r"arith\.divui %arg1, %arg2 : i32", r"arith\.remui %arg1, %arg2 : i32",
              r"arith\.shrui %arg1, %arg2 : i32", r"arith\.subi %c0_i32\w*, %arg1 : i32",
              r"arith\.constant -1294967296 : i32", r"arith\.addi %arg1, %c-1294967296_i32 : i32")


@mg.kernel
def unsigned_invert(A: mg.memref[2, mg.u8], x: mg.u8):
    A[0] = ~x


def test_invert_of_an_unsigned_value_flips_every_bit():
    # ~x on u8 is x ^ 0xff (all ones), as in C on an unsigned char.
    filecheck(body(unsigned_invert), r"(%c-1_i8\w*) = arith\.constant -1 : i8",
              r"arith\.xori %arg1, %c-1_i8\w* : i8")


@mg.kernel
def index_ops(A: mg.memref[5, mg.index]):
    i = thread_idx.x
    A[0] = i // 2
    A[1] = i % 3
    A[2] = i >> 1
    A[3] = ~i
    A[4] = i * block_dim.x


def test_index_operators_are_signed():
    # index is signed, as CUDA C's int indices are: range(-4, 4) compares and divides right
    filecheck(body(index_ops), r"arith\.divsi %thread_id_x, %c2 : index", r"arith\.remsi %thread_id_x, %c3 : index",
              r"arith\.shrsi %thread_id_x, %c1\w* : index", r"arith\.constant -1 : index",
              r"arith\.xori %thread_id_x, %c-1 : index", r"arith\.muli %thread_id_x, %block_dim_x : index")


@mg.kernel
def float_ops(A: mg.memref[8, mg.f32], x: mg.f32, y: mg.f32):
    A[0] = x + y
    A[1] = x - y
    A[2] = x * y
    A[3] = x / y
    A[4] = -x
    A[5] = +x
    A[6] = 2.5 * x
    A[7] = 1 / x


def test_float_operators():
    text = body(float_ops)
    filecheck(text, r"arith\.addf %arg1, %arg2 fastmath<contract> : f32", r"arith\.subf %arg1, %arg2 fastmath<contract> : f32",
              r"arith\.mulf %arg1, %arg2 fastmath<contract> : f32", r"arith\.divf %arg1, %arg2 : f32",
              r"arith\.negf %arg1 : f32",
              r"memref\.store %arg1, %arg0\[%c5\]",  # unary + is the value itself
              r"(%cst\w*) = arith\.constant 2\.500000e\+00 : f32", r"arith\.mulf %cst\w*, %arg1 fastmath<contract> : f32",
              r"(%cst\w*) = arith\.constant 1\.000000e\+00 : f32", r"arith\.divf %cst\w*, %arg1 : f32")
    assert "f64" not in text


@mg.kernel
def float_remainder(A: mg.memref[1, mg.f32], x: mg.f32, y: mg.f32):
    A[0] = x % y


def test_float_remainder_is_c_fmod():
    # x - trunc(x / y) * y: NVVM has no lowering for arith.remf
    text = body(float_remainder)
    filecheck(text, r"(%\d+) = arith\.divf %arg1, %arg2 : f32", r"math\.ceil", r"math\.floor", r"arith\.select",
              r"arith\.mulf %\d+, %arg2 fastmath<contract> : f32", r"arith\.subf %arg1, %\d+ fastmath<contract> : f32")
    assert "remf" not in text


@pytest.mark.parametrize("chip", CHIPS)
def test_float_remainder_passes_ptxas(chip, tmp_path):
    # `%` on floats is accepted by the tracer, so it must also compile (or be refused while tracing).
    assert_ptxas(spec_of(float_remainder), chip, tmp_path)


@mg.kernel
def bool_ops(A: mg.memref[4, mg.bool_], x: mg.f32):
    a = x < 1.0
    b = x > 0.0
    A[0] = a & b
    A[1] = a | b
    A[2] = a ^ b
    A[3] = ~a


def test_bool_operators_are_i1_bitwise():
    filecheck(body(bool_ops), r"%arg0: memref<4xi1>",
              r"(%\d+) = arith\.cmpf olt", r"(%\d+) = arith\.cmpf ogt",
              r"arith\.andi %0, %1 : i1", r"arith\.ori %0, %1 : i1", r"arith\.xori %0, %1 : i1",
              r"%true = arith\.constant true", r"arith\.xori %0, %true : i1")


# ==========================================================================
# Comparisons
# ==========================================================================

@mg.kernel
def compare_float(A: mg.memref[6, mg.bool_], x: mg.f32, y: mg.f32):
    A[0] = x == y
    A[1] = x != y
    A[2] = x < y
    A[3] = x <= y
    A[4] = x > y
    A[5] = x >= y


def test_float_comparisons_are_ordered_except_not_equal():
    filecheck(body(compare_float),
              r"arith\.cmpf oeq, %arg1, %arg2 : f32", r"arith\.cmpf une, %arg1, %arg2 : f32",
              r"arith\.cmpf olt, %arg1, %arg2 : f32", r"arith\.cmpf ole, %arg1, %arg2 : f32",
              r"arith\.cmpf ogt, %arg1, %arg2 : f32", r"arith\.cmpf oge, %arg1, %arg2 : f32")


S = mg.generics("S")


@mg.kernel(generics=(S,))
def compare_int(A: mg.memref[6, mg.bool_], x: S, y: S):
    A[0] = x == y
    A[1] = x != y
    A[2] = x < y
    A[3] = x <= y
    A[4] = x > y
    A[5] = x >= y


@pytest.mark.parametrize("dtype, mlir, kind", [(mg.i32, "i32", "s"), (mg.i64, "i64", "s"), (mg.i8, "i8", "s"),
                                               (mg.u32, "i32", "u"), (mg.u8, "i8", "u"),
                                               (mg.index, "index", "s")])
def test_integer_comparisons_signed_or_unsigned(dtype, mlir, kind):
    filecheck(body(compare_int, dtype), rf"%arg1: {mlir}",
              rf"arith\.cmpi eq, %arg1, %arg2 : {mlir}", rf"arith\.cmpi ne, %arg1, %arg2 : {mlir}",
              rf"arith\.cmpi {kind}lt, %arg1, %arg2 : {mlir}", rf"arith\.cmpi {kind}le, %arg1, %arg2 : {mlir}",
              rf"arith\.cmpi {kind}gt, %arg1, %arg2 : {mlir}", rf"arith\.cmpi {kind}ge, %arg1, %arg2 : {mlir}")


@mg.kernel
def compare_reflected(A: mg.memref[2, mg.bool_], x: mg.f32):
    A[0] = 1.0 < x      # Python asks x.__gt__(1.0)
    A[1] = thread_idx.x >= block_dim.x


def test_comparison_with_literal_on_the_left_and_index_operands():
    filecheck(body(compare_reflected), r"arith\.constant 1\.000000e\+00 : f32", r"arith\.cmpf ogt, %arg1, %cst",
              r"arith\.cmpi sge, %thread_id_x, %block_dim_x : index")


# ==========================================================================
# Python literals: which type they take
# ==========================================================================

@mg.kernel
def literals(F: mg.memref[4, mg.f32], D: mg.memref[2, mg.f64], H: mg.memref[2, mg.f16],
             I: mg.memref[3, mg.i64], U: mg.memref[2, mg.u8], x: mg.f32, n: mg.i64, u: mg.u8):
    F[0] = x + 1        # an int with a float operand: a float constant of its type
    F[1] = x * 0.5      # a float takes the float operand's type: f32, not f64
    D[0] = D[1] + 0.25  # ... and f64 with an f64 operand
    H[0] = H[1] * 2.0
    I[0] = n + 7        # an int takes the integer operand's type
    I[1] = n - 2 ** 40
    U[0] = u + 255
    F[2] = 3            # a store converts a Python number to the element type
    F[3] = x + np.float32(1.5)  # a NumPy scalar keeps its own type


def test_python_literals_take_the_type_of_the_traced_operand():
    text = body(literals)
    filecheck(text,
              r"arith\.constant 1\.000000e\+00 : f32", r"arith\.addf %arg5, %cst\w* fastmath<contract> : f32",
              r"arith\.constant 5\.000000e-01 : f32", r"arith\.mulf %arg5, %cst\w* fastmath<contract> : f32",
              r"arith\.constant 2\.500000e-01 : f64", r"arith\.addf %\d+, %cst\w* fastmath<contract> : f64",
              r"arith\.constant 2\.000000e\+00 : f16", r"arith\.mulf %\d+, %cst\w* fastmath<contract> : f16",
              r"arith\.constant 7 : i64", r"arith\.addi %arg6, %c7_i64 : i64",
              r"arith\.constant 1099511627776 : i64", r"arith\.subi %arg6, %c1099511627776_i64 : i64",
              r"arith\.constant -1 : i8", r"arith\.addi %arg7, %c-1_i8 : i8",
              r"arith\.constant 3\.000000e\+00 : f32", r"memref\.store %cst\w*, %arg0",
              r"arith\.constant 1\.500000e\+00 : f32", r"arith\.addf %arg5, %cst\w* fastmath<contract> : f32")
    f32_lines = [line for line in text.splitlines() if "arith." in line and ": f32" in line]
    assert not [line for line in f32_lines if "f64" in line], "an f64 value in f32 arithmetic"


# ==========================================================================
# mg.constant and mg.cast
# ==========================================================================

@mg.kernel
def constants(F: mg.memref[4, mg.f32], I: mg.memref[3, mg.i64], B: mg.memref[2, mg.bool_],
              H: mg.memref[1, mg.bf16], U: mg.memref[1, mg.u8], X: mg.memref[1, mg.index]):
    F[0] = mg.constant(1.5, mg.f32)
    F[1] = mg.constant(2, mg.f32)
    F[2] = mg.constant(np.float32(2.5), mg.f32)
    F[3] = mg.constant(0.5, np.float32)  # a NumPy dtype names the same type
    I[0] = mg.constant(7, mg.i64)
    I[1] = mg.constant(-1, mg.i64)
    I[2] = mg.constant(3.0, mg.i64)      # an integral float is an integer constant
    B[0] = mg.constant(True, mg.bool_)
    B[1] = mg.constant(0, mg.bool_)
    H[0] = mg.constant(0.5, mg.bf16)
    U[0] = mg.constant(255, mg.u8)
    X[0] = mg.constant(5, mg.index)


def test_constants_of_every_kind():
    filecheck(body(constants),
              r"arith\.constant 1\.500000e\+00 : f32", r"arith\.constant 2\.000000e\+00 : f32",
              r"arith\.constant 2\.500000e\+00 : f32", r"arith\.constant 5\.000000e-01 : f32",
              r"arith\.constant 7 : i64", r"arith\.constant -1 : i64", r"arith\.constant 3 : i64",
              r"arith\.constant true", r"arith\.constant false",
              r"arith\.constant 5\.000000e-01 : bf16", r"arith\.constant -1 : i8",
              r"arith\.constant 5 : index")


KINDS = [mg.bool_, mg.i8, mg.i16, mg.i32, mg.i64, mg.u8, mg.u16, mg.u32, mg.u64, mg.f16, mg.bf16, mg.f32, mg.f64,
         mg.index]
FLOATS = {mg.f16, mg.bf16, mg.f32, mg.f64}
UNSIGNED = {mg.u8, mg.u16, mg.u32, mg.u64}
BITS = {mg.bool_: 1, mg.i8: 8, mg.i16: 16, mg.i32: 32, mg.i64: 64, mg.u8: 8, mg.u16: 16, mg.u32: 32, mg.u64: 64}

SRC, DST = mg.generics("SRC DST")


@mg.kernel(generics=(SRC, DST))
def cast_kernel(A: mg.memref[1, SRC], B: mg.memref[1, DST]):
    B[0] = mg.cast(A[0], DST)


def expected_cast_ops(src, dst):
    """The arith ops of mg.cast(src value, dst) (a cast to bool_ is tested on its own)."""
    if src == dst:
        return []
    if src in FLOATS and dst in FLOATS:
        if {src, dst} == {mg.f16, mg.bf16}:
            return ["arith.extf", "arith.truncf"]  # through f32
        return ["arith.extf" if dst.itemsize > src.itemsize else "arith.truncf"]
    if src in FLOATS:
        if dst == mg.index:
            return ["arith.fptosi", "arith.index_cast"]
        return ["arith.fptoui" if dst in UNSIGNED else "arith.fptosi"]
    if dst in FLOATS:
        if src == mg.index:
            return ["arith.index_cast", "arith.sitofp"]
        return ["arith.uitofp" if src in UNSIGNED or src == mg.bool_ else "arith.sitofp"]
    if dst == mg.index:
        if src == mg.bool_:
            return ["arith.extui", "arith.index_cast"]
        return ["arith.index_castui" if src in UNSIGNED else "arith.index_cast"]
    if src == mg.index:
        return ["arith.index_cast"]
    if BITS[dst] > BITS[src]:
        return ["arith.extui" if src in UNSIGNED or src == mg.bool_ else "arith.extsi"]
    if BITS[dst] < BITS[src]:
        return ["arith.trunci"]
    return []  # same width: the same signless MLIR type


CAST_PAIRS = [(s, d) for s, d in itertools.product(KINDS, KINDS) if d != mg.bool_]


@pytest.mark.parametrize("src, dst", CAST_PAIRS, ids=[f"{s.name}-{d.name}" for s, d in CAST_PAIRS])
def test_cast_between_kinds(src, dst):
    text = body(cast_kernel, src, dst)
    got = [name for name in ops(text, "arith.") if name != "arith.constant"]
    assert got == expected_cast_ops(src, dst), text


@pytest.mark.parametrize("src", [mg.i32, mg.u8, mg.index, mg.f32, mg.f16])
def test_cast_to_bool_is_not_equal_zero(src):
    # mg.cast(2, mg.bool_) is true (Python's bool(2), C's (bool)2); a traced 2 must agree,
    # so a cast to bool_ compares with zero instead of truncating to the low bit.
    text = body(cast_kernel, src, mg.bool_)
    if src in FLOATS:
        filecheck(text, r"arith\.constant 0\.000000e\+00", r"arith\.cmpf une, %0, %cst")
    else:
        filecheck(text, r"arith\.cmpi ne, %0, %c0")
    assert "arith.trunci" not in text and "arith.fptoui" not in text


@mg.kernel
def cast_python_number(B: mg.memref[3, mg.bool_], F: mg.memref[1, mg.f64]):
    B[0] = mg.cast(2, mg.bool_)
    B[1] = mg.cast(0.0, mg.bool_)
    F[0] = mg.cast(3, mg.f64)


def test_cast_of_a_python_number_is_a_constant():
    text = body(cast_python_number)
    filecheck(text, r"arith\.constant true", r"arith\.constant false", r"arith\.constant 3\.000000e\+00 : f64")
    assert not [name for name in ops(text, "arith.") if name != "arith.constant"]


@pytest.mark.parametrize("chip", CHIPS)
def test_casts_pass_ptxas(chip, tmp_path):
    for src, dst in [(mg.f32, mg.i32), (mg.u32, mg.f64), (mg.f16, mg.bf16), (mg.index, mg.f32),
                     (mg.bool_, mg.index), (mg.i64, mg.u8), (mg.f64, mg.f16)]:
        assert_ptxas(cast_kernel[src, dst], chip, tmp_path)


# ==========================================================================
# mg.select and mg.math
# ==========================================================================

@mg.kernel
def selects(F: mg.memref[2, mg.f32], I: mg.memref[1, mg.i32], x: mg.f32, n: mg.i32):
    F[0] = mg.select(x < 0.0, -x, x)
    F[1] = mg.select(x < 0.0, 0.0, x)
    I[0] = mg.select(n < 0, 0, n)


def test_select():
    filecheck(body(selects),
              r"(%\d+) = arith\.cmpf olt, %arg2", r"arith\.negf %arg2", r"arith\.select %0, %1, %arg2 : f32",
              r"arith\.cmpf olt, %arg2", r"arith\.constant 0\.000000e\+00 : f32",
              r"arith\.select %\d+, %cst\w*, %arg2 : f32",
              r"arith\.cmpi slt, %arg3, %c0_i32", r"arith\.select %\d+, %c0_i32\w*, %arg3 : i32")


FT = mg.generics("FT")


@mg.kernel(generics=(FT,))
def math_float(A: mg.memref[22, FT], x: FT, y: FT):
    A[0] = mg.math.exp(x)
    A[1] = mg.math.exp2(x)
    A[2] = mg.math.log(x)
    A[3] = mg.math.log2(x)
    A[4] = mg.math.log10(x)
    A[5] = mg.math.sqrt(x)
    A[6] = mg.math.rsqrt(x)
    A[7] = mg.math.sin(x)
    A[8] = mg.math.cos(x)
    A[9] = mg.math.tan(x)
    A[10] = mg.math.tanh(x)
    A[11] = mg.math.erf(x)
    A[12] = mg.math.floor(x)
    A[13] = mg.math.ceil(x)
    A[14] = mg.math.round(x)
    A[15] = mg.math.trunc(x)
    A[16] = mg.math.fma(x, y, 1.0)
    A[17] = mg.math.abs(x)
    A[18] = mg.math.min(x, y)
    A[19] = mg.math.max(x, 0.0)
    A[20] = mg.math.pow(x, 2.0)
    A[21] = mg.math.atan2(y, x)


@pytest.mark.parametrize("dtype, mlir", [(mg.f32, "f32"), (mg.f64, "f64")])
def test_math_functions_on_floats(dtype, mlir):
    text = body(math_float, dtype)
    unary = ["exp", "exp2", "log", "log2", "log10", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
             "floor", "ceil", "round"]  # trunc is floor or ceil by sign: NVVM cannot lower math.trunc
    filecheck(text, *[rf"math\.{name} %arg1 : {mlir}" for name in unary],
              rf"math\.fma %arg1, %arg2, %cst\w* : {mlir}", rf"math\.absf %arg1 : {mlir}",
              rf"arith\.minnumf %arg1, %arg2 : {mlir}", rf"arith\.maxnumf %arg1, %cst\w* : {mlir}",
              rf"math\.powf %arg1, %cst\w* : {mlir}", rf"math\.atan2 %arg2, %arg1 : {mlir}")
    other = "f64" if mlir == "f32" else "f32"
    assert other not in text


@mg.kernel
def math_int(I: mg.memref[3, mg.i32], U: mg.memref[3, mg.u32], n: mg.i32, u: mg.u32):
    I[0] = mg.math.abs(n)
    I[1] = mg.math.min(n, 3)
    I[2] = mg.math.max(n, 3)
    U[0] = mg.math.abs(u)
    U[1] = mg.math.min(u, 3)
    U[2] = mg.math.max(u, 3)


def test_math_on_integers():
    text = body(math_int)
    filecheck(text, r"math\.absi %arg2 : i32", r"arith\.minsi %arg2, %c3_i32\w* : i32",
              r"arith\.maxsi %arg2, %c3_i32\w* : i32",
              r"memref\.store %arg3, %arg1\[%c0\w*\]",  # abs of an unsigned value is the value
              r"arith\.minui %arg3, %c3_i32\w* : i32", r"arith\.maxui %arg3, %c3_i32\w* : i32")


@mg.kernel
def builtin_min_max(A: mg.memref[2, mg.f32], x: mg.f32, y: mg.f32):
    A[0] = min(x, y)
    A[1] = max(x, y, 1.0)


def test_python_min_max_on_traced_values():
    filecheck(body(builtin_min_max), r"arith\.minnumf %arg1, %arg2 : f32",
              r"arith\.maxnumf %arg1, %arg2 : f32", r"arith\.maxnumf %\d+, %cst\w* : f32")


@mg.kernel
def builtin_abs(A: mg.memref[1, mg.f32], x: mg.f32):
    A[0] = abs(x)


def test_python_abs_on_a_traced_value():
    filecheck(body(builtin_abs), r"math\.absf %arg1 : f32")


MATH_FUNCTIONS = [mg.math.exp, mg.math.exp2, mg.math.log, mg.math.log2, mg.math.log10, mg.math.sqrt,
                  mg.math.rsqrt, mg.math.sin, mg.math.cos, mg.math.tan, mg.math.tanh, mg.math.erf, mg.math.floor,
                  mg.math.ceil, mg.math.round, mg.math.trunc, mg.math.abs, mg.math.fma, mg.math.min, mg.math.max,
                  mg.math.pow, mg.math.atan2]
FN = mg.generics("FN")


@mg.kernel(generics=(FN, FT))
def one_math_function(A: mg.memref[FN, FT], x: FT, y: FT):
    # FN is a size generic used as a (1-based) position in MATH_FUNCTIONS: one module per function
    function = MATH_FUNCTIONS[FN - 1]
    if function is mg.math.fma:
        A[0] = function(x, y, x)
    elif function in (mg.math.min, mg.math.max, mg.math.pow, mg.math.atan2):
        A[0] = function(x, y)
    else:
        A[0] = function(x)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("dtype", [mg.f16, mg.f32, mg.f64], ids=["f16", "f32", "f64"])
@pytest.mark.parametrize("position", range(1, len(MATH_FUNCTIONS) + 1),
                         ids=[f.__name__ for f in MATH_FUNCTIONS])
def test_math_function_passes_ptxas(position, dtype, chip, tmp_path):
    spec = one_math_function[position, dtype]
    assert f"math.{MATH_FUNCTIONS[position - 1].__name__}" in spec.ir() or "arith." in spec.ir()
    assert_ptxas(spec, chip, tmp_path)


@pytest.mark.parametrize("chip", CHIPS)
def test_math_on_integers_and_select_pass_ptxas(chip, tmp_path):
    assert_ptxas(spec_of(math_int), chip, tmp_path)
    assert_ptxas(spec_of(selects), chip, tmp_path)


@pytest.mark.parametrize("chip", CHIPS)
def test_operators_and_comparisons_pass_ptxas(chip, tmp_path):
    for kernel in (indices, int_ops, unsigned_ops, index_ops, float_ops, bool_ops, compare_float, literals,
                   constants):
        assert_ptxas(spec_of(kernel), chip, tmp_path)
    assert_ptxas(compare_int[mg.u32], chip, tmp_path)


# ==========================================================================
# Memref loads and stores
# ==========================================================================

@mg.kernel
def memrefs(A: mg.memref[8, mg.f32], B: mg.memref[8, 4, mg.f32], C: mg.memref[2, 3, 4, mg.f32],
            i: mg.i32, j: mg.u32, k: mg.i64):
    A[1] = A[0]
    B[2, 3] = B[thread_idx.x, 1]
    C[1, 2, 3] = C[0, thread_idx.y, 2] + 1.0


def test_loads_and_stores_1_to_3_d_with_index_indices():
    filecheck(body(memrefs),
              r"%arg0: memref<8xf32>", r"%arg1: memref<8x4xf32>", r"%arg2: memref<2x3x4xf32>",
              r"(%\d+) = memref\.load %arg0\[%c0\] : memref<8xf32>",
              r"memref\.store %0, %arg0\[%c1\] : memref<8xf32>",
              r"memref\.load %arg1\[%thread_id_x, %c1\w*\] : memref<8x4xf32>",
              r"memref\.store %\d+, %arg1\[%c2, %c3\] : memref<8x4xf32>",
              r"memref\.load %arg2\[%c0\w*, %thread_id_y, %c2\w*\] : memref<2x3x4xf32>",
              r"arith\.addf", r"memref\.store %\d+, %arg2\[%c1\w*, %c2\w*, %c3\w*\] : memref<2x3x4xf32>")


@mg.kernel
def memrefs_int_indices(A: mg.memref[8, mg.f32], B: mg.memref[8, 4, mg.f32], C: mg.memref[2, 3, 4, mg.f32],
                        i: mg.i32, j: mg.u32, k: mg.i64):
    A[i] = 1.0
    B[i, j] = B[j, i]
    C[i, j, k] = 2.0


def test_integer_indices_are_index_cast():
    filecheck(body(memrefs_int_indices),
              r"(%\d+) = arith\.index_cast %arg3 : i32 to index", r"memref\.store %cst, %arg0\[%0\]",
              r"(%\d+) = arith\.index_castui %arg4 : i32 to index", r"(%\d+) = arith\.index_cast %arg3 : i32 to index",
              r"memref\.load %arg1\[%1, %2\]",
              r"arith\.index_cast %arg3 : i32 to index", r"arith\.index_castui %arg4 : i32 to index",
              r"memref\.store %\d+, %arg1\[%\d+, %\d+\]",
              r"arith\.index_cast %arg3 : i32 to index", r"arith\.index_castui %arg4 : i32 to index",
              r"arith\.index_cast %arg5 : i64 to index", r"memref\.store %cst\w*, %arg2\[%\d+, %\d+, %\d+\]")


@pytest.mark.parametrize("chip", CHIPS)
def test_memrefs_pass_ptxas(chip, tmp_path):
    assert_ptxas(spec_of(memrefs), chip, tmp_path)
    assert_ptxas(spec_of(memrefs_int_indices), chip, tmp_path)


# ==========================================================================
# for loops
# ==========================================================================

@mg.kernel
def range_forms(A: mg.memref[8, mg.f32], n: mg.i32, lo: mg.index):
    for i in range(8):
        A[i] = 0.0
    for i in range(2, n):
        A[i] = 1.0
    for i in range(lo, 8, 2):
        A[i] = 2.0
    for i in mg.range_(1, n, 3):
        A[i] = 3.0


def test_for_over_range_with_one_two_three_arguments():
    filecheck(body(range_forms),
              r"%c0 = arith\.constant 0 : index", r"%c8 = arith\.constant 8 : index", r"%c1 = arith\.constant 1 : index",
              r"scf\.for %arg3 = %c0 to %c8 step %c1 \{", r"memref\.store %cst, %arg0\[%arg3\]", r"\}",
              r"%c2 = arith\.constant 2 : index", r"(%\d+) = arith\.index_cast %arg1 : i32 to index",
              r"scf\.for %arg3 = %c2 to %0 step %c1_\d+ \{", r"arith\.constant 1\.0",
              r"scf\.for %arg3 = %arg2 to %c8_\d+ step %c2_\d+ \{", r"arith\.constant 2\.0",
              r"(%\d+) = arith\.index_cast %arg1 : i32 to index", r"%c3 = arith\.constant 3 : index",
              r"scf\.for %arg3 = %c1_\d+ to %1 step %c3 \{", r"arith\.constant 3\.0")
    assert count(body(range_forms), "scf.for") == 4


@mg.kernel
def range_descending(A: mg.memref[8, mg.f32]):
    for i in range(7, -1, -1):
        A[i] = 1.0


def test_for_over_a_descending_range_runs_python_s_iterations():
    # range(7, -1, -1) visits 7, 6, ..., 0; scf.for needs a positive step, so a
    # negative one must be rewritten (or refused with a CompileError), never emitted.
    try:
        text = body(range_descending)
    except mg.CompileError as error:
        assert f"{__file__}:" in str(error) and "range(7, -1, -1)" in str(error)
        return
    assert not re.search(r"scf\.for .* step %c-\d", text), text


@mg.kernel
def nested_loops(A: mg.memref[8, 8, mg.f32], B: mg.memref[8, mg.f32]):
    for i in range(8):
        s = mg.constant(0.0, mg.f32)
        for j in range(i, 8):
            s += A[i, j]
        B[i] = s


def test_nested_loops():
    filecheck(body(nested_loops),
              r"scf\.for %arg2 = %c0 to %c8 step %c1 \{",
              r"%cst = arith\.constant 0\.000000e\+00 : f32",
              r"(%\d+) = scf\.for %arg3 = %arg2 to %c8_\d+ step %c1_\d+ iter_args\(%arg4 = %cst\) -> \(f32\) \{",
              r"memref\.load %arg0\[%arg2, %arg3\]", r"arith\.addf %arg4, %\d+ fastmath<contract> : f32", r"scf\.yield %\d+ : f32",
              r"\} loc", r"memref\.store %0, %arg1\[%arg2\]", r"\} loc")


@mg.kernel
def loop_carried(A: mg.memref[8, mg.f32], n: mg.i32):
    acc = mg.constant(0.0, mg.f32)
    cnt = mg.constant(0, mg.i32)
    for i in range(n):
        t = A[i] * 2.0      # defined inside only: local to the body
        acc += t
        cnt = cnt + 1
    A[0] = acc
    A[1] = mg.cast(cnt, mg.f32)


def test_loop_carried_values_found_automatically():
    text = body(loop_carried)
    filecheck(text, r"%cst = arith\.constant 0\.000000e\+00 : f32", r"%c0_i32 = arith\.constant 0 : i32",
              r"(%\d+):2 = scf\.for %arg2 = %c0 to %\d+ step %c1 iter_args\(%arg3 = %cst, %arg4 = %c0_i32\) "
              r"-> \(f32, i32\) \{",
              r"arith\.mulf", r"(%\d+) = arith\.addf %arg3, %\d+ fastmath<contract> : f32", r"(%\d+) = arith\.addi %arg4, %c1_i32 : i32",
              r"scf\.yield %\d+, %\d+ : f32, i32", r"memref\.store %1#0, %arg0",
              r"arith\.sitofp %1#1 : i32 to f32")
    assert count(text, "scf.yield") == 1


@mg.kernel
def loop_python_float(A: mg.memref[8, mg.f32]):
    acc = 0.0
    for i in range(8):
        acc = acc + A[i]
    A[0] = acc


def test_loop_carried_python_float_updated_with_f32_is_f32():
    text = body(loop_python_float)
    filecheck(text, r"%cst = arith\.constant 0\.000000e\+00 : f32",
              r"(%\d+) = scf\.for %arg1 = %c0 to %c8 step %c1 iter_args\(%arg2 = %cst\) -> \(f32\)",
              r"arith\.addf %arg2, %\d+ fastmath<contract> : f32", r"scf\.yield %\d+ : f32", r"memref\.store %0, %arg0")
    assert "f64" not in text


@mg.kernel
def loop_python_float_f64(A: mg.memref[8, mg.f64]):
    acc = 0.0
    for i in range(8):
        acc += A[i]
    A[0] = acc


def test_loop_carried_python_float_updated_with_f64_is_retraced_as_f64():
    text = body(loop_python_float_f64)
    filecheck(text, r"%cst = arith\.constant 0\.000000e\+00 : f64",
              r"(%\d+) = scf\.for %arg1 = %c0 to %c8 step %c1 iter_args\(%arg2 = %cst\) -> \(f64\)",
              r"arith\.addf %arg2, %\d+ fastmath<contract> : f64", r"scf\.yield %\d+ : f64")


@mg.kernel
def loop_python_int_i64(A: mg.memref[8, mg.i64]):
    acc = 0
    for i in range(8):
        acc = acc + A[i]
    A[0] = acc


def test_loop_carried_python_int_updated_with_i64_is_retraced_as_i64():
    filecheck(body(loop_python_int_i64), r"arith\.constant 0 : i64",
              r"scf\.for .* iter_args\(%arg2 = %c0_i64\) -> \(i64\)", r"arith\.addi %arg2, %\d+ : i64")


@mg.kernel
def loop_retrace_assign(A: mg.memref[8, mg.f64]):
    last = 0.0
    for i in range(8):
        last = A[i]
    A[0] = last


def test_retraced_loop_leaves_nothing_of_the_first_attempt():
    # The first attempt guessed f32 for `last`; after the retrace, the module
    # holds one loop with one set of bounds and no f32 at all.
    text = body(loop_retrace_assign)
    filecheck(text, r"%cst = arith\.constant 0\.000000e\+00 : f64",
              r"(%\d+) = scf\.for %arg1 = %c0 to %c8 step %c1 iter_args\(%arg2 = %cst\) -> \(f64\)")
    assert "f32" not in text, text
    assert count(text, "scf.for") == 1
    assert count(text, "arith.constant") == 5, text  # 0.0, the bounds 0, 8, 1, the store's index 0


@mg.kernel
def explicit_one(A: mg.memref[8, mg.f32]):
    tmp = mg.constant(0.0, mg.f32)
    for k, tmp in mg.range_(8, iter_args=[tmp]):
        tmp += A[k]
        tmp = yield tmp
    A[0] = tmp


def test_explicit_range_with_one_iter_arg():
    filecheck(body(explicit_one), r"%cst = arith\.constant 0\.000000e\+00 : f32",
              r"(%\d+) = scf\.for %arg1 = %c0 to %c8 step %c1 iter_args\(%arg2 = %cst\) -> \(f32\) \{",
              r"memref\.load %arg0\[%arg1\]", r"arith\.addf %arg2, %\d+ fastmath<contract> : f32", r"scf\.yield %\d+ : f32",
              r"memref\.store %0, %arg0\[%c0_\d+\]")


@mg.kernel
def explicit_two(A: mg.memref[8, mg.f32], B: mg.memref[8, mg.i32]):
    s = mg.constant(0.0, mg.f32)
    c = mg.constant(0, mg.i32)
    for k, s, c in mg.range_(0, 8, 2, iter_args=[s, c]):
        s = s + A[k]
        c = c + B[k]
        s, c = yield s, c
    A[0] = s
    B[0] = c


def test_explicit_range_with_two_iter_args():
    filecheck(body(explicit_two),
              r"(%\d+):2 = scf\.for %arg2 = %c0 to %c8 step %c2 iter_args\(%arg3 = %cst, %arg4 = %c0_i32\) "
              r"-> \(f32, i32\) \{",
              r"arith\.addf %arg3", r"arith\.addi %arg4", r"scf\.yield %\d+, %\d+ : f32, i32",
              r"memref\.store %0#0, %arg0", r"memref\.store %0#1, %arg1")


@mg.kernel
def unrolled(A: mg.memref[8, mg.f32]):
    for i in mg.static_range(1, 8, 2):
        A[i] = A[i] * 2.0


def test_static_range_unrolls():
    text = body(unrolled)
    assert count(text, "scf.for") == 0
    assert count(text, "memref.load") == count(text, "memref.store") == count(text, "arith.mulf") == 4
    filecheck(text, *[rf"%c{i}\w* = arith\.constant {i} : index" for i in (1, 3, 5, 7)])


@pytest.mark.parametrize("chip", CHIPS)
def test_loops_pass_ptxas(chip, tmp_path):
    for kernel in (range_forms, nested_loops, loop_carried, loop_python_float, explicit_one, explicit_two,
                   unrolled):
        assert_ptxas(spec_of(kernel), chip, tmp_path)


# ==========================================================================
# if / elif / else
# ==========================================================================

@mg.kernel
def if_no_results(A: mg.memref[2, mg.f32], x: mg.f32):
    if x < 0.0:
        A[0] = x
    else:
        A[1] = x
    if x > 1.0:
        A[0] = 1.0


def test_if_else_without_results():
    filecheck(body(if_no_results), r"(%\d+) = arith\.cmpf olt, %arg1", r"scf\.if %0 \{",
              r"memref\.store %arg1, %arg0\[%c0\]", r"\} else \{", r"memref\.store %arg1, %arg0\[%c1\]",
              r"\} loc", r"(%\d+) = arith\.cmpf ogt, %arg1", r"scf\.if %1 \{", r"memref\.store %cst\w*, %arg0",
              r"\} loc")
    text = body(if_no_results)
    assert "scf.yield" not in text


@mg.kernel
def if_results(A: mg.memref[2, mg.f32], x: mg.f32):
    y = x
    if x < 0.0:
        y = -x
        local = y * 3.0   # assigned in one branch only: stays inside it
        A[1] = local
    A[0] = y
    if x > 2.0:
        z = x
    else:
        z = 2.0
    A[1] = z


def test_if_yields_the_variables_assigned_in_its_branches():
    filecheck(body(if_results),
              r"(%\d+) = arith\.cmpf olt, %arg1", r"(%\d+) = scf\.if %0 -> \(f32\) \{",
              r"(%\d+) = arith\.negf %arg1", r"arith\.mulf", r"scf\.yield %\d+ : f32", r"\} else \{",
              r"scf\.yield %arg1 : f32", r"\} loc", r"memref\.store %1, %arg0",
              r"arith\.cmpf ogt", r"(%\d+) = scf\.if %\d+ -> \(f32\) \{", r"scf\.yield %arg1 : f32",
              r"\} else \{", r"arith\.constant 2\.000000e\+00 : f32", r"scf\.yield %cst\w* : f32")


@mg.kernel
def if_elif_else(A: mg.memref[2, mg.f32], x: mg.f32):
    y = x
    if x < 0.0:
        y = -x
    elif x > 10.0:
        y = x * 2.0
    else:
        A[1] = x
    A[0] = y


def test_if_elif_else_nests_scf_if():
    filecheck(body(if_elif_else),
              r"(%\d+) = scf\.if %0 -> \(f32\) \{", r"arith\.negf", r"scf\.yield %\d+ : f32", r"\} else \{",
              r"arith\.cmpf ogt", r"(%\d+) = scf\.if %\d+ -> \(f32\) \{", r"arith\.mulf", r"scf\.yield",
              r"\} else \{", r"memref\.store %arg1, %arg0\[%c1\]", r"scf\.yield %arg1 : f32", r"\} loc",
              r"scf\.yield %\d+ : f32", r"\} loc", r"memref\.store %1, %arg0\[%c0\]")
    assert count(body(if_elif_else), "scf.if") == 2


@mg.kernel
def if_python_condition(A: mg.memref[2, mg.f32], x: mg.f32):
    flag = A.shape[0] == 2
    if flag:
        A[0] = x
    else:
        A[1] = x


def test_if_on_a_python_condition_keeps_python_semantics():
    text = body(if_python_condition)
    assert "scf.if" not in text
    filecheck(text, r"memref\.store %arg1, %arg0\[%c0\]")
    assert "%c1 " not in text


FLOAT_T = mg.generics("FLOAT_T")


@mg.kernel(generics=(FLOAT_T,))
def if_python_floats(A: mg.memref[1, FLOAT_T], x: FLOAT_T):
    scale = 1.0
    if x > 0.0:
        scale = 2.0
    A[0] = x * scale


def test_if_assigning_python_floats_yields_them_as_traced_values():
    # Two Python numbers picked by a traced condition become arith.select of
    # constants of the type they meet later.
    filecheck(body(if_python_floats, mg.f32), r"(%\d+) = arith\.cmpf ogt, %arg1",
              r"arith\.constant 2\.000000e\+00 : f32", r"arith\.constant 1\.000000e\+00 : f32",
              r"(%\d+) = arith\.select %0, %cst\w*, %cst\w* : f32", r"arith\.mulf %arg1, %1 fastmath<contract> : f32")


def test_if_assigning_python_floats_in_an_f64_kernel_yields_f64():
    # The Python floats take the type of the value they meet later (f64 here), as in a loop.
    text = body(if_python_floats, mg.f64)
    filecheck(text, r"arith\.select %0, %cst\w*, %cst\w* : f64", r"arith\.mulf %arg1, %1 fastmath<contract> : f64")
    assert "f32" not in text


@pytest.mark.parametrize("chip", CHIPS)
def test_ifs_pass_ptxas(chip, tmp_path):
    for kernel in (if_no_results, if_results, if_elif_else):
        assert_ptxas(spec_of(kernel), chip, tmp_path)


# ==========================================================================
# while
# ==========================================================================

@mg.kernel
def while_traced(A: mg.memref[8, mg.f32], n: mg.i32):
    i = mg.constant(0, mg.i32)
    s = mg.constant(0.0, mg.f32)
    while i < n:
        s = s + A[i]
        i = i + 1
    A[0] = s


def test_while_on_a_traced_condition():
    text = body(while_traced)
    filecheck(text, r"%c0_i32 = arith\.constant 0 : i32", r"%cst = arith\.constant 0\.000000e\+00 : f32",
              r"(%\d+):2 = scf\.while \(%arg2 = %cst, %arg3 = %c0_i32\) : \(f32, i32\) -> \(f32, i32\) \{",
              r"(%\d+) = arith\.cmpi slt, %arg3, %arg1 : i32", r"scf\.condition\(%\d+\) %arg2, %arg3 : f32, i32",
              r"\} do \{", r"memref\.load", r"arith\.addf", r"arith\.addi", r"scf\.yield %\d+, %\d+ : f32, i32",
              r"\} loc", r"memref\.store %\d+#0, %arg0")


def test_while_condition_is_computed_only_inside_the_before_region():
    # Nothing of the condition is left in front of the loop (a dead compare,
    # or a load in a condition like `while A[i] > 0`).
    text = body(while_traced)
    assert count(text, "arith.cmpi") == 1, text


@mg.kernel
def while_python(A: mg.memref[8, mg.f32]):
    i = 0
    while i < 3:
        A[i] = 1.0
        i += 1


def test_while_on_a_python_condition_unrolls():
    text = body(while_python)
    assert "scf.while" not in text
    assert count(text, "memref.store") == 3
    filecheck(text, r"memref\.store %cst\w*, %arg0\[%c0\]", r"memref\.store %cst\w*, %arg0\[%c1\]",
              r"memref\.store %cst\w*, %arg0\[%c2\]")


@pytest.mark.parametrize("chip", CHIPS)
def test_whiles_pass_ptxas(chip, tmp_path):
    assert_ptxas(spec_of(while_traced), chip, tmp_path)
    assert_ptxas(spec_of(while_python), chip, tmp_path)


# ==========================================================================
# Generics
# ==========================================================================

M, K, N, dtype = mg.generics("M K N dtype")


@mg.kernel(generics=(M, K, N, dtype))
def sgemm_naive(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype]):
    one = mg.constant(1.0, dtype)
    tmp = mg.constant(0.0, dtype)
    r = block_dim.x * block_idx.x + thread_idx.x
    c = block_dim.y * block_idx.y + thread_idx.y
    for k, tmp in mg.range_(K, iter_args=[tmp]):
        tmp += A[r, k] * B[k, c]
        tmp = yield tmp
    C[r, c] = tmp + one


@mg.kernel
def sgemm_range(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype]):
    r = block_dim.x * block_idx.x + thread_idx.x
    c = block_dim.y * block_idx.y + thread_idx.y
    acc = mg.constant(0.0, dtype)
    for k in range(K):
        acc += A[r, k] * B[k, c]
    if r < M:
        C[r, c] = acc


def test_generics_become_shapes_bounds_and_element_types():
    text = body(sgemm_naive, 256, 128, 64, mg.f32)
    filecheck(text,
              r"gpu\.func @sgemm_naive\(%arg0: memref<256x128xf32> [^,]*, %arg1: memref<128x64xf32> [^,]*, "
              r"%arg2: memref<256x64xf32> ",
              r"%cst = arith\.constant 1\.000000e\+00 : f32", r"%cst_0 = arith\.constant 0\.000000e\+00 : f32",
              r"%c128 = arith\.constant 128 : index",
              r"scf\.for %arg3 = %c0 to %c128 step %c1 iter_args\(%arg4 = %cst_0\) -> \(f32\)",
              r"memref\.load %arg0\[%1, %arg3\] : memref<256x128xf32>", r"arith\.mulf", r"arith\.addf %arg4",
              r"scf\.yield %\d+ : f32", r"arith\.addf %4, %cst fastmath<contract> : f32",
              r"memref\.store %\d+, %arg2\[%1, %3\] : memref<256x64xf32>")


def test_generic_size_as_a_comparison_bound():
    filecheck(body(sgemm_range, 32, 16, 8, mg.f64), r"memref<32x16xf64>", r"%c16 = arith\.constant 16 : index",
              r"iter_args\(%arg4 = %cst\) -> \(f64\)", r"%c32 = arith\.constant 32 : index",
              r"arith\.cmpi slt, %1, %c32 : index", r"scf\.if")


def test_same_kernel_specialized_twice_gives_two_modules():
    f32 = sgemm_naive[64, 32, 16, mg.f32]
    f64 = sgemm_naive[64, 32, 16, mg.f64]
    assert f32 is not f64
    assert f32 is sgemm_naive[64, 32, 16, mg.f32]  # cached
    a, b = f32.ir(), f64.ir()
    assert a != b
    assert "memref<64x32xf32>" in a and "f64" not in a
    assert "memref<64x32xf64>" in b and "f32" not in b
    filecheck(b, r"arith\.constant 1\.000000e\+00 : f64", r"-> \(f64\)", r"arith\.mulf %\d+, %\d+ fastmath<contract> : f64")


P, Q = mg.generics("P Q")


@mg.kernel(generics=(Q, P))
def ordered_explicitly(A: mg.memref[P, Q, mg.f32]):
    A[0, 0] = 1.0


@mg.kernel
def ordered_by_generics_call(A: mg.memref[Q, P, mg.f32]):
    A[0, 0] = 1.0


def test_kernel_getitem_order_follows_generics_argument():
    assert ordered_explicitly.generics == ["Q", "P"]
    assert "memref<3x5xf32>" in ordered_explicitly[5, 3].ir()   # Q=5, P=3


def test_kernel_getitem_order_without_generics_argument_is_mg_generics_order():
    # P was made before Q by mg.generics("P Q"), whatever order the annotation uses.
    assert ordered_by_generics_call.generics == ["P", "Q"]
    assert "memref<5x3xf32>" in ordered_by_generics_call[3, 5].ir()   # P=3, Q=5
    assert ordered_by_generics_call[3, 5].values == {"P": 3, "Q": 5}


def test_explicit_dtype_accepts_numpy_dtypes():
    assert sgemm_naive[8, 8, 8, np.float32] is sgemm_naive[8, 8, 8, mg.f32]


@pytest.mark.parametrize("chip", CHIPS)
def test_generic_kernels_ptx_and_cubin(chip, tmp_path):
    for spec in (sgemm_naive[256, 128, 256, mg.f32], sgemm_naive[64, 64, 64, mg.f64],
                 sgemm_range[128, 64, 32, mg.f16]):
        assert_ptxas(spec, chip, tmp_path)
        cubin = spec.cubin(chip=chip)
        assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF"


# ==========================================================================
# Locations: every operation carries the user's line
# ==========================================================================

def source_lines(kernel):
    import inspect
    lines, first = inspect.getsourcelines(kernel.function)
    return first, first + len(lines) - 1


LOCATED = [indices, int_ops, float_ops, literals, constants, selects, memrefs_int_indices, range_forms, nested_loops,
           loop_carried, loop_python_float, explicit_two, unrolled, if_results, if_elif_else, while_traced,
           while_python]


@pytest.mark.parametrize("kernel", LOCATED, ids=[k.__name__ for k in LOCATED])
def test_every_operation_is_located_in_the_kernel_source(kernel):
    first, last = source_lines(kernel)
    for op in spec_of(kernel).module().walk():
        location = op.location
        assert location.filename == __file__, (op.name, str(location))
        assert first <= location.line <= last, (op.name, str(location))


def test_operations_carry_their_own_line():
    import inspect
    lines, first = inspect.getsourcelines(loop_carried.function)

    def line_of(text):
        [index] = [i for i, line in enumerate(lines) if text in line]
        return first + index

    by_name = {}
    for op in spec_of(loop_carried).module().walk():
        by_name.setdefault(op.name, set()).add(op.location.line)
    assert by_name["scf.for"] == {line_of("for i in range(n)")}
    assert by_name["arith.mulf"] == {line_of("t = A[i] * 2.0")}
    assert by_name["arith.addf"] == {line_of("acc += t")}
    assert by_name["arith.addi"] == {line_of("cnt = cnt + 1")}
    assert by_name["arith.sitofp"] == {line_of("mg.cast(cnt, mg.f32)")}
    assert by_name["memref.load"] == {line_of("t = A[i] * 2.0")}


def test_ir_text_shows_file_and_line():
    import inspect
    _, first = inspect.getsourcelines(sgemm_naive.function)
    text = sgemm_naive[16, 16, 16, mg.f32].ir()
    assert f'#loc = loc("{__file__}":{first}:0)' in text   # the module and gpu.func: the decorated def
    assert re.search(rf'#loc\d+ = loc\("{re.escape(__file__)}":{first + 2}:0\)', text)  # one = ...


@mg.kernel
def multiply_add(A: mg.memref[64, mg.f32], B: mg.memref[64, mg.f32], C: mg.memref[64, mg.f32]):
    i = thread_idx.x
    C[i] = A[i] * B[i] + C[i]


def test_multiply_add_is_contracted_to_fma_as_nvcc_does():
    ptx = multiply_add.specialize({}).ptx(chip="sm_90a")
    assert "fma.rn.f32" in ptx
    assert "mul.rn.f32" not in ptx and "add.rn.f32" not in ptx
