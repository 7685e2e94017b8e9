"""Hopper (sm_90a) from the kernel language, without a GPU: TMA, mbarriers,
wgmma, setmaxnreg and clusters lower to their PTX instructions and ptxas
accepts them; tensor-map arguments and wgmma descriptors are computed from
layouts (checked against values worked out by hand); each misuse is a
CompileError at the user's line; tensor maps and cluster launches reach the
driver (the fake one of tests/support/fake_cuda)."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.compiler
from support.checks import assert_isolated, toolkit_without_ptxas
from mlirgpu import ir
from mlirgpu.layout import Layout, Swizzle, wgmma as wgmma_layout
from mlirgpu.layout.core import ComposedLayout
from mlirgpu.runtime.tensormap import box_layout, encode_arguments

PTXAS = os.path.join(mlirgpu.compiler.CUDA_HOME, "bin", "ptxas")
EXAMPLES = os.path.abspath(os.path.join(__file__, os.pardir, os.pardir, os.pardir, "examples", "tensorcore"))

A_TILE = wgmma_layout.tile_layout((64, 64), 2, "128B")
B_TILE = wgmma_layout.tile_layout((128, 64), 2, "128B")


def assemble(ptx, tmp_path):
    """ptxas -arch=sm_90a must accept the PTX."""
    if not os.path.exists(PTXAS):
        pytest.skip(f"no ptxas at {PTXAS}")
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    result = subprocess.run([PTXAS, "-arch=sm_90a", "-v", str(source), "-o", str(tmp_path / "kernel.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stderr


def line_of(function, text):
    """The line number of the first source line of `function` containing `text`."""
    import inspect
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# --------------------------------------------------------------------------
# The pipeline's order: nvgpu is converted before kernels are outlined
# --------------------------------------------------------------------------

TMA_PROGRAM = """
!barrier = !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>>
!tile = memref<64x64xf16, #gpu.address_space<workgroup>>
!map = !nvgpu.tensormap.descriptor<tensor = !tile, swizzle = swizzle_128b, l2promo = none, oob = zero,
                                   interleave = none>
module attributes {gpu.container_module} {
  memref.global "private" @tile : !tile
  func.func @load_tile(%d: memref<64x64xf16>) {
    %c1 = arith.constant 1 : index
    %c64 = arith.constant 64 : index
    %c128 = arith.constant 128 : index
    %cast = memref.cast %d : memref<64x64xf16> to memref<*xf16>
    %desc = nvgpu.tma.create.descriptor %cast box[%c64, %c64] : memref<*xf16> -> !map
    gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
               threads(%tx, %ty, %tz) in (%a = %c128, %b = %c1, %c = %c1) {
      %c0 = arith.constant 0 : index
      %bytes = arith.constant 8192 : index
      %bar = nvgpu.mbarrier.create -> !barrier
      nvgpu.mbarrier.init %bar[%c0], %c1 : !barrier
      %smem = memref.get_global @tile : !tile
      nvgpu.tma.async.load %desc[%c0, %c0], %bar[%c0] to %smem : !map, !barrier -> !tile
      nvgpu.mbarrier.arrive.expect_tx %bar[%c0], %bytes : !barrier
      %phase = arith.constant false
      %ticks = arith.constant 10000000 : index
      nvgpu.mbarrier.try_wait.parity %bar[%c0], %phase, %ticks : !barrier
      gpu.terminator
    }
    return
  }
}
"""


def test_tma_program_with_a_captured_descriptor_compiles(ctx, tmp_path):
    # Outlining first would make the descriptor a gpu.func parameter of nvgpu
    # type, which nothing legalizes ("failed to legalize operation 'gpu.func'").
    compilation = mg.Compilation(ir.Module.parse(TMA_PROGRAM), "sm_90a")
    ptx = compilation.ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity.shared.b64" in ptx
    assert "!nvgpu" not in compilation.outlined
    assemble(ptx, tmp_path)


# The same load as a whole host program: the argument copied to the device
# first, the tile in dynamic shared memory (a host-level memref.global of
# workgroup memory has no host lowering); the host half of the descriptor is
# a call of the runtime's mgpuTensorMapEncodeTiledMemref.
HOST_TMA_PROGRAM = """
!barrier = !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>>
!tile = memref<64x64xf16, #gpu.address_space<workgroup>>
!map = !nvgpu.tensormap.descriptor<tensor = !tile, swizzle = swizzle_128b, l2promo = none, oob = zero,
                                   interleave = none>
module attributes {gpu.container_module} {
  func.func @load_tile(%d: memref<64x64xf16>) {
    %c1 = arith.constant 1 : index
    %c64 = arith.constant 64 : index
    %c128 = arith.constant 128 : index
    %bytes = arith.constant 8192 : i32
    %t0 = gpu.wait async
    %dd, %t1 = gpu.alloc async [%t0] () : memref<64x64xf16>
    %t2 = gpu.memcpy async [%t1] %dd, %d : memref<64x64xf16>, memref<64x64xf16>
    gpu.wait [%t2]
    %cast = memref.cast %dd : memref<64x64xf16> to memref<*xf16>
    %desc = nvgpu.tma.create.descriptor %cast box[%c64, %c64] : memref<*xf16> -> !map
    gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
               threads(%tx, %ty, %tz) in (%a = %c128, %b = %c1, %c = %c1) dynamic_shared_memory_size %bytes {
      %c0 = arith.constant 0 : index
      %expect = arith.constant 8192 : index
      %bar = nvgpu.mbarrier.create -> !barrier
      nvgpu.mbarrier.init %bar[%c0], %c1 : !barrier
      %raw = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
      %smem = memref.view %raw[%c0][] : memref<?xi8, #gpu.address_space<workgroup>> to !tile
      nvgpu.tma.async.load %desc[%c0, %c0], %bar[%c0] to %smem : !map, !barrier -> !tile
      nvgpu.mbarrier.arrive.expect_tx %bar[%c0], %expect : !barrier
      %phase = arith.constant false
      %ticks = arith.constant 10000000 : index
      nvgpu.mbarrier.try_wait.parity %bar[%c0], %phase, %ticks : !barrier
      gpu.terminator
    }
    %t3 = gpu.wait async
    %t4 = gpu.dealloc async [%t3] %dd : memref<64x64xf16>
    gpu.wait [%t4]
    return
  }
}
"""


def test_host_programs_encode_tensor_maps(fake_libcuda):
    assert "mgpuTensorMapEncodeTiledMemref" in mg.HostProgram(HOST_TMA_PROGRAM, "sm_90a").llvm_ir
    assert_isolated(f"""
        import ctypes, os
        os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
        import numpy as np
        import mlirgpu as mg
        from test_hopper import HOST_TMA_PROGRAM
        fake = ctypes.CDLL({fake_libcuda!r})
        fake.fake_log.restype = ctypes.c_char_p
        prog = mg.HostProgram(HOST_TMA_PROGRAM, "sm_90a", format="ptx")
        prog("load_tile", np.zeros((64, 64), np.float16))
        log = fake.fake_log().decode()
        line = [l for l in log.splitlines() if l.startswith("cuTensorMapEncodeTiled")][0]
        # f16 (6), 64 x 64 with rows of 128 bytes, the box 64 x 64, 128-byte swizzle (3), no L2 promotion.
        assert " ".join(w for w in line.split() if not w.startswith("address=")) == (
            "cuTensorMapEncodeTiled type=6 rank=2 dims=64,64 strides=128 box=64,64 element_strides=1,1 "
            "interleave=0 swizzle=3 l2=0 oob=0"), line
        assert "cuLaunchKernel function=load_tile_kernel" in log, log
        print("ok")
    """, "ok")


# --------------------------------------------------------------------------
# Each operation's PTX
# --------------------------------------------------------------------------

@mg.kernel(max_threads=128, min_blocks=1)
def tile_mma(a_map: mg.TensorMap, b_map: mg.TensorMap, C: mg.memref[64, 128, mg.f32]):
    smem = mg.shared.dynamic(mg.bf16)
    bars = mg.mbarrier.array(1)
    t = mg.warpgroup.thread_index()
    if t == 0:
        bars.init(0, 1)
        mg.mbarrier.fence_init()
    mg.syncthreads()
    if t == 0:
        bars.arrive_expect_tx(0, (64 + 128) * 64 * 2)
        mg.tma.load(a_map, smem, (0, 0), bars, 0)
        mg.tma.load(b_map, smem, (0, 0), bars, 0, offset=64 * 64)
    bars.wait(0, 0)
    acc = mg.wgmma.zeros(128)
    mg.wgmma.fence()
    for k in mg.static_range(4):
        a = mg.wgmma.descriptor(smem, A_TILE, k_block=k)
        b = mg.wgmma.descriptor(smem, B_TILE, offset=64 * 64, k_block=k)
        acc = mg.wgmma.mma(acc, a, b, n=128)
    mg.wgmma.commit_group()
    mg.wgmma.wait_group(0)
    for r in mg.static_range(64):
        row, col = mg.wgmma.accumulator_coordinates(r, t)
        C[row, col] = acc[r]


@pytest.fixture(scope="module")
def tile_mma_ptx():
    return tile_mma.specialize({}).ptx("sm_90a")


def test_wgmma_tma_and_mbarrier_ptx(tile_mma_ptx, tmp_path):
    ptx = tile_mma_ptx
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") == 2
    for instruction in ("mbarrier.init.shared.b64", "fence.mbarrier_init.release.cluster",
                        "mbarrier.arrive.expect_tx.shared.b64", "mbarrier.try_wait.parity.shared.b64",
                        "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned"):
        assert instruction in ptx, instruction
    report = assemble(ptx, tmp_path)
    assert "0 bytes spill stores" in report


def test_tensor_maps_are_grid_constant_parameters(tile_mma_ptx):
    # As nvcc passes a __grid_constant__ const CUtensorMap: 128 bytes by value,
    # its address taken in the param space and made generic for the copy.
    ptx = tile_mma_ptx
    assert ".param .align 64 .b8 tile_mma_param_0[128]" in ptx
    assert ".param .align 64 .b8 tile_mma_param_1[128]" in ptx
    assert "cvta.param.u64" in ptx


def test_wgmma_descriptor_fields_from_the_layout(tile_mma_ptx):
    # K-major, 128-byte swizzle: layout type 1 in bits 62-63, stride byte offset
    # 1024 (8 rows of 128 bytes) >> 4 = 64 in bits 32-45, leading byte offset
    # 16 >> 4 = 1 (unused) in bits 16-29; the start address is or-ed in at run time.
    fields = (1 << 62) | (64 << 32) | (1 << 16)
    assert fields == 0x4000004000010000
    assert str(fields) in tile_mma_ptx


@mg.kernel
def store_tile(c_map: mg.TensorMap, X: mg.memref[128, mg.f32]):
    tile = mg.shared.array((64, 32), mg.f32)
    tile[mg.thread_idx.x % 64, mg.thread_idx.x % 32] = X[mg.thread_idx.x]
    mg.tma.fence_proxy_async()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        mg.tma.store(c_map, tile, (64, 32))
        mg.tma.commit_group()
        mg.tma.wait_group(0, read=True)


def test_tma_store_ptx(tmp_path):
    ptx = store_tile.specialize({}).ptx("sm_90a")
    assert "fence.proxy.async.shared::cta" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    assert "cp.async.bulk.commit_group" in ptx
    assert "cp.async.bulk.wait_group.read 0" in re.sub(r"\s+", " ", ptx)
    assemble(ptx, tmp_path)


@mg.kernel(max_threads=384, min_blocks=1)
def named_barriers(X: mg.memref[384, mg.i32]):
    X[mg.thread_idx.x] = mg.warpgroup.thread_index()
    mg.warpgroup.barrier(1 + mg.warpgroup.index())     # each warpgroup on its own barrier
    if mg.warpgroup.index() > 0:
        mg.warpgroup.barrier(4, 256)                   # the two last warpgroups together


def test_named_barrier_ptx(tmp_path):
    ptx = re.sub(r"[ \t]+", " ", named_barriers.specialize({}).ptx("sm_90a"))
    assert re.search(r"bar\.sync %r\d+, 128;", ptx)
    assert "bar.sync 4, 256;" in ptx
    assemble(ptx, tmp_path)


@mg.kernel
def multicast_share(a_map: mg.TensorMap, X: mg.memref[64 * 64, mg.bf16]):
    # Each block of a cluster of 2 loads half of a 64 x 64 tile into both.
    smem = mg.shared.dynamic(mg.bf16)
    bars = mg.mbarrier.array(2)
    rank = mg.warpgroup.cluster_rank()
    if mg.thread_idx.x == 0:
        bars.init(0, 1)
        bars.init(1, 2)
        mg.mbarrier.fence_init()
    mg.warpgroup.cluster_sync()
    if mg.thread_idx.x == 0:
        bars.arrive_expect_tx(0, 64 * 64 * 2)
        mg.tma.load(a_map, smem, (32 * rank, 0), bars, 0, offset=32 * 64 * rank, multicast=0b11)
    bars.wait(0, 0)
    X[mg.thread_idx.x] = smem[mg.thread_idx.x]
    if mg.thread_idx.x < 2:
        bars.arrive_cluster(1, mg.thread_idx.x)        # one arrival on each block's barrier 1
    bars.wait(1, 0)
    mg.warpgroup.cluster_sync()


def test_multicast_load_and_cluster_arrive_ptx(tmp_path):
    ptx = re.sub(r"[ \t]+", " ", multicast_share.specialize({}).ptx("sm_90a"))
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                     r"\.multicast::cluster \[%r?d?\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[%r?d?\d+\], %rs\d+;", ptx)
    assert ptx.count("mapa.shared::cluster.u32") == 1
    assert ptx.count("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];") == 1
    assemble(ptx, tmp_path)


def test_a_multicast_mask_is_checked():
    @mg.kernel
    def bad_mask(a_map: mg.TensorMap, X: mg.memref[8, mg.f32]):
        smem = mg.shared.dynamic(mg.bf16)
        mg.tma.load(a_map, smem, (0, 0), mg.mbarrier.array(1), 0, multicast=0)

    with pytest.raises(mg.CompileError, match="a multicast mask is an int from 1 to 0xFFFF") as info:
        bad_mask.specialize({}).ir()
    assert info.value.lineno == line_of(bad_mask.function, "multicast=0")


@mg.kernel(max_threads=384, min_blocks=1)
def specialized(X: mg.memref[384, mg.i32]):
    if mg.warpgroup.index() == 0:
        mg.warpgroup.set_max_registers(40, increase=False)
        X[mg.thread_idx.x] = mg.warpgroup.cluster_rank()
    else:
        mg.warpgroup.set_max_registers(232, increase=True)
        X[mg.thread_idx.x] = mg.warpgroup.thread_index()
    mg.warpgroup.cluster_sync()


def test_setmaxnreg_and_cluster_ptx(tmp_path):
    ptx = specialized.specialize({}).ptx("sm_90a")
    assert "setmaxnreg.dec.sync.aligned.u32 40" in re.sub(r"\s+", " ", ptx)
    assert "setmaxnreg.inc.sync.aligned.u32 232" in re.sub(r"\s+", " ", ptx)
    assert "%cluster_ctarank" in ptx
    assert "barrier.cluster.arrive.aligned" in ptx and "barrier.cluster.wait.aligned" in ptx
    report = assemble(ptx, tmp_path)
    assert "C7508" not in report  # ptxas did not ignore setmaxnreg


def import_hopper_gemm():
    sys.path.insert(0, EXAMPLES)
    try:
        import hopper_gemm
    finally:
        sys.path.remove(EXAMPLES)
    return hopper_gemm


def instructions(ptx, pattern):
    """How many lines of the PTX start with `pattern` (a regular expression)."""
    return len(re.findall(r"^\s*" + pattern, ptx, re.MULTILINE))


@pytest.mark.parametrize("options, dtype, out", [
    (dict(bn=256, stages=4, b_major="MN"), mg.bf16, mg.f16),
    (dict(bn=128, stages=6, b_major="K"), mg.bf16, mg.f32),
    (dict(bn=256, stages=3, b_major="K"), mg.f16, mg.bf16),
    (dict(bn=256, stages=4, b_major="MN", epilogue="tma"), mg.bf16, mg.bf16),
    (dict(bn=256, stages=4, b_major="K", epilogue="tma"), mg.f16, mg.f32),
    (dict(bn=256, stages=4, b_major="MN", epilogue="tma", multicast="B"), mg.bf16, mg.bf16),
    (dict(bn=256, stages=4, b_major="K", multicast="B"), mg.bf16, mg.f32),
    (dict(bn=128, stages=6, b_major="MN", epilogue="tma", multicast="A"), mg.f16, mg.f16),
    (dict(bn=128, stages=6, b_major="MN", epilogue="tma", schedule="pingpong"), mg.bf16, mg.f32),
    (dict(bn=128, stages=6, b_major="K", multicast="B", schedule="pingpong"), mg.f16, mg.bf16),
    # 32-column tiles: B given as K x N in one box of 64-byte swizzled rows, or as N x K.
    (dict(bn=32, stages=8, b_major="MN"), mg.bf16, mg.bf16),
    (dict(bn=32, stages=8, b_major="K", split=2), mg.f16, mg.f32),
    # 8-bit inputs: B given as N x K, 128-wide slices of K (k32 wgmmas).
    (dict(bn=256, stages=4, b_major="K", epilogue="tma"), mg.f8e4m3, mg.bf16),
    (dict(bn=256, stages=4, b_major="K"), mg.f8e4m3, mg.f32),
    (dict(bn=128, stages=6, b_major="K", epilogue="tma", schedule="pingpong"), mg.f8e4m3, mg.bf16),
    (dict(bn=256, stages=4, b_major="K", epilogue="tma", multicast="B"), mg.f8e5m2, mg.f16),
    (dict(bn=32, stages=8, b_major="K"), mg.f8e4m3, mg.bf16),
], ids=lambda x: "-".join(f"{v}" for v in x.values()) if isinstance(x, dict) else x.name)
def test_hopper_gemm_example_compiles(options, dtype, out, tmp_path):
    hopper_gemm = import_hopper_gemm()
    config = hopper_gemm.Config(**options).for_dtype(dtype)
    ptx = hopper_gemm.kernel_for(config, dtype)[1000, 520, out].ptx("sm_90a")
    # The main loop's 4 wgmmas of a 128-byte slice of K (k16 of 2-byte inputs, k32 of 8-bit
    # ones), for each 64-row half of the tile a consumer warpgroup multiplies (LLVM writes the
    # loop twice: its first iteration, and the rest), whatever the epilogue and the cluster.
    halves = 2 if config.schedule == "pingpong" else 1
    k, kind = {1: 32, 2: 16}[dtype.itemsize], {mg.f8e4m3: "e4m3", mg.f8e5m2: "e5m2"}.get(dtype, dtype.name)
    assert config.bk == 128 // dtype.itemsize
    assert instructions(ptx, rf"wgmma\.mma_async\.sync\.aligned\.m64n{config.bn}k{k}\.f32\.{kind}\.{kind} ") \
        == 8 * halves
    # The 8-bit kernels read their two scales; the others leave them alone.
    scaled = dtype.itemsize == 1
    assert instructions(ptx, r"ld\.param\.b32\s+%r\d+, \[hopper_gemm_param_[56]\];") == (2 if scaled else 0)
    assert "setmaxnreg.dec.sync.aligned.u32" in ptx
    # TMA loads of a stage: A's tile (or its half, shared), then B's (one box, or boxes of b_columns).
    loads = instructions(ptx, r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global")
    multicasts = instructions(ptx, r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\S*\.multicast::cluster ")
    b_boxes = 1 if config.b_major == "K" else config.bn // config.b_columns
    if config.multicast == "B":
        b_boxes = 1 if config.b_major == "K" else config.bn // 128
    assert loads == 1 + b_boxes
    assert multicasts == {None: 0, "A": 1, "B": b_boxes}[config.multicast]
    # The TMA epilogue: one store per box of 64 rows x 128 bytes of the warpgroup's 64 x BN (or 128 x BN).
    stores = instructions(ptx, r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group")
    assert stores == (halves * config.bn * out.itemsize // 128 if config.epilogue == "tma" else 0)
    if config.epilogue == "tma":
        assert "fence.proxy.async.shared::cta" in ptx
        assert instructions(ptx, r"bar\.sync\s+%r\d+, 128;") == stores
    # Clusters: both blocks' empty barriers hear from every consumer warp.
    assert instructions(ptx, r"mapa\.shared::cluster") == (2 if config.multicast else 0)
    assert ("barrier.cluster.wait" in ptx) == bool(config.multicast)
    # Ping-pong: a warpgroup waits for its turn at the tensor cores and passes it on.
    assert instructions(ptx, r"bar\.arrive ") == (1 if config.schedule == "pingpong" else 0)
    assert instructions(ptx, r"bar\.sync\s+%r\d+, 256;") == (1 if config.schedule == "pingpong" else 0)
    report = assemble(ptx, tmp_path)
    # No spills, setmaxnreg honoured (C7508), wgmmas neither serialized (C7514, C7520) nor
    # fenced by ptxas (C7517, C7519).
    assert "0 bytes spill stores" in report
    for warning in ("C7508", "C7514", "C7517", "C7519", "C7520"):
        assert warning not in report, report


def test_hopper_gemm_configs_fit_and_refuse():
    hopper_gemm = import_hopper_gemm()
    for config in hopper_gemm.CONFIGS:
        assert config.shared_bytes() <= 227 * 1024
    # 4 stages of 128 x 256 tiles (192 KB) leave room for the TMA epilogue's 32 KB, 5 do not.
    assert hopper_gemm.Config(256, 64, 4, epilogue="tma").shared_bytes() == 4 * 48 * 1024 + 32 * 1024 + 1024
    with pytest.raises(ValueError, match="bytes of shared memory, over 232448"):
        hopper_gemm.Config(256, 64, 5, epilogue="tma")
    with pytest.raises(ValueError, match="BN = 128 or 256"):
        hopper_gemm.Config(192, 64, 4, epilogue="tma")
    with pytest.raises(ValueError, match="multicast is None, 'A' or 'B'"):
        hopper_gemm.Config(256, 64, 4, multicast="C")
    with pytest.raises(ValueError, match="ping-pong schedule needs BN = 128"):
        hopper_gemm.Config(256, 64, 4, schedule="pingpong")
    with pytest.raises(ValueError, match="schedule is 'cooperative' or 'pingpong'"):
        hopper_gemm.Config(128, 64, 6, schedule="alternate")
    with pytest.raises(ValueError, match="BK is one 128-byte swizzled row"):
        hopper_gemm.Config(256, 32, 4)
    with pytest.raises(ValueError, match=r"BN is 32, 64, 128, 192 or 256 \(B's tile is boxes of 64 columns, or one "
                       r"of 32\), not 96"):
        hopper_gemm.Config(96, 64, 4)
    # 32-column tiles: the register epilogue and the cooperative schedule only; up to 11
    # stages of 20 KB.
    with pytest.raises(ValueError, match="BN = 128 or 256"):
        hopper_gemm.Config(32, 64, 4, epilogue="tma")
    with pytest.raises(ValueError, match="ping-pong schedule needs BN = 128"):
        hopper_gemm.Config(32, 64, 4, schedule="pingpong")
    assert hopper_gemm.Config(32, 64, 11).shared_bytes() == 11 * 20 * 1024 + 1024
    with pytest.raises(ValueError, match="bytes of shared memory, over 232448"):
        hopper_gemm.Config(32, 64, 12)
    # BK follows the input type: the stages hold the same bytes.
    fp8 = hopper_gemm.CONFIGS[0].for_dtype(mg.f8e4m3)
    assert fp8.bk == 128 and fp8.shared_bytes() == hopper_gemm.CONFIGS[0].shared_bytes()
    assert fp8.for_dtype(mg.bf16).bk == 64 and fp8.for_dtype(mg.f8e5m2) is fp8
    # Without a configuration, 8-bit inputs take the default with B given as N x K.
    assert repr(hopper_gemm.config_for(None, mg.f8e4m3)) == repr(fp8.replace(b_major="K"))
    assert hopper_gemm.config_for(None, mg.bf16) is hopper_gemm.CONFIGS[0]
    # Scales are those of 8-bit inputs: refused before anything runs for others.
    with pytest.raises(ValueError, match="scale_a and scale_b scale 8-bit inputs, not bf16"):
        hopper_gemm.matmul(mg.zeros((64, 64), mg.bf16), mg.zeros((64, 64), mg.bf16), scale_b=0.5)
    # A configuration of the other width is adapted: one kernel for both.
    assert hopper_gemm.kernel_for(hopper_gemm.CONFIGS[0], mg.f8e4m3) is hopper_gemm.kernel_for(fp8, mg.f8e4m3)
    assert len({config.name for config in hopper_gemm.CONFIGS}) == len(hopper_gemm.CONFIGS)
    # Rows of 7 bf16 (14 bytes) have no tensor map: such a C is stored from the registers.
    assert hopper_gemm.store_map(mg.empty((5, 7), mg.bf16)) is None


# --------------------------------------------------------------------------
# Tensor-map arguments, worked out by hand
# --------------------------------------------------------------------------

def test_encode_arguments_of_a_bf16_matrix():
    # A 1000 x 300 bf16 array with rows padded to 304 elements (608 bytes), a
    # 128 x 64 box: the driver takes sizes innermost first, strides of the
    # outer dimensions only, in bytes.
    args = encode_arguments((1000, 300), (608, 2), mg.bf16, 0x7f0000000100, box=(128, 64))
    assert args["data_type"] == 9                   # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert args["dims"] == (300, 1000)
    assert args["strides"] == (608,)
    assert args["box"] == (64, 128)
    assert args["element_strides"] == (1, 1)
    assert args["swizzle"] == 3                     # CU_TENSOR_MAP_SWIZZLE_128B
    assert args["interleave"] == 0 and args["oob_fill"] == 0 and args["l2_promotion"] == 2
    assert args["info"].box_bytes == 128 * 64 * 2


def test_encode_arguments_of_a_3d_f32_array():
    args = encode_arguments((4, 50, 16), (50 * 16 * 4, 16 * 4, 4), mg.f32, 4096, box=(1, 8, 8),
                            swizzle="32B", element_strides=(1, 2, 1), oob_fill="nan", l2_promotion=None)
    assert args["data_type"] == 7
    assert args["dims"] == (16, 50, 4)
    assert args["strides"] == (64, 3200)
    assert args["box"] == (8, 8, 1)
    assert args["element_strides"] == (1, 2, 1)
    assert (args["swizzle"], args["oob_fill"], args["l2_promotion"]) == (1, 1, 0)
    assert args["info"].box_bytes == 1 * 4 * 8 * 4  # 8 rows taken every second one


@pytest.mark.parametrize("kwargs, message", [
    (dict(box=(128, 128)), "wider than the 128B swizzle's 128"),
    (dict(box=(128, 4)), "multiple of 16"),
    (dict(box=(300, 64)), "1 to 256"),
    (dict(box=(64,)), "box must be 2 ints"),
    (dict(box=(64, 64), swizzle="256B"), "swizzle must be one of"),
    (dict(box=(64, 64), element_strides=(1, 9)), "each is 1 to 8"),
    (dict(box=(64, 64), oob_fill="ones"), "oob_fill must be one of"),
])
def test_encode_arguments_refuses(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        encode_arguments((1000, 304), (608, 2), mg.bf16, 0x1000, **kwargs)


def test_encode_arguments_refuses_unaligned_rows_and_types():
    with pytest.raises(ValueError, match="multiple of 16"):
        encode_arguments((10, 7), (14, 2), mg.f16, 0x1000, box=(8, 8))
    with pytest.raises(ValueError, match="16-byte aligned"):
        encode_arguments((10, 8), (16, 2), mg.f16, 0x1008, box=(8, 8))
    with pytest.raises(ValueError, match="cannot hold"):
        encode_arguments((10, 16), (16, 1), mg.i8, 0x1000, box=(8, 16))
    with pytest.raises(ValueError, match="for float elements"):
        encode_arguments((10, 8), (32, 4), mg.i32, 0x1000, box=(8, 8), oob_fill="nan")


def test_box_layout_is_the_wgmma_tile():
    # The 128-byte swizzled box that TMA writes is the K-major wgmma tile:
    # the same function, so the descriptor computed from either is the same.
    box = box_layout((64, 64), mg.bf16, "128B")
    assert str(box) == "Sw<3,3,3> o 0 o (64,64):(64,1)"
    for i in range(64):
        for j in range(64):
            assert box(i, j) == A_TILE(i, j)
    d = wgmma_layout.descriptor(box, 2)
    assert (d.swizzle, d.leading_byte_offset, d.stride_byte_offset) == ("128B", 16, 1024)
    assert str(box_layout((8, 32), mg.f32, "none")) == "(8,32):(32,1)"
    assert str(box_layout((8, 16), mg.f32, "64B")) == "Sw<2,2,3> o 0 o (8,16):(16,1)"


def test_an_fp8_box_is_the_k32_wgmma_tile():
    # 128 one-byte elements a row: the swizzle permutes 16-element units (base 4), and the
    # tile is the 8-bit K-major one, whose descriptor has the 2-byte tile's integers.
    box = box_layout((128, 128), mg.f8e4m3, "128B")
    assert str(box) == "Sw<3,4,3> o 0 o (128,128):(128,1)"
    tile = wgmma_layout.tile_layout((128, 128), 1, "128B")
    for i in range(128):
        for j in range(128):
            assert box(i, j) == tile(i, j)
    d = wgmma_layout.descriptor(box, 1)
    assert (d.swizzle, d.leading_byte_offset, d.stride_byte_offset, d.k_offsets) == ("128B", 16, 1024, (0, 32, 64, 96))
    args = encode_arguments((1000, 304), (304, 1), mg.f8e4m3, 0x10000, box=(128, 128))
    assert args["data_type"] == 0 and args["info"].box_bytes == 128 * 128   # copied as bytes (UINT8)


# --------------------------------------------------------------------------
# Misuse: CompileErrors at the user's line, before LLVM could abort
# --------------------------------------------------------------------------

@mg.kernel
def only_wgmma(X: mg.memref[64, mg.f32]):
    smem = mg.shared.array((128 * 64,), mg.bf16)
    acc = mg.wgmma.zeros(64)
    a = mg.wgmma.descriptor(smem, A_TILE)
    acc = mg.wgmma.mma(acc, a, a, n=64)
    X[0] = acc[0]


def test_wgmma_for_sm80_is_a_compile_error_at_its_line():
    with pytest.raises(mg.CompileError, match=r"nvvm.wgmma.mma_async \(mg.wgmma\) needs sm_90a; this kernel is compiled for sm_80") as info:
        only_wgmma.specialize({}).ptx("sm_80")
    assert (info.value.filename, info.value.lineno) == (__file__, line_of(only_wgmma.function, "acc = mg.wgmma.mma"))
    assert "acc = mg.wgmma.mma(acc, a, a, n=64)" in str(info.value)


# --------------------------------------------------------------------------
# 8-bit floats: K-major k32 wgmmas
# --------------------------------------------------------------------------

TILE8 = wgmma_layout.tile_layout((64, 128), 1, "128B")   # 64 rows of 128 one-byte elements along K


@mg.kernel
def fp8_wgmma(X: mg.memref[64, 64, mg.f32]):
    sA = mg.shared.array((64 * 128,), mg.f8e4m3)
    sB = mg.shared.array((64 * 128,), mg.f8e5m2)
    t = mg.warpgroup.thread_index()
    acc = mg.wgmma.zeros(64)
    mg.wgmma.fence()
    for k in mg.static_range(4):
        a = mg.wgmma.descriptor(sA, TILE8, k_block=k)
        acc = mg.wgmma.mma(acc, a, a, n=64)
    acc = mg.wgmma.mma(acc, a, mg.wgmma.descriptor(sB, TILE8, k_block=3), n=64)  # e4m3 x e5m2
    mg.wgmma.commit_group()
    acc = mg.wgmma.wait_group(0, acc)
    for r in mg.static_range(32):
        row, col = mg.wgmma.accumulator_coordinates(r, t)
        X[row, col] = acc[r]


def test_fp8_wgmma_ptx(tmp_path):
    ptx = fp8_wgmma.specialize({}).ptx("sm_90a")
    assert instructions(ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3 ") == 4
    assert instructions(ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e5m2 ") == 1
    # The 128-byte swizzle's fields, as for 2-byte elements (rows of 128 bytes, 8-row groups 1024
    # bytes apart); each k32 reads the next 32 bytes of the rows.
    assert str(0x4000004000010000) in ptx
    assert wgmma_layout.descriptor(TILE8, 1).k_offsets == (0, 32, 64, 96)
    assemble(ptx, tmp_path)


def test_fp8_wgmma_for_sm80_is_a_compile_error_at_its_line():
    with pytest.raises(mg.CompileError, match=r"\(mg.wgmma\) needs sm_90a; this kernel is compiled for sm_80") as info:
        fp8_wgmma.specialize({}).ptx("sm_80")
    assert (info.value.filename, info.value.lineno) == (__file__, line_of(fp8_wgmma.function, "mg.wgmma.fence()"))


def test_hopper_gemm_fp8_needs_b_given_as_n_by_k():
    hopper_gemm = import_hopper_gemm()
    config = hopper_gemm.Config(256, 128, 4, b_major="MN")
    with pytest.raises(mg.CompileError, match="wgmma reads f8e4m3 operands K-major only") as info:
        hopper_gemm.kernel_for(config, mg.f8e4m3)[256, 256, mg.bf16].ptx("sm_90a")
    # The kernel is written in mlirgpu.ops (the example imports it): errors point there.
    assert info.value.filename == sys.modules["mlirgpu.ops.hopper_gemm"].__file__
    assert "lang.wgmma.descriptor(smem, B_TILE" in str(info.value)
    with pytest.raises(mg.CompileError, match="needs sm_90") as info:
        hopper_gemm.kernel_for(config.replace(b_major="K"), mg.f8e4m3)[256, 256, mg.bf16].ptx("sm_80")
    assert info.value.filename == sys.modules["mlirgpu.ops.hopper_gemm"].__file__


@mg.kernel
def copy_fp8(A: mg.memref[32, mg.f8e4m3], B: mg.memref[32, mg.f8e4m3]):
    B[mg.thread_idx.x] = A[mg.thread_idx.x]


def test_fp8_values_are_loaded_and_stored_as_bytes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = (np.arange(-16, 16, dtype=np.float32) / 4).astype(ml_dtypes.float8_e4m3fn)
    b = np.zeros_like(a)
    copy_fp8(a, b, grid=1, block=32)
    np.testing.assert_array_equal(b.view(np.uint8), a.view(np.uint8))
    ptx = copy_fp8.specialize({}).ptx("sm_90a")
    assert "ld.global.b8" in ptx and "st.global.b8" in ptx


@pytest.mark.parametrize("chip, line_text, what", [
    ("sm_80", "mg.mbarrier.fence_init()", "nvvm.fence.mbarrier.init (mg.mbarrier) needs sm_90 or later"),
    ("sm_89", "mg.mbarrier.fence_init()", "nvvm.fence.mbarrier.init (mg.mbarrier) needs sm_90 or later"),
    ("sm_90", "mg.wgmma.fence()", "nvvm.wgmma.fence.aligned (mg.wgmma) needs sm_90a"),
    ("sm_100a", "mg.wgmma.fence()", "nvvm.wgmma.fence.aligned (mg.wgmma) needs sm_90a"),
])
def test_operation_chip_errors_name_the_line(chip, line_text, what):
    # The first operation the chip lacks, in program order, checked before LLVM runs.
    with pytest.raises(mg.CompileError) as info:
        tile_mma.specialize({}).ptx(chip)
    message = str(info.value)
    assert (info.value.filename, info.value.lineno) == (__file__, line_of(tile_mma.function, line_text))
    assert what in message and f"this kernel is compiled for {chip}" in message and line_text in message


def test_setmaxnreg_needs_an_arch_specific_chip():
    with pytest.raises(mg.CompileError, match=r"nvvm.setmaxregister \(mg.warpgroup.set_max_registers\) needs sm_90a or sm_100a or "
                       r"sm_120a; this kernel is compiled for sm_90\b") as info:
        specialized.specialize({}).ptx("sm_90")
    assert info.value.lineno == line_of(specialized.function, "set_max_registers(40")


def test_a_swizzle_wgmma_cannot_read_is_a_compile_error():
    # 128-byte rows swizzled in 32-byte units (base 4 for 2-byte elements):
    # not one of wgmma's three swizzles.
    odd = ComposedLayout(Swizzle(3, 4, 3), 0, Layout((64, 64), (64, 1)))

    @mg.kernel
    def bad_swizzle(X: mg.memref[64, mg.u64]):
        smem = mg.shared.array((64 * 64,), mg.bf16)
        d = mg.wgmma.descriptor(smem, odd)
        X[0] = d.value

    with pytest.raises(mg.CompileError, match="not a swizzle wgmma reads") as info:
        bad_swizzle.specialize({}).ir()
    assert info.value.lineno == line_of(bad_swizzle.function, "mg.wgmma.descriptor(smem, odd)")


def test_a_padded_layout_is_not_a_wgmma_tile():
    # Rows padded to 72 elements (a bank-conflict habit of mma.sync kernels):
    # wgmma's canonical tiles have no padding.
    padded = Layout((64, 64), (72, 1))

    @mg.kernel
    def bad_padding(X: mg.memref[64, mg.u64]):
        smem = mg.shared.array((64 * 72,), mg.bf16)
        X[0] = mg.wgmma.descriptor(smem, padded).value

    with pytest.raises(mg.CompileError, match="no wgmma descriptor") as info:
        bad_padding.specialize({}).ir()
    assert info.value.lineno == line_of(bad_padding.function, "mg.wgmma.descriptor(smem, padded)")


@pytest.mark.parametrize("body, message", [
    ("mg.warpgroup.set_max_registers(300, increase=True)", "multiple of 8 from 24 to 256"),
    ("mg.wgmma.wait_group(9)", "from 0 to 7"),
    ("mg.tma.wait_group(-1)", "from 0 to 63"),
    ("mg.mbarrier.array(0)", "from 1 to 1024"),
    ("mg.mbarrier.array(2).init(2, 1)", "index 2 is out of range"),
    ("mg.wgmma.zeros(100)", "multiple of 8 from 8 to 256"),
    ("mg.tma.load(X, X, (0,), mg.mbarrier.array(1))", "tensor-map parameter"),
    ("mg.wgmma.descriptor(X, None)", "a wgmma operand is a shared-memory array"),
    ("mg.wgmma.descriptor(mg.shared.array((64 * 64,), mg.f32), None)", "f8e4m3 or f8e5m2 operands, not f32"),
    ("mg.wgmma.descriptor(mg.shared.array((64 * 128,), mg.f8e4m3), None, major='MN')",
     "wgmma reads f8e4m3 operands K-major only: give B as N x K"),
    ("mg.wgmma.descriptor(mg.shared.array((64 * 128,), mg.f8e5m2), TILE8, k_block=4)",
     "k_block must be a Python int below 4 (the tile's K / 32)"),
    ("mg.wgmma.mma(mg.wgmma.zeros(64), mg.wgmma.descriptor(mg.shared.array((64 * 64,), mg.f16), TILE), "
     "mg.wgmma.descriptor(mg.shared.array((64 * 128,), mg.f8e4m3), TILE8), n=64)",
     "wgmma operands have one element type, got f16 and f8e4m3"),
    ("mg.shared.array((4,), mg.f8e4m3)[0] * 2.0", "* on f8e4m3 values: 8-bit floats are storage only"),
    ("mg.cast(mg.shared.array((4,), mg.f8e5m2)[0], mg.f32)", "mg.cast on f8e5m2 values"),
    ("mg.constant(1.0, mg.f8e4m3)", "mg.constant on f8e4m3 values"),
    ("mg.wgmma.descriptor(mg.shared.array((64 * 64,), mg.f16), TILE, k_block=4)", "k_block must be a Python int below 4"),
    ("mg.wgmma.mma(mg.wgmma.zeros(64), 1, 2, n=64)",
     "mg.wgmma.mma takes a descriptor (mg.wgmma.descriptor) or a Fragment (mg.wgmma.fragments) for a"),
    ("mg.wgmma.fragments([0.0] * 8, mg.f32)", "a wgmma A fragment holds f16, bf16, f8e4m3 or f8e5m2 values, not f32"),
    ("mg.wgmma.fragments([0.0] * 12, mg.bf16)", "fragments of bf16 take an m64nN accumulator (N/2 values, N a multiple "
     "of 16), got 12"),
    ("mg.wgmma.fragments([0.0] * 8, mg.f8e4m3)", "fragments of f8e4m3 take an m64nN accumulator (N/2 values, N a "
     "multiple of 32), got 8"),
    ("d = mg.wgmma.descriptor(mg.shared.array((64 * 64,), mg.f16), TILE); mg.wgmma.mma([0.0] * 8, d, d, n=64)",
     "an m64n64 accumulator is a list of 32 f32 values, got 8"),
    ("mg.warpgroup.set_max_registers(100, increase=True)", "multiple of 8 from 24 to 256"),
    ("mg.warpgroup.barrier(0)", "id is 1 to 15 (0 is syncthreads), not 0"),
    ("mg.warpgroup.barrier(1, 100)", "a multiple of 32 threads up to 1024, not 100"),
    ("mg.warpgroup.barrier(1.5)", "an int or a traced integer"),
])
def test_misuse_is_a_compile_error(body, message, tmp_path):
    source = tmp_path / "misuse.py"
    source.write_text(f"import mlirgpu as mg\nTILE = mg.layout.wgmma.tile_layout((64, 64), 2, '128B')\n"
                      f"TILE8 = mg.layout.wgmma.tile_layout((64, 128), 1, '128B')\n"
                      f"@mg.kernel\ndef misuse(X: mg.memref[8, mg.f32]):\n    {body}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import misuse
        with pytest.raises(mg.CompileError, match=re.escape(message)) as info:
            misuse.misuse.specialize({}).ir()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("misuse", None)
    assert info.value.lineno == 6


def test_the_cpu_backend_refuses_cluster_operations_and_runs_the_others():
    from mlirgpu.targets.cpu import CpuLowering
    for kernel, what in ((multicast_share, "mg.warpgroup.cluster_rank"), (specialized, "mg.warpgroup.cluster_rank")):
        with pytest.raises(mg.CompileError, match=re.escape(what) + " runs only on the GPU"):
            kernel.specialize({}).trace(target=CpuLowering())
    for kernel in (store_tile, named_barriers, tile_mma):
        kernel.specialize({}).trace(target=CpuLowering())


def test_a_tensor_map_parameter_needs_a_tensor_map():
    with pytest.raises(mg.LaunchError, match="parameter 'c_map' is a tensor map"):
        store_tile.bind([object(), np.zeros(128, np.float32)])


# --------------------------------------------------------------------------
# Through the (fake) driver: the encode call, the map by value, clusters
# --------------------------------------------------------------------------

def test_tensor_maps_and_clusters_reach_the_driver(fake_libcuda, tmp_path):
    # A script file: kernels need their source, which `python -c` code has not.
    script = tmp_path / "fake_maps.py"
    no_ptxas = toolkit_without_ptxas(str(tmp_path))   # kernels load as PTX, which the fake reads
    script.write_text(textwrap.dedent(f"""
        import ctypes, os
        os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
        os.environ["CUDA_HOME"] = {no_ptxas!r}
        import numpy as np
        import mlirgpu as mg
        fake = ctypes.CDLL({fake_libcuda!r})
        fake.fake_log.restype = ctypes.c_char_p

        A = mg.to_device(np.zeros((100, 72), np.float16))
        a_map = mg.tensor_map(A, box=(64, 64), swizzle="128B")
        log = fake.fake_log().decode()
        line = [l for l in log.splitlines() if l.startswith("cuTensorMapEncodeTiled")][-1]
        assert line == ("cuTensorMapEncodeTiled type=6 rank=2 address=%d dims=72,100 strides=144 box=64,64 "
                        "element_strides=1,1 interleave=0 swizzle=3 l2=2 oob=0" % A.ptr), line
        assert a_map.owner is A and a_map.data[:8] == A.ptr.to_bytes(8, "little")

        @mg.kernel
        def tensor_map_first(m: mg.TensorMap, X: mg.memref[4, mg.f32]):
            X[0] = 1.0

        X = mg.zeros((4,), mg.f32)
        fake.fake_log_clear()
        tensor_map_first(a_map, X, grid=(4, 1), block=128, cluster=(2, 1, 1), shared_mem=100 * 1024)
        log = fake.fake_log().decode()
        assert "cuLaunchKernelEx cluster=2,1,1" in log, log
        assert "tensor_map_first address=%d swizzle=3" % A.ptr in log, log
        # Past 48 KB of dynamic shared memory a kernel must opt in: it does once, when it is
        # loaded, to the device's limit (less its static shared memory), before its first launch.
        raised = [int(l.split("=")[1]) for l in log.splitlines() if l.startswith("cuFuncSetAttribute max_dynamic_shared=")]
        assert len(raised) == 1 and raised[0] >= 100 * 1024, log
        assert log.index("cuFuncSetAttribute") < log.index("cuLaunchKernelEx"), log
        fake.fake_log_clear()
        tensor_map_first(a_map, X, grid=1, block=128, shared_mem=100 * 1024)
        second = fake.fake_log().decode()
        assert "cuFuncSetAttribute" not in second, second
        try:
            tensor_map_first(X, X, grid=1, block=1)
        except mg.LaunchError as error:
            assert "is a tensor map" in str(error)
        else:
            raise AssertionError("an array passed for a tensor map")
        try:
            tensor_map_first(a_map, X, grid=3, block=1, cluster=2)
        except mg.LaunchError as error:
            assert "whole number of clusters" in str(error)
        else:
            raise AssertionError("a grid of partial clusters")
        try:
            mg.tensor_map(A, box=(64, 128))
        except ValueError as error:
            assert "wider than the 128B swizzle" in str(error)
        print("ok")
    """))
    assert_isolated(f"import runpy; runpy.run_path({str(script)!r})", "ok")


def test_tensor_maps_are_encoded_once_per_set_of_parameters(fake_libcuda):
    """mg.tensor_map keeps what it encoded (bounded, least recently used out):
    the same parameters give the same bytes without the driver, bound to the
    caller's array; the cache keeps no array alive."""
    assert_isolated(f"""
import ctypes, gc, os, weakref
os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
import numpy as np
import mlirgpu as mg
from mlirgpu.runtime import tensormap
fake = ctypes.CDLL({fake_libcuda!r})
fake.fake_log.restype = ctypes.c_char_p
encodes = lambda: fake.fake_log().decode().count("cuTensorMapEncodeTiled")

A = mg.to_device(np.zeros((128, 64), np.float16))
first = mg.tensor_map(A, box=(64, 64))
view = mg.asarray(A)   # another object over the same memory
again, of_view = mg.tensor_map(A, box=[64, 64]), mg.tensor_map(view, box=(64, 64))
assert encodes() == 1, fake.fake_log().decode()
assert first.data == again.data == of_view.data and first.info is of_view.info
assert first.owner is A and of_view.owner is view
mg.tensor_map(A, box=(32, 64))                 # another box: another map
mg.tensor_map(A, box=(64, 64), oob_fill="nan")  # another fill
assert encodes() == 3
assert tensormap._encoded.cache_info().maxsize == tensormap.TENSOR_MAP_CACHE_SIZE == 1024
B = mg.zeros((64, 64), mg.f16)
alive = weakref.ref(B)
mg.tensor_map(B, box=(64, 64))
del B
gc.collect()
assert alive() is None, "the cache keeps the array alive"
print("ok")
""", "ok")
