"""The SGEMM series (examples/sgemm/): every kernel of common.KERNELS
computes C = alpha * A @ B + beta * C as NumPy does in float64, on the CPU
backend at small sizes (odd ones where the kernel guards its edges, the
smallest grids of more than one block in each direction where it takes
multiples of its tiles only) and on the GPU at 1024^3 and 4096^3; a kernel
that takes multiples only rejects other sizes with a LaunchError naming
them; and its PTX for sm_90a shows what the series is about: shared memory
from kernel 3 on, 128-bit global loads from kernel 6 on. Kernel 10 splits K
where its tiles are too few to fill the GPU: that split, launched twice in
a row, matches NumPy too, with beta = 0 and without."""
import functools
import os
import re
import sys

import numpy as np
import pytest
from support.backends import cuda_only

import mlirgpu as mg

sys.path.insert(0, os.path.abspath(os.path.join(__file__, os.pardir, os.pardir, os.pardir, "examples", "sgemm")))
import common  # noqa: E402

cpu_only = pytest.mark.parametrize("backend", ["cpu"], indirect=True)

ALPHA, BETA = 1.5, -0.5
ODD_SIZE = (67, 45, 91)  # M, K, N: partial tiles at every edge, whatever power-of-two tile
CHIP = "sm_90a"


def number(name):
    """The kernel's number in the worklog: "k06_vectorized" -> 6."""
    return int(re.match(r"k(\d+)_", name).group(1))


def cpu_size(module):
    """Odd sizes for a kernel that guards its edges; else twice its multiples:
    where those are its block tile, a grid of 2 x 2 blocks and two steps along K."""
    if tuple(module.MULTIPLE) == (1, 1, 1):
        return ODD_SIZE
    return tuple(2 * multiple for multiple in module.MULTIPLE)


@functools.lru_cache(maxsize=None)
def problem(M, K, N):
    """Operands (C random: beta reads it) and the float64 result, made once per size."""
    A, B, C = common.operands(M, K, N)
    return A, B, C, common.reference(A, B, C, ALPHA, BETA)


def check_kernel(module, M, K, N):
    A, B, C, expected = problem(M, K, N)
    dA, dB, dC = mg.to_device(A), mg.to_device(B), mg.to_device(C)
    module.launch(dA, dB, dC, ALPHA, BETA)
    error = common.relative_error(dC.get(), expected)
    assert error < 1e-5, f"{module.TITLE} at {M}x{K}x{N} on {mg.backend()}: relative error {error:.1e}"


@cpu_only
@pytest.mark.parametrize("name", common.KERNELS)
def test_kernel_matches_numpy_on_cpu(backend, name):
    module = common.load(name)
    check_kernel(module, *cpu_size(module))


@cuda_only
@pytest.mark.parametrize("n", [1024, 4096])
@pytest.mark.parametrize("name", common.KERNELS)
def test_kernel_matches_numpy_on_gpu(backend, name, n):
    check_kernel(common.load(name), n, n, n)


@cpu_only
@pytest.mark.parametrize("name", common.KERNELS)
def test_sizes_off_the_multiple_raise(backend, name):
    module = common.load(name)
    if tuple(module.MULTIPLE) == (1, 1, 1):
        pytest.skip(f"{module.TITLE} takes any size")
    for axis, multiple in enumerate(module.MULTIPLE):
        if multiple == 1:
            continue
        sizes = [2 * m for m in module.MULTIPLE]
        sizes[axis] += 1
        M, K, N = sizes
        A, B, C = common.operands(M, K, N)
        with pytest.raises(mg.LaunchError) as raised:
            module.launch(mg.to_device(A), mg.to_device(B), mg.to_device(C), ALPHA, BETA)
        numbers = re.findall(r"\d+", str(raised.value))
        assert all(str(m) in numbers for m in module.MULTIPLE), \
            f"the LaunchError for {M}x{K}x{N} does not name the multiples {module.MULTIPLE}: {raised.value}"


# Kernel 10 splits K where its tiles are too few to fill the GPU. On the CPU backend, which plans for 4
# multiprocessors of two blocks each, 256 x 256 is 2 x 2 tiles: split in 2 by default, and K = 1024 gives
# 64 steps of BK, enough for 3 and 4 slices (uneven and even) of at least 8 steps.
SPLIT_SIZE = (256, 1024, 256)


def check_split(module, M, K, N, split, beta):
    """Two launches in a row, on one workspace, with other operands each time: a tile counter left
    nonzero by the first would have the second launch complete its tiles wrongly, or not at all. With
    beta = 0, C starts as NaNs, which would spread into the result if C were read."""
    for seed in (0, 1):
        A, B, C = common.operands(M, K, N, seed)
        expected = common.reference(A, B, C, ALPHA, beta)
        if beta == 0:
            C = np.full_like(C, np.nan)
        dC = mg.to_device(C)
        module.launch(mg.to_device(A), mg.to_device(B), dC, ALPHA, beta, split=split)
        error = common.relative_error(dC.get(), expected)
        assert error < 1e-5, (f"{module.TITLE} at {M}x{K}x{N}, split={split}, beta={beta}, launch {seed + 1}: "
                              f"relative error {error:.1e}")


@cpu_only
@pytest.mark.parametrize("beta", [0.0, BETA])
@pytest.mark.parametrize("split", [None, 3, 4])
def test_warptiling_split_k_matches_numpy_on_cpu(backend, split, beta):
    module = common.load("k10_warptiling")
    assert module.split_for(*SPLIT_SIZE) == 2, "the CPU backend's 4 multiprocessors no longer split this size"
    check_split(module, *SPLIT_SIZE, split, beta)


@cuda_only
@pytest.mark.parametrize("beta", [0.0, BETA])
def test_warptiling_split_k_matches_numpy_on_gpu(backend, beta):
    # 1024^3 is 64 tiles: split in 4 on a GPU of 132 multiprocessors.
    check_split(common.load("k10_warptiling"), 1024, 1024, 1024, 4, beta)


def test_warptiling_splits_where_the_tiles_do_not_fill_the_gpu(monkeypatch):
    # On 132 multiprocessors of two blocks each (a wave of 264 blocks): 1024^3's 64 tiles split in 4, 256
    # blocks; 2048^3's 256 tiles and 4096^3's 1024 fill more than half the wave, and are not split. Where K
    # is short, each slice keeps 8 steps of BK (K = 256: 16 steps, 2 slices).
    module = common.load("k10_warptiling")
    monkeypatch.setattr(module, "multiprocessors", lambda: 132)
    assert [module.split_for(n, n, n) for n in (1024, 2048, 4096)] == [4, 1, 1]
    assert module.split_for(1024, 256, 1024) == 2
    for split in (0, 1024 // 16 + 1):
        with pytest.raises(mg.LaunchError, match=f"split={split}"):
            module.split_for(1024, 1024, 1024, split)


@cpu_only
def test_warptiling_keeps_the_launches_of_the_last_sizes_only(backend):
    # Each size's launch keeps a workspace: a sweep over sizes keeps the most recent LAUNCHES_KEPT.
    module = common.load("k10_warptiling")
    module._LAUNCHES.clear()
    sizes = [(128, 16 * s, 128) for s in range(1, module.LAUNCHES_KEPT + 3)]
    for M, K, N in sizes:
        A, B, C = common.operands(M, K, N)
        module.launch(mg.to_device(A), mg.to_device(B), mg.to_device(C))
    kept = {key[3:6] for key in module._LAUNCHES}
    assert kept == set(sizes[-module.LAUNCHES_KEPT:])


def ptx_of(name):
    module = common.load(name)
    size = 1024  # a multiple of every kernel's tiles
    return common.specialization(module, size, size, size).ptx(chip=CHIP)


@pytest.mark.parametrize("name", common.KERNELS)
def test_specialize_is_the_launched_kernel(name):
    # The PTX checked below is that of module.kernel (kernel 9: its first config) at those sizes.
    module = common.load(name)
    M, K, N = cpu_size(module)
    spec = common.specialization(module, M, K, N)
    tuner = module.kernel if isinstance(module.kernel, mg.Autotuner) else None
    assert spec.kernel is (tuner.kernel if tuner else module.kernel)
    if tuner:
        assert {g: spec.values[g] for g in tuner.configs[0]} == tuner.configs[0]
    ir = spec.ir()
    for shape in (f"memref<{M}x{K}xf32>", f"memref<{K}x{N}xf32>", f"memref<{M}x{N}xf32>"):
        assert shape in ir, f"{name}.specialize({M}, {K}, {N}) has no {shape} parameter"


SHARED_DECLARATION = re.compile(r"^\s*(\.extern\s+)?\.shared\s", re.MULTILINE)
GLOBAL_LOAD_128 = re.compile(r"\bld\.global(\.[\w:]+)*\.v4\.[bfsu]32\b")


@pytest.mark.parametrize("name", common.KERNELS)
def test_ptx_shared_memory_from_kernel_3(name):
    ptx = ptx_of(name)
    uses = {"declaration": SHARED_DECLARATION.search(ptx), "ld.shared": re.search(r"\bld\.shared\b", ptx),
            "st.shared": re.search(r"\bst\.shared\b", ptx)}
    if number(name) >= 3:
        assert all(uses.values()), f"{name}: no shared memory {[k for k, v in uses.items() if not v]} in its PTX"
    else:
        assert not any(uses.values()), f"{name}: shared memory in its PTX"


@pytest.mark.parametrize("name", [name for name in common.KERNELS if number(name) >= 6])
def test_ptx_128_bit_global_loads_from_kernel_6(name):
    assert GLOBAL_LOAD_128.search(ptx_of(name)), f"{name}: no ld.global.v4 (128-bit load) in its PTX for {CHIP}"


def test_kernels_are_numbered_in_order():
    assert [number(name) for name in common.KERNELS] == list(range(1, len(common.KERNELS) + 1))
