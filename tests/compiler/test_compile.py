"""Lowering gpu-dialect modules to PTX and cubin (CPU only: no GPU needed).

The SGEMM module comes from sgemm_ir.build_sgemm_module, built through
ir.Operation.create alone.
"""
import os
import re
import subprocess

import pytest

import mlirgpu as mg
import mlirgpu.compiler
from support.checks import assert_isolated, filecheck
from mlirgpu import ir
from support.sgemm_ir import build_sgemm_module

PTXAS = os.path.join(mlirgpu.compiler.CUDA_HOME, "bin", "ptxas")
M, K, N = 256, 128, 256


@pytest.fixture
def sgemm(ctx):
    return build_sgemm_module(M, K, N)


@pytest.fixture
def no_llvm(monkeypatch):
    """Fails the test if the compiler gets as far as running a pass pipeline."""
    def forbidden(source, pipeline, **options):
        raise AssertionError(f"a pipeline ran before validation failed: {pipeline}")
    monkeypatch.setattr(mlirgpu.compiler.nvvm, "lower", forbidden)


def ptx_version(ptx):
    return re.search(r"^\.version (\d+)\.(\d+)$", ptx, re.MULTILINE).groups()


# --------------------------------------------------------------------------
# The SGEMM module as built
# --------------------------------------------------------------------------

def test_sgemm_module_is_built_not_parsed(sgemm):
    assert sgemm.verify() is True
    filecheck(str(sgemm),
              r"^module attributes \{gpu\.container_module\} \{",
              r"gpu\.module @kernels \{",
              r"gpu\.func @sgemm_naive\(%arg0: memref<256x128xf32>, %arg1: memref<128x256xf32>, "
              r"%arg2: memref<256x256xf32>\) kernel \{",
              r"%cst = arith\.constant 1\.000000e\+00 : f32",
              r"%cst_0 = arith\.constant 0\.000000e\+00 : f32",
              r"%block_dim_x = gpu\.block_dim\s+x", r"%block_id_x = gpu\.block_id\s+x",
              r"%0 = arith\.muli %block_dim_x, %block_id_x : index",
              r"%thread_id_x = gpu\.thread_id\s+x", r"%1 = arith\.addi %0, %thread_id_x : index",
              r"%block_dim_y = gpu\.block_dim\s+y", r"%thread_id_y = gpu\.thread_id\s+y",
              r"%3 = arith\.addi %2, %thread_id_y : index",
              r"%c128 = arith\.constant 128 : index",
              r"%4 = scf\.for %arg3 = %c0 to %c128 step %c1 iter_args\(%arg4 = %cst_0\) -> \(f32\) \{",
              r"%6 = memref\.load %arg0\[%1, %arg3\] : memref<256x128xf32>",
              r"%7 = memref\.load %arg1\[%arg3, %3\] : memref<128x256xf32>",
              r"%8 = arith\.mulf %6, %7 : f32", r"%9 = arith\.addf %arg4, %8 : f32",
              r"scf\.yield %9 : f32",
              r"%5 = arith\.addf %4, %cst : f32",
              r"memref\.store %5, %arg2\[%1, %3\] : memref<256x256xf32>",
              r"gpu\.return")
    # Every operation carries the line of examples/sgemm_naive.py that made it.
    text = sgemm.print(debug_info=True)
    assert re.search(r'loc\(".*sgemm_naive\.py":\d+:0\)', text)
    kernel = [op for op in sgemm.walk() if op.name == "gpu.func"][0]
    assert kernel.location.filename.endswith("sgemm_naive.py")


def test_sgemm_builder_sizes(ctx):
    module = build_sgemm_module(64, 32, 16)
    assert "gpu.func @sgemm_naive(%arg0: memref<64x32xf32>, %arg1: memref<32x16xf32>, %arg2: memref<64x16xf32>)" \
        in str(module)
    assert "%c32 = arith.constant 32 : index" in str(module)


# --------------------------------------------------------------------------
# PTX for every chip, accepted by ptxas
# --------------------------------------------------------------------------

@pytest.mark.parametrize("chip", sorted(mlirgpu.compiler.CHIPS))
def test_ptx_for_every_chip_passes_ptxas(sgemm, chip, tmp_path):
    ptx = mg.compile_ptx(sgemm, chip=chip)
    assert isinstance(ptx, str)
    filecheck(ptx, rf"^\.target {chip}$", r"^\.address_size 64$", r"\.visible \.entry sgemm_naive\(",
              r"ld\.global\.(f32|b32)", r"(fma\.rn\.f32|mul\.rn\.f32)", r"st\.global\.(f32|b32)", r"^\s*ret;")
    wanted = mlirgpu.compiler.CHIPS[chip]
    assert ptx_version(ptx) == (str(wanted // 10), str(wanted % 10))
    path = tmp_path / f"sgemm_{chip}.ptx"
    path.write_text(ptx)
    proc = subprocess.run([PTXAS, f"-arch={chip}", str(path), "-o", str(tmp_path / f"{chip}.cubin")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / f"{chip}.cubin").read_bytes()[:4] == b"\x7fELF"


def test_ptx_version_follows_the_chip(sgemm):
    assert ptx_version(mg.compile_ptx(sgemm, chip="sm_80")) == ("7", "0")
    assert ptx_version(mg.compile_ptx(sgemm, chip="sm_90a")) == ("8", "0")
    assert ptx_version(mg.compile_ptx(sgemm, chip="sm_75")) == ("6", "3")


def test_explicit_features_are_honoured(sgemm, tmp_path):
    ptx = mg.compile_ptx(sgemm, chip="sm_90a", features="+ptx85")
    assert ptx_version(ptx) == ("8", "5")
    assert ".target sm_90a" in ptx
    assert ptx_version(mg.compile_ptx(sgemm, chip="sm_80", features="+ptx78")) == ("7", "8")
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    assert subprocess.run([PTXAS, "-arch=sm_90a", str(path), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, timeout=120).returncode == 0


def test_opt_level_zero_compiles(sgemm):
    ptx = mg.compile_ptx(sgemm, chip="sm_90a", opt_level=0)
    assert ".visible .entry sgemm_naive(" in ptx


def test_default_chip_is_sm_90a(sgemm):
    assert ".target sm_90a" in mg.compile_ptx(sgemm)


def test_compile_cubin_returns_elf(sgemm):
    cubin = mg.compile_cubin(sgemm, chip="sm_90a")
    assert isinstance(cubin, bytes)
    assert cubin[:4] == b"\x7fELF"
    assert b"sgemm_naive" in cubin
    assert mg.compile_cubin(sgemm, chip="sm_80")[:4] == b"\x7fELF"


# --------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------

def test_compilation_stages(sgemm):
    c = mg.Compilation(sgemm, chip="sm_90a")
    assert repr(c.target) == "Target(chip='sm_90a', features='+ptx80', opt_level=3)"
    assert c.stage("gpu") == c.gpu == str(sgemm)
    assert "gpu.func @sgemm_naive" in c.gpu and "nvvm.target" not in c.gpu
    filecheck(c.outlined, r'gpu\.module @kernels \[#nvvm\.target<O = 3, chip = "sm_90a", features = "\+ptx80">\]',
              r"gpu\.func @sgemm_naive")
    filecheck(c.nvvm, r"gpu\.module @kernels", r"llvm\.func @sgemm_naive\(%arg0: !llvm\.ptr",
              r"nvvm\.read\.ptx\.sreg\.ntid\.x", r"nvvm\.read\.ptx\.sreg\.ctaid\.x", r"nvvm\.read\.ptx\.sreg\.tid\.x",
              r"llvm\.fmul", r"llvm\.fadd", r"llvm\.store")
    assert "gpu.func" not in c.nvvm and "scf.for" not in c.nvvm
    filecheck(c.llvm_ir, r'target triple = "nvptx64-nvidia-cuda"', r"define ptx_kernel void @sgemm_naive\(",
              r"@llvm\.nvvm\.read\.ptx\.sreg\.tid\.x", r"fmul", r"store float")
    filecheck(c.ptx, r"^\.version 8\.0$", r"^\.target sm_90a$", r"\.visible \.entry sgemm_naive\(")
    assert c.cubin[:4] == b"\x7fELF"
    for name in mlirgpu.compiler.STAGES:
        assert c.stage(name) is not None
    assert c.stage("ptx") is c.stage("ptx")  # computed once
    assert c.objects("ptx") == {"kernels": c.ptx}
    assert set(c.objects("cubin")) == {"kernels"} and set(c.objects("llvm_ir")) == {"kernels"}


def test_outlining_stage_outlines_gpu_launch(ctx):
    module = ir.Module.parse("""
        module attributes {gpu.container_module} {
          func.func @host(%buf: memref<16xf32>) {
            %c1 = arith.constant 1 : index
            %c16 = arith.constant 16 : index
            gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
                       threads(%tx, %ty, %tz) in (%sx = %c16, %sy = %c1, %sz = %c1) {
              %v = memref.load %buf[%tx] : memref<16xf32>
              %w = arith.addf %v, %v : f32
              memref.store %w, %buf[%tx] : memref<16xf32>
              gpu.terminator
            }
            return
          }
        }
    """)
    c = mg.Compilation(module, chip="sm_80")
    filecheck(c.outlined, r"gpu\.launch_func\s+@host_kernel::@host_kernel", r"gpu\.module @host_kernel \[#nvvm\.target",
              r"gpu\.func @host_kernel\(.*\) kernel")
    assert "gpu.launch blocks" not in c.outlined
    filecheck(c.ptx, r"\.target sm_80", r"\.entry host_kernel\(", r"add\.rn\.f32|add\.f32")


def test_two_gpu_modules(ctx):
    module = build_sgemm_module(M, K, N)
    second = build_sgemm_module(64, 64, 64, module_name="small", kernel_name="sgemm_small")
    copy = second.body.operations[0].clone()
    module.body.append(copy)
    assert module.verify() is True
    c = mg.Compilation(module, chip="sm_90a")
    with pytest.raises(mg.CompileError, match=r"the module holds 2 gpu\.modules \(kernels, small\); "
                                              r"use Compilation\.objects\('ptx'\)"):
        c.ptx
    with pytest.raises(mg.CompileError, match="2 gpu.modules"):
        c.cubin
    objects = c.objects("ptx")
    assert set(objects) == {"kernels", "small"}
    assert ".entry sgemm_naive(" in objects["kernels"] and ".entry sgemm_small(" in objects["small"]
    assert all(blob[:4] == b"\x7fELF" for blob in c.objects("cubin").values())


def test_objects_of_a_bad_stage(sgemm):
    with pytest.raises(ValueError, match="objects\\(\\) takes 'llvm_ir', 'ptx' or 'cubin', not 'nvvm'"):
        mg.Compilation(sgemm).objects("nvvm")


def test_unknown_stage(sgemm):
    with pytest.raises(ValueError, match="unknown stage 'sass'"):
        mg.Compilation(sgemm).stage("sass")


def test_users_module_is_unchanged(sgemm):
    before, generic_before = str(sgemm), sgemm.print(generic=True, debug_info=True)
    kernel = [op for op in sgemm.walk() if op.name == "gpu.func"][0]
    mg.compile_ptx(sgemm, chip="sm_90a")
    mg.compile_cubin(sgemm, chip="sm_80")
    assert str(sgemm) == before
    assert sgemm.print(generic=True, debug_info=True) == generic_before
    assert kernel.is_valid and kernel.name == "gpu.func"


def test_compile_again_gives_the_same_ptx(sgemm):
    assert mg.compile_ptx(sgemm, chip="sm_86") == mg.compile_ptx(sgemm, chip="sm_86")


# --------------------------------------------------------------------------
# Bad targets: CompileError before anything runs
# --------------------------------------------------------------------------

@pytest.mark.parametrize("chip, message", [
    ("sm_91", "unknown or unsupported chip 'sm_91'"),
    ("sm_50", "unknown or unsupported chip 'sm_50'"),
    ("SM_90A", "unknown or unsupported chip 'SM_90A'"),
    (90, "chip must be a str such as 'sm_90a', not int"),
    (None, "chip must be a str such as 'sm_90a', not NoneType"),
])
def test_bad_chip(sgemm, no_llvm, chip, message):
    with pytest.raises(mg.CompileError, match=re.escape(message)):
        mg.compile_ptx(sgemm, chip=chip)


@pytest.mark.parametrize("chip, features, message", [
    ("sm_90a", "+ptx60", "unknown PTX version in '+ptx60'"),
    ("sm_90a", "+ptx78", "sm_90a needs PTX 8.0 or newer, got '+ptx78'"),
    ("sm_80", "+ptx65", "sm_80 needs PTX 7.0 or newer, got '+ptx65'"),
    ("sm_90a", "ptx80", "features must look like '+ptx80', got 'ptx80'"),
    ("sm_90a", "+ptx99", "unknown PTX version in '+ptx99'"),
    ("sm_90a", "+ptx80,+sm_90a", "features must look like '+ptx80'"),
    ("sm_90a", 80, "features must look like '+ptx80', got 80"),
])
def test_bad_features(sgemm, no_llvm, chip, features, message):
    with pytest.raises(mg.CompileError, match=re.escape(message)):
        mg.compile_ptx(sgemm, chip=chip, features=features)


@pytest.mark.parametrize("opt_level", [4, -1, "3", True, None, 2.5])
def test_bad_opt_level(sgemm, no_llvm, opt_level):
    with pytest.raises(mg.CompileError, match=re.escape(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")):
        mg.compile_ptx(sgemm, chip="sm_90a", opt_level=opt_level)


def test_float_opt_level(sgemm, no_llvm):
    """3.0 == 3, but it reaches the pipeline text as 'O=3.0', which MLIR rejects."""
    with pytest.raises(mg.CompileError, match=re.escape("opt_level must be 0, 1, 2 or 3, got 3.0")):
        mg.compile_ptx(sgemm, chip="sm_90a", opt_level=3.0)


def test_a_compile_error_that_is_not_mlirs_has_no_diagnostics(sgemm, no_llvm):
    """`diagnostics` is documented on every CompileError: an empty tuple where MLIR said nothing."""
    with pytest.raises(mg.CompileError) as caught:
        mg.compile_ptx(sgemm, chip="sm_90a", opt_level=4)
    assert caught.value.diagnostics == ()


def test_bad_chip_in_compile_cubin(sgemm, no_llvm):
    with pytest.raises(mg.CompileError, match="unknown or unsupported chip 'sm_91'"):
        mg.compile_cubin(sgemm, chip="sm_91")


def test_module_with_its_own_bad_target(ctx, no_llvm):
    module = build_sgemm_module(M, K, N)
    gpu_module = module.body.operations[0]
    gpu_module.set_attribute("targets", ir.Attribute.parse(
        '[#nvvm.target<chip = "sm_90a", features = "+ptx60">]'))
    assert module.verify() is True
    with pytest.raises(mg.CompileError, match=re.escape("'+ptx60'")):
        mg.compile_ptx(module)


def test_module_with_its_own_default_target(ctx, no_llvm):
    """#nvvm.target without a chip means sm_50, which LLVM 22 no longer targets."""
    module = build_sgemm_module(M, K, N)
    module.body.operations[0].set_attribute("targets", ir.Attribute.parse("[#nvvm.target]"))
    with pytest.raises(mg.CompileError, match="unknown or unsupported chip 'sm_50'"):
        mg.compile_ptx(module)


def test_module_with_a_non_nvvm_target(ctx, no_llvm):
    module = build_sgemm_module(M, K, N)
    module.body.operations[0].set_attribute("targets", ir.Attribute.parse('[#rocdl.target<chip = "gfx90a">]'))
    with pytest.raises(mg.CompileError, match="gpu.module has a non-NVVM target #rocdl.target"):
        mg.compile_ptx(module)


def test_module_with_its_own_good_target(ctx):
    module = build_sgemm_module(M, K, N)
    module.body.operations[0].set_attribute("targets", ir.Attribute.parse(
        '[#nvvm.target<chip = "sm_80", features = "+ptx70">]'))
    assert ".entry sgemm_naive(" in mg.compile_ptx(module, chip="sm_80")


def test_module_without_gpu_module(ctx):
    module = ir.Module.parse("func.func @f(%a: f32) -> f32 {\n  return %a : f32\n}")
    with pytest.raises(mg.CompileError, match="the module holds no gpu.module to compile"):
        mg.compile_ptx(module)


def test_empty_module(ctx):
    with pytest.raises(mg.CompileError, match="no gpu.module"):
        mg.compile_cubin(ir.Module.create())


def test_invalid_module_raises_compile_error(ctx):
    module = build_sgemm_module(M, K, N)
    kernel = [op for op in module.walk() if op.name == "gpu.func"][0]
    kernel.remove_attribute("function_type")
    with pytest.raises(mg.CompileError, match="outlined stage failed") as e:
        mg.compile_ptx(module)
    assert "requires attribute 'function_type'" in str(e.value)
    assert isinstance(e.value.__cause__, mg.MLIRError)


@pytest.mark.parametrize("thing", [None, "module {}", 42])
def test_compile_a_non_module(thing):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Module, not "):
        mg.compile_ptx(thing)


def test_compile_an_operation_instead_of_its_module(sgemm):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Module, not Operation"):
        mg.compile_ptx(sgemm.operation)


# --------------------------------------------------------------------------
# The fatal-error guard
# --------------------------------------------------------------------------

def test_llvm_fatal_error_becomes_compile_error():
    """A pipeline run directly (no chip check) that hands LLVM '+ptx60' for
    sm_90a: LLVM's fatal error must become a CompileError, and the process
    must go on compiling."""
    assert_isolated("""
        import mlirgpu as mg
        from mlirgpu import ir, passes
        from support.sgemm_ir import build_sgemm_module
        PIPELINE = ("builtin.module(gpu-lower-to-nvvm-pipeline{cubin-chip=sm_90a "
                    "cubin-features=+ptx60 cubin-format=isa})")
        with ir.Context():
            for attempt in range(2):
                module = build_sgemm_module(256, 128, 256)
                try:
                    passes.PassManager(PIPELINE).run(module)
                    print("no error")
                except mg.CompileError as error:
                    message = str(error)
                    assert "LLVM fatal error" in message, message
                    assert "PTX version 6.0 does not support target 'sm_90a'" in message, message
                    print("guarded", attempt)
                assert module.operation.is_valid
            ptx = mg.compile_ptx(build_sgemm_module(256, 128, 256), chip="sm_90a")
            assert ".target sm_90a" in ptx
            assert mg.compile_cubin(build_sgemm_module(64, 64, 64), chip="sm_80")[:4] == b"\\x7fELF"
            print("compiled again")
    """, "guarded 0\nguarded 1\ncompiled again")


def test_compile_unverified_module():
    """A gpu.launch without a body made gpu-kernel-outlining crash: the
    module must be verified before the first pass runs."""
    assert_isolated("""
        import mlirgpu as mg
        from mlirgpu import ir
        with ir.Context():
            module = ir.Module.parse(
                "module attributes {gpu.container_module} {\\n"
                "  func.func @host() {\\n    %c1 = arith.constant 1 : index\\n    return\\n  }\\n}")
            block = module.body.operations[0].regions[0].blocks[0]
            c1 = block.operations[0].result
            with ir.InsertionPoint.at_block_terminator(block):
                ir.Operation.create("gpu.launch", operands=[c1] * 6, regions=1, attributes={
                    "operandSegmentSizes": ir.Attribute.dense_i32_array([0, 1, 1, 1, 1, 1, 1, 0, 0, 0])})
            try:
                mg.compile_ptx(module)
                print("compiled")
            except mg.CompileError as error:
                print("CompileError", str(error).splitlines()[0])
    """, "CompileError")


def test_llvm_bitcode_to_text_rejects_garbage():
    """Bad bitcode must raise CompileError; LLVM's default diagnostic handler
    printed "error: Invalid bitcode signature" on fd 2 and exited the process."""
    proc = assert_isolated("""
        import mlirgpu as mg
        from mlirgpu.compiler.nvvm import llvm_bitcode_to_text
        try:
            llvm_bitcode_to_text(b"not bitcode at all")
            print("parsed")
        except mg.CompileError as error:
            print("CompileError", error)
    """, "CompileError not valid LLVM bitcode")
    assert proc.stderr == ""
