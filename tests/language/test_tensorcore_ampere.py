"""mg.mma, the warp-level tensor-core operations of sm_80: the PTX each one
lowers to (accepted by ptxas for sm_80 and sm_90a), their fragment
semantics against NumPy (on the CPU backend everywhere, on the GPU where
there is one), each misuse's CompileError, and the Ampere GEMM example
against float64 NumPy at tile multiples and odd sizes, every dtype."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.compiler
from mlirgpu import layout, thread_idx
from mlirgpu.language import mma as mma_module

from support.checks import PYTHON_DIR, assert_isolated

ml_dtypes = pytest.importorskip("ml_dtypes")

PTXAS = os.path.join(mlirgpu.compiler.CUDA_HOME, "bin", "ptxas")
CHIPS = ["sm_80", "sm_90a"]
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "tensorcore"))
import ampere_gemm  # noqa: E402

ATOMS = {"f16": mg.mma.M16N8K16_F16, "bf16": mg.mma.M16N8K16_BF16, "tf32": mg.mma.M16N8K8_TF32}
DTYPES = {"f16": mg.f16, "bf16": mg.bf16, "tf32": mg.f32}


def host(array, backend):
    """An argument for a launch on `backend`: NumPy on the CPU, a DeviceArray on the GPU."""
    return array if backend == "cpu" else mg.to_device(array)


def fetch(array):
    return array if isinstance(array, np.ndarray) else array.get()


def assert_ptxas(ptx, chip, tmp_path):
    path = tmp_path / f"{chip}.ptx"
    path.write_text(ptx)
    proc = subprocess.run([PTXAS, f"-arch={chip}", str(path), "-o", str(tmp_path / "out.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ==========================================================================
# Kernels, each one operation

KINDS = list(ATOMS)  # generics are positive ints: an atom by its position here, from 1
M_, K_, N_, IN, KIND = mg.generics("M_ K_ N_ IN KIND")


@mg.kernel(generics=(M_, K_, N_, IN, KIND))
def mma_kernel(A: mg.memref[M_, K_, IN], Bt: mg.memref[N_, K_, IN], C: mg.memref[M_, N_, mg.f32],
               D: mg.memref[M_, N_, mg.f32]):
    """D = A @ Bt.T + C by one mma.sync of atom KINDS[KIND - 1], each lane's
    fragments gathered element by element at the atom's coordinates."""
    AT = ATOMS[KINDS[KIND - 1]]
    a = mg.mma.fragment(AT, "a", [A[mg.mma.coordinate(AT, "a", v)] for v in mg.static_range(M_ * K_ // 32)])
    b = mg.mma.fragment(AT, "b", [Bt[mg.mma.coordinate(AT, "b", v)] for v in mg.static_range(N_ * K_ // 32)])
    c = mg.mma.fragment(AT, "c", [C[mg.mma.coordinate(AT, "c", v)] for v in mg.static_range(4)])
    d = mg.mma.sync(AT, a, b, c)
    for v in mg.static_range(4):
        D[mg.mma.coordinate(AT, "c", v)] = d[v]


def mma_operands(kind, seed=0):
    rng = np.random.default_rng(seed)
    atom = ATOMS[kind]
    m, n, k = atom.shape
    if kind == "tf32":
        # Multiples of 1/8 below 4: exact in tf32's 10-bit mantissa, so the
        # top-19-bit read changes nothing.
        A = (rng.integers(-32, 32, (m, k)) / 8).astype(np.float32)
        Bt = (rng.integers(-32, 32, (n, k)) / 8).astype(np.float32)
    else:
        np_type = np.float16 if kind == "f16" else ml_dtypes.bfloat16
        A = rng.uniform(-2, 2, (m, k)).astype(np_type)
        Bt = rng.uniform(-2, 2, (n, k)).astype(np_type)
    C = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    return A, Bt, C


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_sync_fragment_semantics(kind, backend):
    atom = ATOMS[kind]
    m, n, k = atom.shape
    A, Bt, C = mma_operands(kind)
    D = np.zeros((m, n), np.float32) if backend == "cpu" else mg.zeros((m, n), mg.f32)
    mma_kernel[m, k, n, DTYPES[kind], KINDS.index(kind) + 1](host(A, backend), host(Bt, backend), host(C, backend), D,
                                            grid=1, block=32)
    expected = A.astype(np.float64) @ Bt.astype(np.float64).T + C
    np.testing.assert_allclose(fetch(D), expected, rtol=1e-5, atol=1e-5)


def test_mma_sync_of_tf32_reads_the_top_19_bits_on_the_cpu():
    # A value with low mantissa bits set: the CPU backend drops them as the tensor core does.
    A = np.zeros((16, 8), np.float32)
    Bt = np.zeros((8, 8), np.float32)
    A[0, 0], Bt[0, 0] = 1.0 + 2.0 ** -20, 1.0
    D = np.zeros((16, 8), np.float32)
    with mg_backend("cpu"):
        mma_kernel[16, 8, 8, mg.f32, KINDS.index("tf32") + 1](A, Bt, np.zeros((16, 8), np.float32), D, grid=1, block=32)
    assert D[0, 0] == 1.0


def mg_backend(name):
    from support.backends import current_backend
    return current_backend(name)


COUNT, TRANS, BLOCK_ROWS, ORDER = mg.generics("COUNT TRANS BLOCK_ROWS ORDER")  # TRANS: 1 no, 2 .trans
ORDERS = ["column", "row"]  # ORDER: 1 column, 2 row


def block_of(j, block_rows, count, order):
    """The (row, column) block of ldmatrix's matrix j in `order`."""
    if order == "row":
        return j // (count // block_rows), j % (count // block_rows)
    return j % block_rows, j // block_rows


@mg.kernel(generics=(COUNT, TRANS, BLOCK_ROWS, ORDER))
def ldmatrix_kernel(S: mg.memref[256, mg.f16], out: mg.memref[32, 8, mg.f16]):
    """A 16x16 row-major tile in shared memory; lane l addresses row l % 8 of
    matrix l // 8, which sits at block (j % BLOCK_ROWS, j // BLOCK_ROWS) in
    column order, (j // columns, j % columns) in row order."""
    tile = mg.shared.array((256,), mg.f16)
    t = thread_idx.x
    for i in mg.static_range(8):
        tile[t * 8 + i] = S[t * 8 + i]
    mg.syncthreads()
    j = t // 8 % COUNT
    if ORDER == 2:
        row, col = t % 8 + j // (COUNT // BLOCK_ROWS) * 8, j % (COUNT // BLOCK_ROWS) * 8
    else:
        row, col = t % 8 + j % BLOCK_ROWS * 8, j // BLOCK_ROWS * 8
    frag = mg.mma.ldmatrix(tile, (row * 16 + col,), COUNT, transpose=TRANS == 2,
                           blocks=(BLOCK_ROWS, COUNT // BLOCK_ROWS), order=ORDERS[ORDER - 1])
    for v in mg.static_range(2 * COUNT):
        out[t, v] = frag[v]


@pytest.mark.parametrize("count,block_rows,order", [(1, 1, "column"), (2, 2, "column"), (2, 1, "column"),
                                                     (4, 2, "column"), (4, 2, "row")])
@pytest.mark.parametrize("transpose", [False, True])
def test_ldmatrix_fragment_semantics(count, block_rows, order, transpose, backend):
    S = np.arange(256).astype(np.float16)  # each element its index: exact in f16
    out = np.zeros((32, 8), np.float16) if backend == "cpu" else mg.zeros((32, 8), mg.f16)
    ldmatrix_kernel[count, int(transpose) + 1, block_rows, ORDERS.index(order) + 1](host(S, backend), out,
                                                                                    grid=1, block=32)
    got = fetch(out)
    tile = S.reshape(16, 16)
    for lane in range(32):
        for v in range(2 * count):
            j, p = v // 2, v % 2
            block_row, block_col = block_of(j, block_rows, count, order)
            block = tile[8 * block_row:][:8, 8 * block_col:][:, :8]
            r, c = lane // 4, 2 * (lane % 4) + p
            assert got[lane, v] == (block[c, r] if transpose else block[r, c]), (lane, v)


def test_ldmatrix_x4_is_the_a_fragment_and_its_halves_b_fragments():
    # The layouts that let mma.sync take ldmatrix's fragments unchanged.
    atom = mg.mma.M16N8K16_F16
    x4 = mma_module.fragment_type(
        tuple(tuple((8 * (j % 2) + lane // 4, 8 * (j // 2) + 2 * (lane % 4) + p) for j in range(4) for p in range(2))
              for lane in range(32)), mg.f16, "x4")
    assert x4.coordinates == mma_module._atom_fragment_type(atom, "a").coordinates
    b = mma_module._atom_fragment_type(atom, "b").coordinates
    assert x4([0] * 8).select(0, 1, 4, 5).coordinates == b
    assert x4([0] * 8).select(2, 3, 6, 7).coordinates == b


def test_ldmatrix_x4_in_row_order_holds_a_b_fragment_in_each_half():
    # Each B fragment in two consecutive registers of the ldmatrix, as mma.sync reads it.
    atom = mg.mma.M16N8K16_F16
    by_rows = mma_module.fragment_type(
        tuple(tuple((8 * (j // 2) + lane // 4, 8 * (j % 2) + 2 * (lane % 4) + p) for j in range(4) for p in range(2))
              for lane in range(32)), mg.f16, "x4 by rows")
    b = mma_module._atom_fragment_type(atom, "b").coordinates
    assert by_rows([0] * 8).select(0, 1, 2, 3).coordinates == b
    assert by_rows([0] * 8).select(4, 5, 6, 7).coordinates == b


NBYTES, VALID = mg.generics("NBYTES VALID")


@mg.kernel(generics=(NBYTES, VALID))
def cp_async_kernel(G: mg.memref[4, 64, mg.f16], out: mg.memref[32, 64, mg.f16]):
    """Each lane copies NBYTES of row lane % 4 into its own row of shared memory, then stores the row."""
    s = mg.shared.array((32 * 64,), mg.f16)
    t = thread_idx.x
    for i in mg.static_range(64):
        s[t * 64 + i] = mg.cast(-1.0, mg.f16)
    n = NBYTES // 2
    ok = (t % 2 == 0) if VALID == 1 else (t >= 0)  # VALID 1: even lanes only, 2: all
    mg.mma.cp_async(s, (t * 64 + (t % 4) * n,), G, (t % 4, (t % 4) * n), NBYTES, valid=ok)
    mg.mma.commit_group()
    mg.mma.wait_group(0)
    for i in mg.static_range(64):
        out[t, i] = s[t * 64 + i]


@pytest.mark.parametrize("nbytes", [4, 8, 16])
@pytest.mark.parametrize("valid", ["all", "even"])
def test_cp_async_copies_and_zero_fills(nbytes, valid, backend):
    G = (np.arange(256).reshape(4, 64) + 1).astype(np.float16)
    out = np.zeros((32, 64), np.float16) if backend == "cpu" else mg.zeros((32, 64), mg.f16)
    cp_async_kernel[nbytes, 1 + (valid == "all")](host(G, backend), out, grid=1, block=32)
    got = fetch(out)
    n = nbytes // 2
    for t in range(32):
        expected = np.full(64, -1.0, np.float16)
        start = (t % 4) * n
        expected[start:start + n] = G[t % 4, start:start + n] if valid == "all" or t % 2 == 0 else 0
        np.testing.assert_array_equal(got[t], expected)


B_TILE = layout.composition(ampere_gemm.swizzle_for(128), layout.row_major((32, 128)))  # the GEMM's 32 x 128 B tile


@mg.kernel
def swizzled_tile_kernel(out: mg.memref[32, 64, mg.i32]):
    t = thread_idx.x
    tile = mg.mma.tile(mg.shared.array((4096,), mg.i32), B_TILE)
    for c in mg.static_range(64):
        out[t, c] = mg.cast(tile.index(t, c * 2), mg.i32)  # traced row, Python column


def test_tile_index_emitted_matches_the_layout():
    out = np.zeros((32, 64), np.int32)
    with mg_backend("cpu"):
        swizzled_tile_kernel(out, grid=1, block=32)
    L = B_TILE
    expected = np.array([[L(t, 2 * c) for c in range(64)] for t in range(32)])
    np.testing.assert_array_equal(out, expected)
    # A swizzle permutes: every index of the 32 x 128 tile exactly once.
    assert sorted(L(r, c) for r in range(32) for c in range(128)) == list(range(32 * 128))


def test_layout_index_of_python_ints_is_a_python_int():
    L = layout.composition(layout.Swizzle(2, 3, 3), layout.row_major((128, 32)))
    assert mg.mma.layout_index(L, 3, 9) == L(3, 9)


@pytest.mark.parametrize("rows,width", [(128, 32), (32, 64), (64, 64), (32, 128), (32, 256), (64, 256)])
def test_the_gemm_s_swizzles_have_no_bank_conflicts(rows, width):
    # Shared memory serves 16-byte accesses 8 lanes at a time; bank group = 16-byte chunk of a 128-byte line.
    L = layout.composition(ampere_gemm.swizzle_for(width), layout.row_major((rows, width)))
    assert sorted(L(r, c) for r in range(rows) for c in range(width)) == list(range(rows * width))
    group = lambda index: index * 2 // 16 % 8  # noqa: E731
    for first in range(0, rows - 7, 8):  # ldmatrix: 8 consecutive rows at one 16-byte column
        for c in range(0, width, 8):
            assert len({group(L(first + r, c)) for r in range(8)}) == 8, (first, c)
    chunks = rows * width // 8  # cp.async: 8 lanes store 8 consecutive chunks of the row-major tile
    for first in range(0, chunks, 8):
        where = [divmod((first + j) * 8, width) for j in range(8)]
        assert len({group(L(r, c)) for r, c in where}) == 8, first


TILE16 = layout.composition(layout.Swizzle(1, 3, 3), layout.row_major((16, 16)))


@mg.kernel
def dynamic_tile_kernel(G: mg.memref[16, 16, mg.f16], out: mg.memref[32, 8, mg.f16]):
    """A 16 x 16 tile of G into dynamic shared memory (a swizzled tile, 32
    bytes into it) by cp.async, then read back by ldmatrix .x4."""
    t = thread_idx.x
    tile = mg.mma.tile(mg.shared.dynamic(mg.f16), TILE16).at(16)
    mg.mma.cp_async(tile, (t // 2, t % 2 * 8), G, (t // 2, t % 2 * 8), 16)
    mg.mma.commit_group()
    mg.mma.wait_group(0)
    mg.syncthreads()
    frag = mg.mma.ldmatrix(tile, (t % 8 + t // 8 % 2 * 8, t // 16 * 8), 4)
    for v in mg.static_range(8):
        out[t, v] = frag[v]


def test_tile_ldmatrix_and_cp_async_on_dynamic_shared_memory(backend):
    G = np.arange(256).reshape(16, 16).astype(np.float16)
    out = np.zeros((32, 8), np.float16) if backend == "cpu" else mg.zeros((32, 8), mg.f16)
    dynamic_tile_kernel(host(G, backend), out, grid=1, block=32, shared_mem=(16 + 256) * 2)
    got = fetch(out)
    for lane in range(32):  # the A fragment of m16n8k16: matrix j at block (j % 2, j // 2)
        for v in range(8):
            j, p = v // 2, v % 2
            assert got[lane, v] == G[8 * (j % 2) + lane // 4, 8 * (j // 2) + 2 * (lane % 4) + p], (lane, v)


# ==========================================================================
# The PTX of each operation, and ptxas

def ptx_of(kernel, generic_values, chip):
    return kernel[generic_values].ptx(chip=chip)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("kind,instruction", [
    ("f16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    ("bf16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    ("tf32", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
])
def test_mma_sync_ptx(kind, instruction, chip, tmp_path):
    atom = ATOMS[kind]
    m, n, k = atom.shape
    ptx = ptx_of(mma_kernel, (m, k, n, DTYPES[kind], KINDS.index(kind) + 1), chip)
    assert len(re.findall(re.escape(instruction), ptx)) == 1
    assert_ptxas(ptx, chip, tmp_path)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("count,transpose", [(1, False), (2, True), (4, False), (4, True)])
def test_ldmatrix_ptx(count, transpose, chip, tmp_path):
    ptx = ptx_of(ldmatrix_kernel, (count, int(transpose) + 1, 1 if count == 1 else 2, 1), chip)
    trans = ".trans" if transpose else ""
    assert re.search(rf"ldmatrix\.sync\.aligned\.m8n8\.x{count}{re.escape(trans)}\.shared\.b16 ", ptx)
    assert_ptxas(ptx, chip, tmp_path)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("nbytes,modifier", [(4, "ca"), (8, "ca"), (16, "cg")])
def test_cp_async_ptx(nbytes, modifier, chip, tmp_path):
    ptx = ptx_of(cp_async_kernel, (nbytes, 1), chip)
    # The source size operand (%r) is the zero-fill of lanes whose copy is not valid.
    assert re.search(rf"cp\.async\.{modifier}\.shared\.global \[%rd\d+\], \[%rd\d+\], {nbytes}, %r\d+;", ptx)
    assert "cp.async.commit_group;" in ptx
    assert re.search(r"cp\.async\.wait_group\s+0;", ptx)
    assert_ptxas(ptx, chip, tmp_path)


CONFIG_IDS = [c.name for c in ampere_gemm.CONFIGS]


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("config", ampere_gemm.CONFIGS, ids=CONFIG_IDS)
def test_ampere_gemm_ptx(config, chip, tmp_path):
    ptx = ampere_gemm.kernel_for(config)[512, 512, 512, mg.bf16, mg.f32].ptx(chip=chip)
    slices, a_tiles, b_tiles = config.bk // 16, config.wm // 16, config.wn // 16
    copies = (config.bm + config.bn) * config.bk // 8 // config.threads  # 16-byte chunks a thread copies a step
    # The loop's body once: each slice's mmas; ldmatrix for each slice and the prologue's first slice;
    # the copies of the loop and of the prologue's STAGES - 1 steps.
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == slices * a_tiles * 2 * b_tiles
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)) == (slices + 1) * a_tiles
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", ptx)) == (slices + 1) * b_tiles
    assert ptx.count("cp.async.cg.shared.global") == config.stages * copies
    assert ".extern .shared" in ptx and "__mg_dynamic_shared" in ptx
    path = tmp_path / f"{chip}.ptx"
    path.write_text(ptx)
    proc = subprocess.run([PTXAS, f"-arch={chip}", "-v", str(path), "-o", str(tmp_path / "out.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # Registers fit: no spills to local memory (the accumulators alone are 128 registers a thread).
    assert "0 bytes spill stores, 0 bytes spill loads" in proc.stderr, proc.stderr


# ==========================================================================
# Misuse

def compile_error(kernel, generic_values=None, chip="sm_80"):
    spec = kernel[generic_values] if generic_values is not None else kernel.specialize({})
    with pytest.raises(mg.CompileError) as info:
        spec.ptx(chip=chip)
    return info.value


def lineno_of(function, text):
    import inspect
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def assert_at_line(error, function, text):
    assert f":{lineno_of(function, text)}:" in str(error), str(error)


@mg.kernel
def wrong_layout(S: mg.memref[256, mg.f16], out: mg.memref[32, mg.f32]):
    s = mg.shared.array((256,), mg.f16)
    t = thread_idx.x
    a = mg.mma.ldmatrix(s, (t * 8,), 4)
    b = mg.mma.ldmatrix(s, (t * 8,), 2)  # matrices stacked (2, 1): not B's (1, 2)
    d = mg.mma.sync(mg.mma.M16N8K16_F16, a, b, mg.mma.zeros(mg.mma.M16N8K16_F16))
    out[t] = d[0]


def test_layout_that_does_not_match_the_atom():
    error = compile_error(wrong_layout)
    assert "does not match the B fragment" in str(error) and "ldmatrix .x2" in str(error)
    assert_at_line(error, wrong_layout.function, "d = mg.mma.sync")


@mg.kernel
def wrong_select(out: mg.memref[32, mg.f32]):
    s = mg.shared.array((256,), mg.f16)
    t = thread_idx.x
    pair = mg.mma.ldmatrix(s, (t * 8,), 4, transpose=True)
    a = mg.mma.ldmatrix(s, (t * 8,), 4)
    d = mg.mma.sync(mg.mma.M16N8K16_F16, a, pair.select(0, 1, 2, 3), mg.mma.zeros(mg.mma.M16N8K16_F16))
    out[t] = d[0]


def test_the_error_names_the_atoms_fragment_whatever_was_traced_before():
    """Fragments of one layout share a class, made by whichever traced one
    first: here an ldmatrix fragment with B's layout (in wrong_dtype, f16)
    comes before any mma.sync of f16, in a fresh interpreter."""
    assert_isolated("""
        from test_tensorcore_ampere import compile_error, wrong_dtype, wrong_layout
        compile_error(wrong_dtype)
        print(compile_error(wrong_layout))
        """, "which does not match the B fragment of mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32:")


def test_selected_values_that_are_not_a_b_fragment():
    assert "does not match the B fragment" in str(compile_error(wrong_select))


@mg.kernel
def wrong_dtype(out: mg.memref[32, mg.f32]):
    s = mg.shared.array((256,), mg.f16)
    t = thread_idx.x
    a = mg.mma.ldmatrix(s, (t * 8,), 4)
    b = mg.mma.ldmatrix(s, (t * 8,), 2, blocks=(1, 2))
    d = mg.mma.sync(mg.mma.M16N8K16_BF16, a, b, mg.mma.zeros(mg.mma.M16N8K16_BF16))
    out[t] = d[0]


def test_wrong_dtype():
    error = compile_error(wrong_dtype)
    assert "takes bf16 values, not f16" in str(error)
    assert_at_line(error, wrong_dtype.function, "d = mg.mma.sync")


@mg.kernel
def wrong_length(out: mg.memref[32, mg.f32]):
    x = mg.cast(1.0, mg.f16)
    d = mg.mma.sync(mg.mma.M16N8K16_F16, [x] * 8, [x] * 3, mg.mma.zeros(mg.mma.M16N8K16_F16))
    out[thread_idx.x] = d[0]


def test_wrong_shape():
    assert "holds 4 values a lane, got 3" in str(compile_error(wrong_length))


@mg.kernel
def ldmatrix_of_f32(out: mg.memref[32, mg.f32]):
    s = mg.shared.array((256,), mg.f32)
    v = mg.mma.ldmatrix(s, (thread_idx.x * 8,), 4)
    out[thread_idx.x] = mg.cast(v[0], mg.f32)


@mg.kernel
def ldmatrix_of_global(G: mg.memref[256, mg.f16], out: mg.memref[32, mg.f16]):
    v = mg.mma.ldmatrix(G, (thread_idx.x * 8,), 4)
    out[thread_idx.x] = v[0]


@mg.kernel
def ldmatrix_x3(out: mg.memref[32, mg.f16]):
    s = mg.shared.array((256,), mg.f16)
    v = mg.mma.ldmatrix(s, (thread_idx.x * 8,), 3)
    out[thread_idx.x] = v[0]


@mg.kernel
def ldmatrix_in_diagonal_order(out: mg.memref[32, mg.f16]):
    s = mg.shared.array((256,), mg.f16)
    v = mg.mma.ldmatrix(s, (thread_idx.x * 8,), 4, order="diagonal")
    out[thread_idx.x] = v[0]


@mg.kernel
def cp_async_12_bytes(G: mg.memref[64, mg.f16]):
    s = mg.shared.array((64,), mg.f16)
    mg.mma.cp_async(s, (0,), G, (0,), 12)


@mg.kernel
def cp_async_to_global(G: mg.memref[64, mg.f16], H: mg.memref[64, mg.f16]):
    mg.mma.cp_async(H, (0,), G, (0,), 16)


@mg.kernel
def cp_async_mixed_dtypes(G: mg.memref[64, mg.f32]):
    s = mg.shared.array((64,), mg.f16)
    mg.mma.cp_async(s, (0,), G, (0,), 16)


@pytest.mark.parametrize("kernel,message", [
    (ldmatrix_of_f32, "ldmatrix loads 16-bit elements (f16, bf16), not f32"),
    (ldmatrix_of_global, "ldmatrix reads shared memory"),
    (ldmatrix_x3, "ldmatrix loads 1, 2 or 4 matrices, not 3"),
    (ldmatrix_in_diagonal_order, "ldmatrix's order is \"column\" or \"row\", not 'diagonal'"),
    (cp_async_12_bytes, "cp.async copies 4, 8 or 16 bytes, not 12"),
    (cp_async_to_global, "cp.async's destination is shared memory"),
    (cp_async_mixed_dtypes, "cp.async copies between arrays of one dtype"),
])
def test_misuse(kernel, message):
    error = compile_error(kernel)
    assert message in str(error)
    assert_at_line(error, kernel.function, "mg.mma.")


def test_sm75_has_no_m16n8k16():
    error = compile_error(mma_kernel, (16, 16, 8, mg.bf16, KINDS.index("bf16") + 1), chip="sm_75")
    assert "nvvm.mma.sync (mg.mma) needs sm_80 or later; this kernel is compiled for sm_75" in str(error)
    assert_at_line(error, mma_kernel.function, "d = mg.mma.sync")


def test_sm75_has_no_cp_async():
    error = compile_error(cp_async_kernel, (16, 2), chip="sm_75")
    assert "nvgpu.device_async_copy (mg.mma) needs sm_80 or later" in str(error)
    assert_at_line(error, cp_async_kernel.function, "mg.mma.cp_async(")


def test_sm75_has_no_ldmatrix():
    error = compile_error(ldmatrix_kernel, (4, 1, 2, 1), chip="sm_75")
    assert "nvgpu.ldmatrix (mg.mma) needs sm_80 or later" in str(error)
    assert_at_line(error, ldmatrix_kernel.function, "frag = mg.mma.ldmatrix(")


@mg.kernel
def half_warp_mma(D: mg.memref[32, mg.f32]):
    d = mg.mma.sync(mg.mma.M16N8K8_TF32, [1.0] * 4, [1.0] * 2, mg.mma.zeros(mg.mma.M16N8K8_TF32))
    D[thread_idx.x] = d[0]


def test_mma_sync_needs_the_whole_warp_on_the_cpu():
    with mg_backend("cpu"), pytest.raises(mg.KernelError, match="needs all 32 lanes of its warp"):
        half_warp_mma(np.zeros(32, np.float32), grid=1, block=16)


# ==========================================================================
# The Ampere GEMM example

def gemm_case(m, k, n, dtype, out_dtype, backend, config=None, seed=0):
    A, B = ampere_gemm.operands(m, k, n, dtype, seed)
    C = np.zeros((m, n), out_dtype.numpy) if backend == "cpu" else mg.zeros((m, n), out_dtype)
    ampere_gemm.launch(host(A, backend), host(B, backend), C, config)
    got, expected = fetch(C), ampere_gemm.reference(A, B)
    assert ampere_gemm.within_tolerance(got, expected, k, out_dtype), \
        np.abs(got.astype(np.float64) - expected).max()


@pytest.mark.parametrize("dtype", [mg.f16, mg.bf16])
@pytest.mark.parametrize("out_dtype", [mg.f32, mg.f16, mg.bf16])
def test_ampere_gemm_on_the_cpu(dtype, out_dtype):
    with mg_backend("cpu"):
        gemm_case(130, 72, 136, dtype, out_dtype, "cpu")   # edges in M and N, aligned rows (cp.async)


@pytest.mark.parametrize("m,k,n", [(128, 64, 128), (1, 1, 1), (33, 67, 17), (129, 40, 7), (1100, 24, 136)])
def test_ampere_gemm_sizes_on_the_cpu(m, k, n):
    # Tile multiples, a 1x1x1 product, odd K and N (rows not 16-byte aligned: the loads without cp.async),
    # more tile rows than a group of blocks takes.
    with mg_backend("cpu"):
        gemm_case(m, k, n, mg.bf16, mg.f32, "cpu")


OUTS = [mg.f32, mg.f16, mg.bf16]


@pytest.mark.parametrize("i", range(len(ampere_gemm.CONFIGS)), ids=CONFIG_IDS)
@pytest.mark.parametrize("dtype", [mg.f16, mg.bf16])
def test_ampere_gemm_configs_on_the_cpu(i, dtype):
    # Edges in M and N, K not a multiple of 8 (A's rows without cp.async) and fewer steps than the
    # pipeline's prologue copies for most configs. Each config with both input types, the output
    # types taking turns (all of them for each input type over the configs).
    out_dtype = OUTS[(i + (dtype == mg.bf16)) % 3]
    with mg_backend("cpu"):
        gemm_case(130, 70, 200, dtype, out_dtype, "cpu", ampere_gemm.CONFIGS[i])


@pytest.mark.parametrize("config", ampere_gemm.CONFIGS, ids=CONFIG_IDS)
def test_ampere_gemm_configs_at_tile_multiples_on_the_cpu(config):
    # Whole tiles and more steps along K than stages: the ring of stages goes round twice.
    with mg_backend("cpu"):
        gemm_case(config.bm, config.bk * (2 * config.stages + 1), config.bn, mg.bf16, mg.f32, "cpu", config)


def test_config_rejects_tiles_that_do_not_fit():
    with pytest.raises(ValueError, match="warps tile the block"):
        ampere_gemm.Config(128, 256, 32, 48, 64, 4)
    with pytest.raises(ValueError, match="BK is 32 or 64"):
        ampere_gemm.Config(128, 256, 16, 64, 64, 4)
    with pytest.raises(ValueError, match="at least 2 stages"):
        ampere_gemm.Config(128, 256, 32, 64, 64, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mg.f16, mg.bf16])
@pytest.mark.parametrize("out_dtype", [mg.f32, mg.f16, mg.bf16])
@pytest.mark.parametrize("m,k,n", [(256, 256, 256), (1024, 512, 768), (1, 1, 1), (130, 72, 136), (257, 67, 131),
                                   (1000, 999, 1001)])
def test_ampere_gemm_on_the_gpu(m, k, n, dtype, out_dtype):
    with mg_backend("cuda"):
        gemm_case(m, k, n, dtype, out_dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("config", ampere_gemm.CONFIGS[1:], ids=CONFIG_IDS[1:])
@pytest.mark.parametrize("dtype,out_dtype", [(mg.f16, mg.f16), (mg.bf16, mg.f32)])
@pytest.mark.parametrize("m,k,n", [(1024, 1024, 1024), (130, 70, 200), (1000, 999, 1001)])
def test_ampere_gemm_configs_on_the_gpu(config, m, k, n, dtype, out_dtype):
    with mg_backend("cuda"):
        gemm_case(m, k, n, dtype, out_dtype, "cuda", config)


# ==========================================================================
# The benchmark script's parts that need no GPU

def run_benchmark(*args):
    env = dict(os.environ, MLIRGPU_BACKEND="cpu")
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gemm_tensorcore.py"), *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_benchmark_help():
    done = run_benchmark("--help")
    assert done.returncode == 0, done.stderr
    assert "% of cuBLAS" in done.stdout and "--check" in done.stdout
    assert "{bf16,f16,fp8}" in done.stdout and "torch._scaled_mm" in done.stdout


def test_benchmark_check_runs_every_kernel_on_the_cpu():
    done = run_benchmark("--check", "--sizes", "130x72x136", "--dtypes", "bf16")
    assert done.returncode == 0, done.stdout + done.stderr
    for config in ampere_gemm.CONFIGS:  # a row each, timed (its result was checked)
        assert re.search(rf"\| bf16 \| 130x72x136 \| mma\.sync {re.escape(config.name)} "
                         rf"\(examples/tensorcore/ampere_gemm\.py\) \| [\d.]+ \|", done.stdout), done.stdout
    assert re.search(r"best mma\.sync at bf16 130x72x136: mma\.sync .*, [\d.]+ TFLOP/s, - of cuBLAS", done.stdout)


def test_benchmark_kernels_filter_keeps_the_named_rows():
    done = run_benchmark("--check", "--sizes", "64x32x64", "--dtypes", "f16", "--kernels", "mma.sync 128x128x32")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\| f16 \| 64x32x64 \| (.*?) \|", done.stdout, re.MULTILINE)
    assert rows == [f"mma.sync {c.name} (examples/tensorcore/ampere_gemm.py)" for c in ampere_gemm.CONFIGS
                    if c.name.startswith("128x128x32")], done.stdout


def test_benchmark_without_a_gpu_refuses_to_time():
    done = run_benchmark("--no-write")
    assert done.returncode != 0 and "there is none here" in done.stderr


def test_the_guide_s_first_example_runs(tmp_path):
    # docs/tensor_cores.md's first code block is a whole program (kernels need a source file).
    text = (ROOT / "docs" / "tensor_cores.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    path = tmp_path / "first_product.py"
    path.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (PYTHON_DIR, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


@mg.kernel
def shuffle_beside_mma(D: mg.memref[32, mg.f32]):
    t = thread_idx.x
    if t < 16:
        D[t] = mg.warp.shfl_xor(mg.cast(1.0, mg.f32), 1)
    else:
        d = mg.mma.sync(mg.mma.M16N8K8_TF32, [1.0] * 4, [1.0] * 2, mg.mma.zeros(mg.mma.M16N8K8_TF32))
        D[t] = d[0]


def test_mma_sync_beside_a_shuffle_is_warp_divergence_on_the_cpu():
    with mg_backend("cpu"), pytest.raises(mg.KernelError, match="lane 0 is at another warp operation"):
        shuffle_beside_mma(np.zeros(32, np.float32), grid=1, block=32)
    # The runtime is left clean for the next launch.
    D = np.zeros((16, 8), np.float32)
    A, Bt, C = mma_operands("tf32")
    with mg_backend("cpu"):
        mma_kernel[16, 8, 8, mg.f32, KINDS.index("tf32") + 1](A, Bt, C, D, grid=1, block=32)
    np.testing.assert_allclose(D, A.astype(np.float64) @ Bt.astype(np.float64).T + C, rtol=1e-5, atol=1e-5)
