"""Lists of traced values carried through traced control flow: a register
tile `acc = [0.0] * n` (or nested, `acc[i][j]`) updated in a `for k in
range(K)` body becomes one scf.for iter_arg per element; the same in the
branches of a traced `if` (scf.if results) and in a traced `while`.
Results on the CPU backend against NumPy in float64; the IR's shape; and
the errors for a list that changes in a way a register tile cannot."""
import re

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

M, K, N = mg.generics("M K N")
TM = 4


@mg.kernel
def row_tile(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32]):
    """Each thread computes TM consecutive rows of one column of C = A @ B."""
    c = block_idx.x * block_dim.x + thread_idx.x
    r0 = (block_idx.y * block_dim.y + thread_idx.y) * TM
    acc = [0.0] * TM                        # Python numbers, typed by their traced updates
    for k in range(K):
        b = B[k, c]
        for i in mg.static_range(TM):
            acc[i] += A[r0 + i, k] * b
    for i in mg.static_range(TM):
        C[r0 + i, c] = acc[i]


@mg.kernel
def grid_tile(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32]):
    """A 2x2 register tile per thread, as a list of lists of traced zeros."""
    zero = mg.constant(0.0, mg.f32)
    r0 = (block_idx.y * block_dim.y + thread_idx.y) * 2
    c0 = (block_idx.x * block_dim.x + thread_idx.x) * 2
    acc = [[zero, zero], [zero, zero]]
    for k in range(K):
        a = [A[r0, k], A[r0 + 1, k]]
        b = [B[k, c0], B[k, c0 + 1]]
        for i in mg.static_range(2):
            for j in mg.static_range(2):
                acc[i][j] += a[i] * b[j]
    for i in mg.static_range(2):
        for j in mg.static_range(2):
            C[r0 + i, c0 + j] = acc[i][j]


def operands(m, k, n):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    return A, B, A.astype(np.float64) @ B.astype(np.float64)


def relative_error(got, expected):
    return np.linalg.norm(got.astype(np.float64) - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize("kernel, tile", [(row_tile, (TM, 1)), (grid_tile, (2, 2))], ids=["1d", "2d"])
def test_register_tile_matmul(backend, kernel, tile):
    A, B, expected = operands(32, 24, 16)
    C = np.full((32, 16), np.nan, np.float32)
    block = (8, 4)
    kernel(A, B, C, grid=(16 // (block[0] * tile[1]), 32 // (block[1] * tile[0])), block=block)
    assert relative_error(C, expected) < 1e-6


def test_each_element_is_one_iter_arg():
    text = row_tile[32, 24, 16].ir()
    loop = re.search(r"scf\.for .* iter_args\((.*)\) -> \((.*)\)", text)
    assert loop is not None, text
    assert loop.group(1).count("=") == TM
    assert loop.group(2).split(", ") == ["f32"] * TM
    assert grid_tile[32, 24, 16].ir().count("scf.yield") == 1   # the k loop; static loops unroll


@mg.kernel
def clamp_rows(A: mg.memref[M, N, mg.f32]):
    """A traced if that mutates a list: each element is an scf.if result."""
    r = thread_idx.x
    v = [A[r, 0], A[r, 1], A[r, 2]]
    if A[r, 0] > 0.0:
        v[0] = v[0] * 2.0
        v[2] = 0.0
    else:
        v[1] = -v[1]
    for j in mg.static_range(3):
        A[r, j] = v[j]


def test_list_through_traced_if(backend):
    A = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    expected = A.copy()
    positive = A[:, 0] > 0
    expected[positive, 0] *= 2
    expected[positive, 2] = 0
    expected[~positive, 1] *= -1
    clamp_rows(A, grid=(1,), block=(8,))
    np.testing.assert_array_equal(A, expected)


@mg.kernel
def fibonacci(F: mg.memref[N, mg.i32]):
    """A traced while carrying a tuple: (a, b) = (b, a + b) until a passes a bound."""
    bound = F[thread_idx.x]
    pair = (mg.constant(0, mg.i32), mg.constant(1, mg.i32))
    while pair[1] < bound:
        pair = (pair[1], pair[0] + pair[1])
    F[thread_idx.x] = pair[1]


def test_tuple_through_traced_while(backend):
    F = np.array([1, 2, 10, 100], np.int32)
    fibonacci(F, grid=(1,), block=(4,))
    np.testing.assert_array_equal(F, [1, 2, 13, 144])


def test_outer_list_is_not_mutated_by_the_traced_body():
    """The loop works on its own copy: the list object before the loop keeps its values."""
    seen = {}

    @mg.kernel
    def keep(A: mg.memref[N, mg.f32]):
        acc = [0.0, 0.0]
        before = acc
        for k in range(N):
            acc[0] += A[k]
        seen["same"] = before is acc
        seen["before"] = list(before)
        A[0] = acc[0]

    keep[4].ir()
    assert seen == {"same": False, "before": [0.0, 0.0]}


@mg.kernel
def grows(A: mg.memref[N, mg.f32]):
    acc = [0.0]
    for k in range(N):
        acc = acc + [A[k]]    # grows
    A[0] = acc[0]


@mg.kernel
def holds_a_vector(A: mg.memref[N, mg.f32]):
    acc = [0.0]
    for k in range(0, N, 4):
        acc[0] = mg.vload(A, (k,), 4)    # a float element cannot become a vector
    A[0] = 1.0


@pytest.mark.parametrize("kernel, message", [(grows, "must keep its length"),
                                             (holds_a_vector, "'acc\\[0\\]' is f32 before the loop and vector<4xf32> at the "
                                                                "end of its body: a variable keeps its kind")])
def test_list_that_changes_shape_is_a_compile_error(kernel, message):
    with pytest.raises(mg.CompileError, match=message) as error:
        kernel[8].ir()
    assert "test_kernel_lists.py:" in str(error.value)


def test_memref_reassigned_in_a_traced_loop_is_a_compile_error():
    @mg.kernel
    def swap(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32]):
        for k in range(N):
            A[k] = 1.0
            A = B
    with pytest.raises(mg.CompileError, match="the memref 'A' is reassigned in a traced loop"):
        swap[4].ir()


@mg.kernel
def branch_local_in_unrolled_loop(A: mg.memref[N, mg.f32], s: mg.f32):
    """A variable assigned in one branch of a traced if, the if unrolled twice:
    the second if must see it as undefined (local), not as a value."""
    for j in mg.static_range(2):
        if s == 0.0:
            A[j] = 1.0
        else:
            old = A[j]
            A[j] = old * s


def test_branch_local_variable_in_an_unrolled_loop(backend):
    A = np.array([3.0, 4.0, 5.0], np.float32)
    branch_local_in_unrolled_loop(A, 2.0, grid=(1,), block=(1,))
    np.testing.assert_array_equal(A, [6.0, 8.0, 5.0])
    branch_local_in_unrolled_loop(A, 0.0, grid=(1,), block=(1,))
    np.testing.assert_array_equal(A, [1.0, 1.0, 5.0])
