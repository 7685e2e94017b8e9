"""Lowering a module that holds gpu.module/gpu.func to PTX and cubin.

The lowering is an ordered list of named stages, each kept for inspection:

    gpu       the module as given
    outlined  nvgpu converted to nvvm, gpu.launch bodies outlined into gpu.func kernels,
              the NVVM target attached
    nvvm      device code in the NVVM and LLVM dialects
    llvm_ir   the LLVM IR that the NVPTX back end compiles
    ptx       PTX text
    cubin     the ELF that ptxas makes of it

The image a GPU loads is the cubin where ptxas is found (toolkit.py says
where), else the PTX, which the driver compiles as it loads it.

Chip and PTX features are checked here, before LLVM runs: LLVM aborts the
whole process on a PTX version that does not support the chip.

Each stage runs in an MLIR context of its own (the module passes between
stages as text with its locations) and without the GIL, so threads compile
in parallel.
"""
from __future__ import annotations

import linecache
import os
import re

from .. import _mlirgpu, ir
from . import toolkit
from .._mlirgpu import CompileError, MLIRError, llvm_bitcode_to_text, lower
from ..language import mma
from ..frontend.kernel import located_compile_error
from ..language.tma import GRID_CONSTANTS

__all__ = ["CHIPS", "Compilation", "Target", "compile_cubin", "compile_ptx"]

# Chip -> the lowest PTX ISA version (x10) that LLVM 22's NVPTX back end
# accepts for it. Default PTX is this version: the oldest that works loads on
# the most drivers.
CHIPS = {
    "sm_75": 63, "sm_80": 70, "sm_86": 71, "sm_87": 74, "sm_89": 78,
    "sm_90": 78, "sm_90a": 80, "sm_100": 86, "sm_100a": 86, "sm_120": 87, "sm_120a": 87,
}
# PTX ISA versions known to both LLVM 22 and the CUDA 13.0 ptxas.
PTX_VERSIONS = (63, 64, 65, 70, 71, 72, 73, 74, 75, 76, 77, 78, 80, 81, 82, 83, 84, 85, 86, 87, 88)
STAGES = ("gpu", "outlined", "nvvm", "llvm_ir", "ptx", "cubin")
# The toolkit of the ptxas in use (its bin/ptxas), else where one was looked for.
CUDA_HOME = toolkit.PTXAS.home if toolkit.PTXAS else os.environ.get("CUDA_HOME", _mlirgpu.CUDA_HOME)
NO_PTXAS = ("no ptxas to make a cubin: install the CUDA toolkit (or pip install nvidia-cuda-nvcc-cu12), "
            "or set CUDA_HOME to one; kernels meanwhile load as PTX, compiled by the driver (Compilation.image)")

# Line information: a debug-info scope for every llvm.func, from its operations' file:line
# locations, with only the line directives emitted. The PTX then carries .file/.loc (as nvcc's
# -lineinfo makes it) but not the ", debug" target, which would make ptxas compile for a debugger
# and change the SASS; ptxas -lineinfo keeps the lines in the cubin for profilers and
# compute-sanitizer.
LINEINFO_PASS = "ensure-debug-info-scope-on-llvm-func{emission-kind=DebugDirectivesOnly}"

# gpu.binary's #gpu.object formats (mlir::gpu::CompilationTarget).
_FORMAT_OFFLOAD, _FORMAT_ASSEMBLY, _FORMAT_BINARY = 1, 2, 3


class Target:
    """A validated NVVM target: chip, PTX features, optimisation level.

    For example::

        target = mg.Target("sm_90a", features="+ptx80", opt_level=3)
    """

    def __init__(self, chip: str = "sm_90a", features: str | None = None, opt_level: int = 3) -> None:
        if not isinstance(chip, str):
            raise CompileError(f"chip must be a str such as 'sm_90a', not {type(chip).__name__}")
        if chip not in CHIPS:
            raise CompileError(f"unknown or unsupported chip {chip!r}; supported: {', '.join(CHIPS)}")
        if features is None:
            ptx = CHIPS[chip]
        else:
            match = re.fullmatch(r"\+ptx(\d+)", features) if isinstance(features, str) else None
            if match is None:
                raise CompileError(f"features must look like '+ptx80', got {features!r}")
            ptx = int(match.group(1))
            if ptx not in PTX_VERSIONS:
                raise CompileError(f"unknown PTX version in {features!r}; known: "
                                   + ", ".join(f"+ptx{v}" for v in PTX_VERSIONS))
            if ptx < CHIPS[chip]:
                raise CompileError(f"{chip} needs PTX {CHIPS[chip] // 10}.{CHIPS[chip] % 10} or newer, "
                                   f"got {features!r}")
        if type(opt_level) is not int or opt_level not in (0, 1, 2, 3):
            raise CompileError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
        self.chip, self.ptx_version, self.opt_level = chip, ptx, opt_level
        self.features = f"+ptx{ptx}"

    def __repr__(self):
        return f"Target(chip={self.chip!r}, features={self.features!r}, opt_level={self.opt_level})"


def _check_module_targets(module):
    """Targets already attached in the IR reach LLVM too: check them."""
    for op in module.walk():
        if op.name != "gpu.module" or "targets" not in op.attributes:
            continue
        for target in op.get_attribute("targets").value:
            text = str(target)
            if not text.startswith("#nvvm.target"):
                raise CompileError(f"gpu.module has a non-NVVM target {text}")
            chip = re.search(r'chip = "([^"]*)"', text)
            features = re.search(r'features = "([^"]*)"', text)
            Target(chip.group(1) if chip else "sm_50", features.group(1) if features else None)


def _chip_number(chip):
    return int(re.match(r"sm_(\d+)", chip).group(1))


def _from(minimum):
    """(allows(chip), what it needs) for an operation of `minimum` and every later chip."""
    return (lambda chip: _chip_number(chip) >= _chip_number(minimum)), f"{minimum} or later"


def _only(*chips):
    """The same for operations of these chips only (the arch-specific sm_90a ones)."""
    return (lambda chip: chip in chips), " or ".join(chips)


# Operations a chip must have, checked before LLVM runs (its NVPTX back end
# aborts the process on an instruction the chip lacks): (operation name or
# prefix, the namespace that emits it, (allows(chip), what it needs)).
CHIP_OPERATIONS = tuple((name, "mg.mma", _from(chip)) for name, chip in mma.MIN_CHIP.items()) + (
    ("nvvm.wgmma.", "mg.wgmma", _only("sm_90a")),
    ("nvgpu.warpgroup.", "nvgpu warpgroup MMA", _only("sm_90a")),
    ("nvvm.setmaxregister", "mg.warpgroup.set_max_registers", _only("sm_90a", "sm_100a", "sm_120a")),
    ("nvvm.cp.async.bulk.", "mg.tma", _from("sm_90")),
    ("nvgpu.tma.", "nvgpu TMA", _from("sm_90")),
    ("nvvm.mbarrier.arrive.expect_tx", "mg.mbarrier", _from("sm_90")),
    ("nvvm.mbarrier.try_wait", "mg.mbarrier", _from("sm_90")),
    ("nvvm.fence.mbarrier.init", "mg.mbarrier", _from("sm_90")),
    ("nvvm.fence.proxy", "mg.tma", _from("sm_90")),
    ("nvvm.cluster.", "mg.warpgroup", _from("sm_90")),
    ("nvvm.read.ptx.sreg.cluster", "mg.warpgroup", _from("sm_90")),
)


def _check_chip_operations(module, chip):
    """Operations the chip lacks would reach LLVM, which aborts the process
    on them: a CompileError at the user's line of the first one instead."""
    for op in module.walk():
        for prefix, what, (allows, needs) in CHIP_OPERATIONS:
            if op.name.startswith(prefix) and not allows(chip):
                location = op.location
                where = f"{location.filename}:{location.line}: " if location.filename else ""
                source = linecache.getline(location.filename, location.line).strip() if location.filename else ""
                error = CompileError(f"{where}{op.name} ({what}) needs {needs}; this kernel is compiled for {chip}"
                                     + (f"\n    {source}" if source else ""))
                error.filename, error.lineno = location.filename, location.line
                raise error


_GRID_CONSTANT_ATTRS = "{llvm.align = 64 : i64, llvm.byval = !llvm.array<128 x i8>, nvvm.grid_constant}"


def _grid_constant_parameters(text, allow_unregistered):
    """Each llvm.func parameter listed in its GRID_CONSTANTS (the tensor maps
    a kernel takes by value, CUDA's __grid_constant__ const CUtensorMap) becomes a
    64-byte aligned, 128-byte byval grid constant: PTX `.param .align 64
    .b8 p[128]`, its address taken with cvta.param for TMA. `text` is a
    stage's module as lower() returns it; so is the result."""
    if GRID_CONSTANTS not in text:
        return text
    module = ir.Module.parse(text, context=ir.Context(allow_unregistered_dialects=allow_unregistered))
    for op in module.walk():
        if op.name != "llvm.func" or GRID_CONSTANTS not in op.attributes:
            continue
        listed = set(op.get_attribute(GRID_CONSTANTS).value)
        count = len(op.regions[0].blocks[0].arguments)
        attrs = ", ".join(_GRID_CONSTANT_ATTRS if i in listed else "{}" for i in range(count))
        op.set_attribute("arg_attrs", ir.Attribute.parse(f"[{attrs}]", context=module.context))
        op.remove_attribute(GRID_CONSTANTS)
    return module.print(generic=True, debug_info=True)


def _check_requirements(module, target, may_raise_ptx):
    """What the kernel's operations need of the chip and PTX version (the
    module's mg.min_sm and mg.min_ptx): a newer PTX version than the chip's
    default where features= was not given, else a CompileError."""
    attributes = module.operation.attributes
    if "mg.min_sm" in attributes:
        need = attributes["mg.min_sm"].value
        sm, what = need["version"].value, need["for"].value
        if int(re.match(r"sm_(\d+)", target.chip).group(1)) < sm:
            raise CompileError(f"{what} needs sm_{sm} or newer, not {target.chip}")
    if "mg.min_ptx" in attributes:
        need = attributes["mg.min_ptx"].value
        ptx, what = need["version"].value, need["for"].value
        if target.ptx_version < ptx:
            if not may_raise_ptx:
                raise CompileError(f"{what} needs PTX ISA {ptx // 10}.{ptx % 10}, but features={target.features!r}")
            target.ptx_version, target.features = ptx, f"+ptx{ptx}"


def lower_stage(source, stage, pipeline, hint="", *, objects=False):
    """`pipeline` run on a copy of `source` (an ir.Module, or the text a stage
    returned) in an MLIR context of its own, without the GIL: the lowered
    module as text with its locations, or with objects=True {gpu.binary name:
    bytes}. A failure is a CompileError naming the stage (and `hint`, what
    usually causes it), at the user's line where a diagnostic has one."""
    try:
        lowered = lower(source, pipeline, objects=objects)
    except MLIRError as error:
        located = located_compile_error(error)
        if getattr(located, "lineno", None) is None:
            raise CompileError(f"{stage} stage failed:\n{error}{hint}") from error
        # A diagnostic at a traced operation: its user's file:line and source line.
        new = CompileError(f"{located.filename}:{located.lineno}: {stage} stage failed:\n{located}{hint}")
        new.filename, new.lineno, new.diagnostics = located.filename, located.lineno, error.diagnostics
        raise new from error
    return {name: data for name, _, data in lowered} if objects else lowered


class _stage:
    """A stage computed on first access and kept on the instance. Unlike
    functools.cached_property before Python 3.12, it holds no lock shared by
    every instance, which would let only one thread compile at a time; two
    threads asking one Compilation for the same stage may both compute it."""

    def __init__(self, compute):
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


class Compilation:
    """Lowering of one module for one target, stage by stage.

    Each stage is computed on first access and kept: `gpu`, `outlined`,
    `nvvm` and `llvm_ir` are str, `ptx` is str, `cubin` bytes. With several
    gpu.modules, `objects(stage)` gives a dict by gpu.module name.

    `image` is what a GPU loads: the cubin, or where no ptxas was found the
    PTX (bytes) for the driver's JIT. `image_format` says which ("cubin" or
    "ptx") and `ptxas` names the ptxas used (None for the driver's JIT).

    `lineinfo=True` (the default) puts the source lines of the module's
    locations into the PTX (.file/.loc) and the cubin, for profilers and
    compute-sanitizer; it does not change the machine code.

    For example::

        stages = mg.Compilation(module, chip="sm_90a")
        print(stages.nvvm)
        ptx, cubin = stages.ptx, stages.cubin
    """

    def __init__(self, module: ir.Module, chip: str = "sm_90a", *, features: str | None = None, opt_level: int = 3,
                 bare_pointers: bool = True, lineinfo: bool = True) -> None:
        if not isinstance(module, ir.Module):
            raise TypeError(f"expected an mlirgpu.ir.Module, not {type(module).__name__}")
        self.target = Target(chip, features, opt_level)
        _check_requirements(module, self.target, features is None)
        _check_module_targets(module)
        _check_chip_operations(module, self.target.chip)
        self.bare_pointers = bool(bare_pointers)
        self._toolkit = toolkit.PTXAS
        self.ptxas = self._toolkit.ptxas if self._toolkit else None
        self.image_format = "cubin" if self._toolkit else "ptx"
        self.lineinfo = bool(lineinfo)
        self.gpu = str(module)
        self._allow_unregistered = module.context.allow_unregistered_dialects
        t = self.target
        # nvgpu is converted before outlining, as MLIR's gpu-lower-to-nvvm-pipeline
        # does: a TMA descriptor that a gpu.launch captures must already be an
        # !llvm.ptr when it becomes a kernel parameter, or gpu.func cannot be legalized.
        # The stages' modules, as text with their locations.
        self._outlined = lower_stage(module, "outlined", "builtin.module(convert-nvgpu-to-nvvm, "
                                     "gpu-kernel-outlining, "
                                     f"nvvm-attach-target{{chip={t.chip} features={t.features} O={t.opt_level}}})")
        bare = "true" if self.bare_pointers else "false"
        nvvm = lower_stage(self._outlined, "nvvm", ",".join([
            "builtin.module(convert-vector-to-scf", "convert-scf-to-cf",
            "convert-nvvm-to-llvm", "expand-strided-metadata", "lower-affine",
            "convert-arith-to-llvm", "convert-index-to-llvm", "canonicalize", "cse",
            f"gpu.module(convert-gpu-to-nvvm{{use-bare-ptr-memref-call-conv={bare}}}, "
            "canonicalize, cse, reconcile-unrealized-casts)", "convert-func-to-llvm", "reconcile-unrealized-casts"]
            + ([LINEINFO_PASS] if self.lineinfo else [])) + ")")
        self._nvvm = _grid_constant_parameters(nvvm, self._allow_unregistered)

    def _printed(self, text):
        context = ir.Context(allow_unregistered_dialects=self._allow_unregistered)
        return str(ir.Module.parse(text, context=context))

    @_stage
    def outlined(self) -> str:
        return self._printed(self._outlined)

    @_stage
    def nvvm(self) -> str:
        return self._printed(self._nvvm)

    def _binary(self, fmt, stage):
        # The toolkit gives ptxas and libdevice (nvvm/libdevice), which every
        # format links for the math functions; without one MLIR looks at
        # $CUDA_HOME, else links none.
        options = f" toolkit={self._toolkit.home}" if self._toolkit else ""
        if fmt == "bin" and self.lineinfo:
            options += " opts=-lineinfo"  # ptxas keeps the PTX's .loc lines in the cubin's line table
        objects = lower_stage(self._nvvm, stage, f"builtin.module(gpu-module-to-binary{{format={fmt}{options}}})",
                              objects=True)
        if not objects:
            raise CompileError("the module holds no gpu.module to compile")
        return objects

    @_stage
    def _llvm_ir(self):
        return {k: llvm_bitcode_to_text(v) for k, v in self._binary("llvm", "llvm_ir").items()}

    @_stage
    def _ptx(self):
        return {k: v.decode() for k, v in self._binary("isa", "ptx").items()}

    @_stage
    def _cubin(self):
        if self._toolkit is None:
            raise CompileError(NO_PTXAS)
        return self._binary("bin", "cubin")

    def objects(self, stage: str) -> dict[str, str | bytes]:
        """{gpu.module name: artifact} for 'llvm_ir', 'ptx' or 'cubin'."""
        if stage not in ("llvm_ir", "ptx", "cubin"):
            raise ValueError(f"objects() takes 'llvm_ir', 'ptx' or 'cubin', not {stage!r}")
        return getattr(self, "_" + stage)

    def _single(self, stage):
        objects = self.objects(stage)
        if len(objects) != 1:
            raise CompileError(f"the module holds {len(objects)} gpu.modules ({', '.join(objects)}); "
                               f"use Compilation.objects({stage!r})")
        return next(iter(objects.values()))

    llvm_ir = property(lambda self: self._single("llvm_ir"), doc="LLVM IR text of the device code.")
    ptx = property(lambda self: self._single("ptx"), doc="PTX text.")
    cubin = property(lambda self: self._single("cubin"), doc="cubin (ELF) bytes.")

    @property
    def image(self) -> bytes:
        """What a GPU loads: the cubin (bytes), else the PTX as bytes."""
        return self.cubin if self._toolkit else self.ptx.encode()

    def stage(self, name: str) -> str | bytes:
        """A stage by name, one of STAGES."""
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
        return getattr(self, name)


def compile_ptx(module: ir.Module, chip: str = "sm_90a", **options: str | int | bool | None) -> str:
    """PTX text of the module's only gpu.module. Needs no GPU.

    For example::

        ptx = mg.compile_ptx(mg.ir.Module.parse(text), chip="sm_90a")
    """
    return Compilation(module, chip, **options).ptx


def compile_cubin(module: ir.Module, chip: str = "sm_90a", **options: str | int | bool | None) -> bytes:
    """cubin bytes of the module's only gpu.module (needs ptxas: see mlirgpu.compiler.toolkit). Needs no GPU.

    For example::

        cubin = mg.compile_cubin(module, chip="sm_90a")
        kernel = mg.cuda.load_module(cubin).get_function("copy")
    """
    return Compilation(module, chip, **options).cubin
