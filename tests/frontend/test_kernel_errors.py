"""Errors of the kernel language, one test per bad input (CPU only).

Tracing errors: mg.CompileError whose message holds `file:line` of the
user's offending line and that line's source text. Launch errors:
Kernel.bind(args) with NumPy arrays and scalars raises mg.LaunchError naming
the parameter before any driver call. Bad generics and annotations:
mg.CompileError.
"""
import inspect
import math

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import thread_idx
from mlirgpu.language import core as language


def helper(value):
    return value * 2.0


def line_of(kernel, text):
    """The line number of the only line of `kernel`'s source containing `text`."""
    lines, first = inspect.getsourcelines(kernel.function)
    found = [first + i for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, f"{text!r} is on lines {found}"
    return found[0]


def assert_compile_error(kernel, text, *more, generics=()):
    """Specializing `kernel` raises CompileError naming this file, the line
    holding `text`, and that text; `more` must be in the message too."""
    with pytest.raises(mg.CompileError) as info:
        spec = kernel[generics] if generics else kernel.specialize({})
        spec.ir()
    message = str(info.value)
    assert f"{__file__}:{line_of(kernel, text)}" in message, message
    assert text.strip() in message, message
    for word in more:
        assert word in message, message
    return message


# ==========================================================================
# Unsupported Python
# ==========================================================================

@mg.kernel
def uses_and(A: mg.memref[2, mg.f32], x: mg.f32):
    if x > 0.0 and x < 1.0:
        A[0] = x


def test_and_on_traced_bools():
    assert_compile_error(uses_and, "if x > 0.0 and x < 1.0:", "`and`")


@mg.kernel
def uses_or(A: mg.memref[2, mg.f32], x: mg.f32):
    A[0] = mg.select(x < 0.0 or x > 1.0, x, 0.0)


def test_or_on_traced_bools():
    assert_compile_error(uses_or, "mg.select(x < 0.0 or x > 1.0, x, 0.0)", "`or`")


@mg.kernel
def uses_not(A: mg.memref[2, mg.f32], x: mg.f32):
    if not x > 0.0:
        A[0] = x


def test_not_on_a_traced_bool():
    assert_compile_error(uses_not, "if not x > 0.0:", "`not`")


@mg.kernel
def uses_chained_comparison(A: mg.memref[2, mg.f32], x: mg.f32):
    if 0.0 < x < 1.0:
        A[0] = x


def test_chained_comparison():
    assert_compile_error(uses_chained_comparison, "if 0.0 < x < 1.0:", "chained comparisons")


@mg.kernel
def uses_break(A: mg.memref[8, mg.f32]):
    for i in range(8):
        A[i] = 1.0
        break


def test_break():
    assert_compile_error(uses_break, "        break", "`break`")


@mg.kernel
def uses_continue(A: mg.memref[8, mg.f32]):
    for i in range(8):
        continue


def test_continue():
    assert_compile_error(uses_continue, "        continue", "`continue`")


@mg.kernel
def returns_a_value(A: mg.memref[8, mg.f32]):
    return A[0]


def test_return_of_a_value():
    assert_compile_error(returns_a_value, "return A[0]", "cannot return a value")


@mg.kernel
def returns_inside_a_loop(A: mg.memref[8, mg.f32]):
    for i in range(8):
        A[i] = 1.0
        return


def test_return_inside_a_loop():
    assert_compile_error(returns_inside_a_loop, "        return", "`return` inside a loop")


@mg.kernel
def returns_inside_an_if(A: mg.memref[8, mg.f32], x: mg.f32):
    if x > 0.0:
        A[0] = x
        return


def test_return_inside_a_traced_if():
    # Only the bare guard `if cond: return` at the top level is an early exit.
    assert_compile_error(returns_inside_an_if, "        return", "`return`", "if cond: return")


@mg.kernel
def calls_python_function(A: mg.memref[8, mg.f32]):
    A[0] = helper(A[1])


def test_calling_a_plain_python_function_on_traced_values():
    assert_compile_error(calls_python_function, "A[0] = helper(A[1])", "helper", "@mg.func")


@mg.kernel
def calls_math_sqrt(A: mg.memref[8, mg.f32]):
    A[0] = math.sqrt(A[1])


def test_calling_stdlib_math_on_a_traced_value():
    # The message should say what was called (math.sqrt) and point at mg.math,
    # not talk about ints, sizes and range().
    assert_compile_error(calls_math_sqrt, "A[0] = math.sqrt(A[1])", "sqrt", "mg.math")


@mg.kernel
def calls_numpy(A: mg.memref[8, mg.f32]):
    A[0] = np.sqrt(A[1])


def test_calling_numpy_on_a_traced_value():
    assert_compile_error(calls_numpy, "A[0] = np.sqrt(A[1])", "sqrt")


@mg.kernel
def uses_try(A: mg.memref[8, mg.f32]):
    try:
        A[0] = 1.0
    except IndexError:
        pass


def test_try():
    assert_compile_error(uses_try, "try:", "try")


@mg.kernel
def uses_with(A: mg.memref[8, mg.f32]):
    with open(__file__):
        A[0] = 1.0


def test_with():
    assert_compile_error(uses_with, "with open(__file__):", "`with`")


@mg.kernel
def uses_lambda(A: mg.memref[8, mg.f32]):
    double = lambda v: v * 2.0  # noqa: E731
    A[0] = double(A[1])


def test_lambda():
    assert_compile_error(uses_lambda, "double = lambda v: v * 2.0", "lambda")


@mg.kernel
def uses_nested_def(A: mg.memref[8, mg.f32]):
    def double(v):
        return v * 2.0
    A[0] = double(A[1])


def test_nested_def():
    assert_compile_error(uses_nested_def, "def double(v):", "nested functions")


@mg.kernel
def uses_for_else(A: mg.memref[8, mg.f32]):
    for i in range(8):
        A[i] = 1.0
    else:
        A[0] = 2.0


def test_for_else():
    assert_compile_error(uses_for_else, "for i in range(8):", "for/else")


@mg.kernel
def uses_while_else(A: mg.memref[8, mg.f32], n: mg.i32):
    i = mg.constant(0, mg.i32)
    while i < n:
        i = i + 1
    else:
        A[0] = 2.0


def test_while_else():
    assert_compile_error(uses_while_else, "while i < n:", "while/else")


@mg.kernel
def uses_power(A: mg.memref[8, mg.f32], x: mg.f32):
    A[0] = x ** 2


def test_power_with_a_small_int_exponent_is_multiplication():
    text = uses_power.specialize({}).ir()
    assert "arith.mulf %arg1, %arg1 fastmath<contract> : f32" in text and "powf" not in text


# ==========================================================================
# Type rules
# ==========================================================================

@mg.kernel
def mixes_f32_and_f64(A: mg.memref[8, mg.f32], B: mg.memref[8, mg.f64]):
    A[0] = A[1] + B[1]


def test_mixing_f32_and_f64_operands():
    assert_compile_error(mixes_f32_and_f64, "A[0] = A[1] + B[1]", "f32", "f64", "mg.cast")


@mg.kernel
def mixes_i32_and_i64(A: mg.memref[8, mg.i32], B: mg.memref[8, mg.i64]):
    A[0] = A[1] * B[1]


def test_mixing_i32_and_i64_operands():
    assert_compile_error(mixes_i32_and_i64, "A[0] = A[1] * B[1]", "i32", "i64")


@mg.kernel
def mixes_index_and_i32(A: mg.memref[8, mg.i32], n: mg.i32):
    A[0] = thread_idx.x + n


def test_mixing_index_and_i32_operands():
    assert_compile_error(mixes_index_and_i32, "A[0] = thread_idx.x + n", "index", "i32")


@mg.kernel
def numpy_float64_with_f32(A: mg.memref[8, mg.f32]):
    A[0] = A[1] * np.float64(0.5)


def test_numpy_float64_scalar_with_an_f32_operand():
    # no silent float64: a NumPy float64 keeps its type and meets an f32 value
    assert_compile_error(numpy_float64_with_f32, "A[0] = A[1] * np.float64(0.5)", "f64", "f32")


@mg.kernel
def python_float_with_int(A: mg.memref[8, mg.i32]):
    A[0] = A[1] * 1.5


def test_python_float_with_an_integer_operand():
    assert_compile_error(python_float_with_int, "A[0] = A[1] * 1.5", "Python float", "i32")


@mg.kernel
def int_true_division(A: mg.memref[8, mg.i32]):
    A[0] = A[1] / A[2]


def test_true_division_of_integers():
    assert_compile_error(int_true_division, "A[0] = A[1] / A[2]", "//")


@mg.kernel
def float_floor_division(A: mg.memref[8, mg.f32]):
    A[0] = A[1] // A[2]


def test_floor_division_of_floats():
    assert_compile_error(float_floor_division, "A[0] = A[1] // A[2]", "//", "f32")


@mg.kernel
def bitwise_on_floats(A: mg.memref[8, mg.f32]):
    A[0] = A[1] & A[2]


def test_bitwise_operator_on_floats():
    assert_compile_error(bitwise_on_floats, "A[0] = A[1] & A[2]", "&", "f32")


@mg.kernel
def arithmetic_on_bools(A: mg.memref[8, mg.bool_], x: mg.f32):
    A[0] = (x < 1.0) + (x > 0.0)


def test_arithmetic_on_bools():
    assert_compile_error(arithmetic_on_bools, "A[0] = (x < 1.0) + (x > 0.0)", "bool")


@mg.kernel
def literal_out_of_range(A: mg.memref[8, mg.i8]):
    A[0] = A[1] + 300


def test_python_int_that_does_not_fit_the_operand():
    assert_compile_error(literal_out_of_range, "A[0] = A[1] + 300", "300", "i8")


@mg.kernel
def stores_f64_into_f32(A: mg.memref[8, mg.f32], B: mg.memref[8, mg.f64]):
    A[0] = B[0]


def test_storing_f64_into_an_f32_memref():
    assert_compile_error(stores_f64_into_f32, "A[0] = B[0]", "f32", "f64")


@mg.kernel
def stores_python_float_into_int(A: mg.memref[8, mg.i32]):
    A[0] = 2.5


def test_storing_a_python_float_into_an_int_memref():
    assert_compile_error(stores_python_float_into_int, "A[0] = 2.5", "i32", "float")


@mg.kernel
def float_index(A: mg.memref[8, mg.f32], x: mg.f32):
    A[x] = 1.0


def test_float_index():
    assert_compile_error(float_index, "A[x] = 1.0", "integer", "f32")


@mg.kernel
def too_few_indices(A: mg.memref[8, 8, mg.f32]):
    A[0] = 1.0


def test_wrong_number_of_indices_too_few():
    assert_compile_error(too_few_indices, "A[0] = 1.0", "2 indices", "got 1")


@mg.kernel
def too_many_indices(A: mg.memref[8, mg.f32]):
    A[0] = A[1, 2]


def test_wrong_number_of_indices_too_many():
    assert_compile_error(too_many_indices, "A[0] = A[1, 2]", "1 indices", "got 2")


@mg.kernel
def slices_global(A: mg.memref[8, mg.f32]):
    A[0] = A[1:3]


def test_slice_of_a_global_memref():
    assert_compile_error(slices_global, "A[0] = A[1:3]", "slice")


@mg.kernel
def traced_float_bound(A: mg.memref[8, mg.f32], x: mg.f32):
    for i in range(x):
        A[0] = 1.0


def test_traced_float_loop_bound():
    assert_compile_error(traced_float_bound, "for i in range(x):", "f32")


@mg.kernel
def python_float_bound(A: mg.memref[8, mg.f32]):
    for i in range(4.0):
        A[0] = 1.0


def test_python_float_loop_bound():
    assert_compile_error(python_float_bound, "for i in range(4.0):", "float")


@mg.kernel
def carried_changes_type(A: mg.memref[8, mg.f32], B: mg.memref[8, mg.i32]):
    v = A[0]
    for i in range(8):
        v = B[i]
    A[0] = 1.0


def test_loop_carried_variable_changing_type():
    assert_compile_error(carried_changes_type, "for i in range(8):", "'v'", "f32", "i32")


@mg.kernel
def while_carried_changes_type(A: mg.memref[8, mg.f32], B: mg.memref[8, mg.i32]):
    v = A[0]
    while v < 1.0:
        v = B[0]


def test_while_carried_variable_changing_type():
    assert_compile_error(while_carried_changes_type, "while v < 1.0:", "'v'", "f32", "i32")


@mg.kernel
def branches_differ(A: mg.memref[8, mg.f32], B: mg.memref[8, mg.i32], x: mg.f32):
    if x > 0.0:
        v = A[0]
    else:
        v = B[0]
    A[0] = 1.0


def test_if_branches_yielding_different_types():
    assert_compile_error(branches_differ, "if x > 0.0:", "'v'", "f32", "i32")


@mg.kernel
def branches_python_values_differ(A: mg.memref[8, mg.f32], x: mg.f32):
    scale = 1
    if x > 0.0:
        scale = 2.5
    A[0] = x * scale


def test_if_branches_giving_python_int_and_float_take_the_float_type_they_meet():
    # A Python int meeting a float is a float constant (the literal rule), so 1 or 2.5 is f32 here.
    text = branches_python_values_differ.specialize({}).ir()
    assert "arith.constant 2.500000e+00 : f32" in text and "arith.constant 1.000000e+00 : f32" in text
    assert "arith.select" in text


@mg.kernel
def integer_condition(A: mg.memref[8, mg.f32], n: mg.i32):
    if n:
        A[0] = 1.0


def test_if_on_a_traced_integer():
    assert_compile_error(integer_condition, "if n:", "bool", "i32")


@mg.kernel
def local_used_after_loop(A: mg.memref[8, mg.f32]):
    for i in range(8):
        t = A[i]
    A[0] = t


def test_variable_defined_only_inside_a_loop_used_after_it():
    # The message names the variable and says why it has no value.
    assert_compile_error(local_used_after_loop, "A[0] = t", "'t'", "inside")


@mg.kernel
def local_used_after_loop_in_arithmetic(A: mg.memref[8, mg.f32]):
    for i in range(8):
        t = A[i]
    A[0] = t + 1.0


def test_variable_defined_only_inside_a_loop_used_in_arithmetic_after_it():
    assert_compile_error(local_used_after_loop_in_arithmetic, "A[0] = t + 1.0", "'t'", "inside")


@mg.kernel
def local_used_after_if(A: mg.memref[8, mg.f32], x: mg.f32):
    if x > 0.0:
        t = x * 2.0
    A[0] = t * 1.0


def test_variable_defined_in_one_branch_used_after_the_if():
    assert_compile_error(local_used_after_if, "A[0] = t * 1.0", "'t'")


@mg.kernel
def python_value_changed_in_loop(A: mg.memref[8, mg.f32]):
    names = []
    for i in range(8):
        names = names + [i]
    A[0] = 1.0


def test_python_object_changed_in_a_traced_loop():
    assert_compile_error(python_value_changed_in_loop, "for i in range(8):", "'names'")


@mg.kernel
def explicit_without_yield(A: mg.memref[8, mg.f32]):
    tmp = mg.constant(0.0, mg.f32)
    for k, tmp in mg.range_(8, iter_args=[tmp]):
        tmp += A[k]
    A[0] = tmp


def test_explicit_range_without_final_yield():
    assert_compile_error(explicit_without_yield, "for k, tmp in mg.range_(8, iter_args=[tmp]):", "yield")


@mg.kernel
def static_range_traced_bound(A: mg.memref[8, mg.f32], n: mg.i32):
    for i in mg.static_range(n):
        A[i] = 1.0


def test_static_range_with_a_traced_bound():
    assert_compile_error(static_range_traced_bound, "for i in mg.static_range(n):", "static_range")


@mg.kernel
def select_on_a_float(A: mg.memref[8, mg.f32], x: mg.f32):
    A[0] = mg.select(x, x, 0.0)


def test_select_on_a_non_bool_condition():
    assert_compile_error(select_on_a_float, "A[0] = mg.select(x, x, 0.0)", "bool")


@mg.kernel
def math_on_an_integer(A: mg.memref[8, mg.f32], n: mg.i32):
    A[0] = mg.math.sqrt(n)


def test_float_math_on_an_integer():
    assert_compile_error(math_on_an_integer, "A[0] = mg.math.sqrt(n)", "mg.math.sqrt", "float")


@mg.kernel
def constant_not_a_number(A: mg.memref[8, mg.f32]):
    A[0] = mg.constant("1.0", mg.f32)


def test_constant_of_a_string():
    assert_compile_error(constant_not_a_number, 'A[0] = mg.constant("1.0", mg.f32)', "str")


@mg.kernel
def constant_not_integral(A: mg.memref[8, mg.i32]):
    A[0] = mg.constant(1.5, mg.i32)


def test_integer_constant_of_a_fraction():
    assert_compile_error(constant_not_integral, "A[0] = mg.constant(1.5, mg.i32)", "1.5", "i32")


@mg.kernel
def constant_out_of_range(A: mg.memref[8, mg.u8]):
    A[0] = mg.constant(256, mg.u8)


@mg.kernel
def constant_below_range(A: mg.memref[8, mg.i8]):
    A[0] = mg.constant(-129, mg.i8)


def test_integer_constants_out_of_range():
    assert_compile_error(constant_out_of_range, "mg.constant(256, mg.u8)", "256 does not fit in u8")
    assert_compile_error(constant_below_range, "mg.constant(-129, mg.i8)", "-129 does not fit in i8")


@mg.kernel
def cast_to_not_a_dtype(A: mg.memref[8, mg.f32]):
    A[0] = mg.cast(A[1], "nope")


def test_cast_to_something_that_is_not_a_dtype():
    assert_compile_error(cast_to_not_a_dtype, 'A[0] = mg.cast(A[1], "nope")', "dtype")


# ==========================================================================
# MLIR verifier errors surface as CompileError at the user's line
# ==========================================================================

@mg.kernel
def emits_invalid_op(A: mg.memref[8, mg.f32], x: mg.f32):
    y = x + 1.0
    z = language.emit("arith.addi", [y, y], [y.value.type])
    A[0] = x


def test_verifier_error_is_a_compile_error_with_the_line():
    # Written like every other CompileError: file:line, then the source text.
    assert_compile_error(emits_invalid_op, 'z = language.emit("arith.addi", [y, y], [y.value.type])',
                         "arith.addi", "signless-integer")


def test_verifier_error_keeps_the_diagnostics():
    with pytest.raises(mg.CompileError) as info:
        emits_invalid_op.specialize({}).ir()
    severity, location, message = info.value.diagnostics[0]
    assert severity == "error"
    assert f":{line_of(emits_invalid_op, 'language.emit')}:" in location and "arith.addi" in message


# ==========================================================================
# Launch errors: Kernel.bind with NumPy arrays and scalars (no GPU)
# ==========================================================================

M, K, N, dtype = mg.generics("M K N dtype")


@mg.kernel
def gemm(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype], alpha: dtype,
         n: mg.i32):
    pass


def arrays(m=4, k=3, n=5, dt=np.float32):
    return np.zeros((m, k), dt), np.zeros((k, n), dt), np.zeros((m, n), dt)


def assert_launch_error(kernel, args, *words):
    with pytest.raises(mg.LaunchError) as info:
        kernel.bind(tuple(args))
    message = str(info.value)
    for word in words:
        assert word in message, message
    return message


def test_bind_infers_generics_from_shapes_and_dtypes():
    A, B, C = arrays()
    assert gemm.bind((A, B, C, 1.0, 3)) == {"M": 4, "K": 3, "N": 5, "dtype": mg.f32}
    assert gemm.bind((A, B, C, np.float32(1.0), np.int32(3)))["dtype"] == mg.f32


def test_launch_too_few_arguments():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0), "5 arguments", "A, B, C, alpha, n", "got 4")


def test_launch_too_many_arguments():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0, 3, 4), "5 arguments", "got 6")


def test_launch_wrong_dtype_contradicting_another_array():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B.astype(np.float64), C, 1.0, 3), "dtype", "f32 from A.dtype",
                        "f64 from B.dtype")


@mg.kernel
def fixed(A: mg.memref[4, 3, mg.f32], n: mg.i32):
    pass


def test_launch_wrong_dtype_of_a_fixed_element_type():
    assert_launch_error(fixed, (np.zeros((4, 3), np.int32), 1), "'A'", "f32", "i32")


def test_launch_dtype_without_mlirgpu_equivalent():
    A, B, C = arrays()
    assert_launch_error(gemm, (A.astype(np.complex64), B, C, 1.0, 3), "'A'", "complex64")


def test_launch_wrong_rank():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C[None], 1.0, 3), "'C'", "2-d", "3-d")


def test_launch_wrong_fixed_size():
    assert_launch_error(fixed, (np.zeros((4, 5), np.float32), 1), "'A'", "3", "5")


def test_launch_contradicting_sizes_name_both_parameters():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, np.zeros((4, 5), np.float32), C, 1.0, 3), "K", "from A.shape[1]",
                        "from B.shape[0]")


def test_launch_contradicting_sizes_later_parameter():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, np.zeros((4, 6), np.float32), 1.0, 3), "N", "from B.shape[1]",
                        "from C.shape[1]")


def test_launch_non_contiguous_numpy_arrays_are_copied_not_refused():
    # NumPy arrays are copied in contiguously and back (docs/arrays.md), so
    # their layout does not matter; device arrays must be contiguous (below).
    A, B, C = arrays()
    strided = np.zeros((4, 6), np.float32)[:, ::2]
    transposed = np.zeros((3, 4), np.float32).T
    for array in (strided, transposed):
        assert array.shape == A.shape and not array.flags.c_contiguous
        assert gemm.bind((array, B, C, 1.0, 3))["M"] == A.shape[0]


class DeviceView:
    """A device array seen only through __cuda_array_interface__ (v3): no driver call is made."""

    def __init__(self, shape, strides):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0x7F0000000000, False),
                                         "strides": strides, "version": 3}


def test_launch_cuda_array_interface_contiguous_binds():
    A, B, C = arrays()
    assert gemm.bind((DeviceView((4, 3), None), B, C, 1.0, 3))["K"] == 3


def test_launch_non_contiguous_cuda_array_interface_with_a_step():
    A, B, C = arrays()
    assert_launch_error(gemm, (DeviceView((4, 3), (24, 8)), B, C, 1.0, 3), "'A'", "contiguous")


def test_launch_non_contiguous_cuda_array_interface_transposed():
    A, B, C = arrays()
    assert_launch_error(gemm, (DeviceView((4, 3), (4, 16)), B, C, 1.0, 3), "'A'", "contiguous")


def test_launch_float_for_an_i32_scalar():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0, 3.5), "'n'", "i32", "float")


def test_launch_integral_float_for_an_i32_scalar():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0, 3.0), "'n'", "i32")


def test_launch_numpy_float_scalar_for_an_i32_scalar():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0, np.float32(3)), "'n'", "i32")


def test_launch_numpy_float64_for_an_f32_dtype_scalar():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, np.float64(1.0), 3), "dtype", "from C.dtype", "from alpha")


@mg.kernel
def scalar_first(alpha: dtype, A: mg.memref[M, dtype]):
    pass


def test_launch_float_for_a_dtype_scalar_bound_to_int_by_a_later_array():
    # The same call as test_launch_float_for_an_i32_scalar, with the scalar before the array that binds dtype.
    assert_launch_error(scalar_first, (1.5, np.zeros(3, np.int32)), "'alpha'", "i32", "float")


@mg.kernel
def small_int(A: mg.memref[M, mg.f32], s: mg.u8, t: mg.i32):
    pass


def test_launch_int_out_of_range_for_an_u8_scalar():
    assert_launch_error(small_int, (np.zeros(3, np.float32), 256, 0), "'s'", "u8", "256")


def test_launch_negative_int_for_an_u8_scalar():
    assert_launch_error(small_int, (np.zeros(3, np.float32), -1, 0), "'s'", "u8", "-1")


def test_launch_int_out_of_range_for_an_i32_scalar():
    assert_launch_error(small_int, (np.zeros(3, np.float32), 1, 2 ** 40), "'t'", "i32")


def test_launch_array_for_a_scalar_parameter():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0, np.zeros(3, np.int32)), "'n'", "scalar", "array")


def test_launch_scalar_for_a_memref_parameter():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, 1.0, C, 1.0, 3), "'B'", "array", "float")


def test_launch_list_for_a_memref_parameter():
    A, B, C = arrays()
    assert_launch_error(gemm, (A.tolist(), B, C, 1.0, 3), "'A'", "array", "list")


def test_launch_object_that_is_not_an_array():
    A, B, C = arrays()
    assert_launch_error(gemm, (object(), B, C, 1.0, 3), "'A'", "object")


def test_launch_string_for_a_scalar():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, "1.0", 3), "'alpha'", "str")


def test_launch_none_for_a_scalar():
    A, B, C = arrays()
    assert_launch_error(gemm, (A, B, C, 1.0, None), "'n'", "NoneType")


@mg.kernel
def undetermined(alpha: dtype, n: mg.i32):
    pass


def test_launch_generic_not_determined_by_the_arguments():
    assert_launch_error(undetermined, (1.5, 3), "dtype", "undetermined[")


def test_specialization_call_with_other_sizes_raises_before_the_driver():
    A, B, C = arrays()
    spec = gemm[8, 3, 5, mg.f32]
    with pytest.raises(mg.LaunchError) as info:
        spec(A, B, C, 1.0, 3, grid=(1,), block=(1,))
    assert "M=4" in str(info.value) and "8" in str(info.value)


# ==========================================================================
# Bad generics in kernel[...] and bad annotations
# ==========================================================================

def test_getitem_too_few_generics():
    with pytest.raises(mg.CompileError, match=r"4 generics \(M, K, N, dtype\), got 3"):
        gemm[4, 3, 5]


def test_getitem_too_many_generics():
    with pytest.raises(mg.CompileError, match=r"4 generics .* got 5"):
        gemm[4, 3, 5, mg.f32, 7]


def test_getitem_dtype_where_a_size_goes():
    with pytest.raises(mg.CompileError, match=r"generic M is a size"):
        gemm[mg.f32, 3, 5, mg.f32]


def test_getitem_size_where_a_dtype_goes():
    with pytest.raises(mg.CompileError, match=r"generic dtype is an element type"):
        gemm[4, 3, 5, 32]


def test_getitem_unknown_dtype_name():
    with pytest.raises(mg.CompileError, match=r"generic dtype is an element type"):
        gemm[4, 3, 5, "float128x"]


def test_getitem_zero_size():
    with pytest.raises(mg.CompileError, match=r"generic K must be positive, got 0"):
        gemm[4, 0, 5, mg.f32]


def test_getitem_negative_size():
    with pytest.raises(mg.CompileError, match=r"generic N must be positive, got -5"):
        gemm[4, 3, -5, mg.f32]


def test_getitem_float_size():
    with pytest.raises(mg.CompileError, match=r"generic M is a size"):
        gemm[4.0, 3, 5, mg.f32]


def test_getitem_bool_size():
    with pytest.raises(mg.CompileError, match=r"generic M is a size"):
        gemm[True, 3, 5, mg.f32]


def test_annotation_memref_without_element_type():
    with pytest.raises(mg.CompileError, match=r"sizes and then the element type"):
        mg.memref[4]


def test_annotation_memref_element_type_not_a_dtype():
    with pytest.raises(mg.CompileError, match=r"element type"):
        mg.memref[4, 5]


def test_annotation_memref_non_positive_size():
    with pytest.raises(mg.CompileError, match=r"positive ints, generics or None \(known at launch\), not 0"):
        mg.memref[0, mg.f32]


def test_annotation_memref_float_size():
    with pytest.raises(mg.CompileError, match=r"positive ints, generics or None \(known at launch\), not 4.0"):
        mg.memref[4.0, mg.f32]


def test_missing_annotation_names_the_parameter():
    with pytest.raises(mg.CompileError, match=r"parameter 'A' needs an annotation"):
        @mg.kernel
        def no_annotation(A):
            pass


def test_annotation_that_is_not_a_type_names_the_parameter():
    with pytest.raises(mg.CompileError, match=r"parameter 'n' needs an annotation"):
        @mg.kernel
        def list_annotation(A: mg.memref[4, mg.f32], n: list):
            pass


def test_parameter_with_a_default():
    with pytest.raises(mg.CompileError, match=r"parameter 'n'"):
        @mg.kernel
        def with_default(A: mg.memref[4, mg.f32], n: mg.i32 = 3):
            pass


def test_generics_argument_missing_a_used_generic():
    with pytest.raises(mg.CompileError, match=r"\['dtype'\]"):
        @mg.kernel(generics=(M,))
        def missing(A: mg.memref[M, dtype]):
            pass


def test_generics_argument_with_a_non_generic():
    with pytest.raises(mg.CompileError, match=r"not 3"):
        @mg.kernel(generics=(M, 3))
        def not_a_generic(A: mg.memref[M, mg.f32]):
            pass
