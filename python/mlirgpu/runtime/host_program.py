"""Host programs written in the gpu dialect: `mg.HostProgram`.

A module whose host functions (`func.func`) use `gpu.alloc` (`host_shared`
too), `gpu.memcpy`, `gpu.memset`, `gpu.dealloc`, `gpu.launch_func` (sync or
`async` on tokens, with clusters or not), `gpu.wait`, `gpu.host_register`,
`nvgpu.tma.create.descriptor`, `async.execute` and the runner utilities'
printing, next to the `gpu.module`s they launch, is lowered here and run by
MLIR's ExecutionEngine (csrc/host/engine.c) with mlirgpu's mgpu* runtime
(csrc/host/runtime.c) and runner utilities (csrc/host/runner_utils.c) underneath:

    prog = mg.HostProgram(text)                  # parsed, lowered, JIT-compiled: no GPU needed
    C = prog("test_parallel", A, B)              # NumPy arrays in, NumPy array(s) out
    C = prog.run("test_parallel", A, B, timeline=True)
    prog.timeline                                # [(kernel, stream, start_ms, end_ms), ...]

Stages, each kept for inspection: `gpu` (the module as given), `outlined` and
`nvvm` (compiler.Compilation's), `lowered` (host code in the llvm dialect,
kernels as a gpu.binary), `llvm_ir` (what the JIT compiles), `ptx` (the
    kernels). Programs written above the gpu dialect get there through
    `pipeline=`. docs/host_programs.md is the guide.
"""
import collections
import hashlib
import re
from functools import cached_property

import numpy as np

from .. import _mlirgpu, ir
from .._mlirgpu import CompileError, DeviceArray, LaunchError, MLIRError
from ..compiler import toolkit
from ..compiler.nvvm import NO_PTXAS, Compilation, lower_stage
from .compiled import default_chip
from .scalars import scalar_bytes

__all__ = ["HostProgram"]

# gpu-module-to-binary's format per `format=`: a cubin by the toolkit's ptxas,
# a fatbin (the cubin and its PTX) by ptxas and fatbinary (both loaded with
# mgpuModuleLoad), or PTX the driver compiles when it loads it (mgpuModuleLoadJIT).
FORMATS = {"cubin": "bin", "fatbin": "fatbin", "ptx": "isa"}

# MLIR's gpu-lower-to-nvvm-pipeline converts nvgpu ops (TMA descriptors
# captured by a gpu.launch among them) before it outlines kernels: in the
# other order they reach a gpu.func signature, which cannot be lowered.
PREPARE_PIPELINE = "builtin.module(convert-nvgpu-to-nvvm)"


def async_pipeline(host_bare_pointers, kernel_bare_pointers):
    """For programs that use the async dialect, the lowering after kernels are
    outlined, in the order of MLIR's own async GPU tests: gpu ops inside
    async.execute become async on streams of their own (gpu-async-region) and
    are lowered to the mgpu* runtime (gpu-to-llvm) before async.execute is
    lowered to coroutines over the async runtime (mlirgpu provides it)."""
    options = (f"use-bare-pointers-for-host={str(host_bare_pointers).lower()} "
               f"use-bare-pointers-for-kernels={str(kernel_bare_pointers).lower()}")
    return ("builtin.module(convert-vector-to-scf, convert-scf-to-cf, convert-nvvm-to-llvm, expand-strided-metadata, "
            "lower-affine, gpu.module(convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv="
            f"{str(kernel_bare_pointers).lower()}}}, canonicalize, cse, reconcile-unrealized-casts), "
            f"func.func(gpu-async-region), gpu-to-llvm{{{options}}}, reconcile-unrealized-casts, "
            "async-to-async-runtime, async-runtime-ref-counting, convert-async-to-llvm, convert-func-to-llvm, "
            "convert-arith-to-llvm, convert-index-to-llvm, convert-math-to-llvm, convert-math-to-libm, "
            "convert-cf-to-llvm, finalize-memref-to-llvm, reconcile-unrealized-casts)")


def host_pipeline(host_bare_pointers, kernel_bare_pointers):
    """The host half of MLIR's gpu-lower-to-nvvm-pipeline, after Compilation's
    nvvm stage: math the host uses (intrinsics, else libm), then every gpu op
    to calls of the mgpu* runtime."""
    options = (f"use-bare-pointers-for-host={str(host_bare_pointers).lower()} "
               f"use-bare-pointers-for-kernels={str(kernel_bare_pointers).lower()}")
    return (f"builtin.module(convert-math-to-llvm, convert-math-to-libm, gpu-to-llvm{{{options}}}, "
            "reconcile-unrealized-casts)")


ASYNC_HINT = ("\n(gpu-to-llvm lowers gpu.alloc, gpu.memcpy, gpu.memset and gpu.dealloc only when they are `async` "
              "with exactly one dependency, e.g. `%t1 = gpu.memcpy async [%t0] ...`; host_shared allocations "
              "are the exception: they take no dependency; gpu.memset takes 16- and 32-bit elements only)")

# The runtime functions MLIR 22's GPU lowering can call that mlirgpu does not
# provide, by the operation that calls them: the sparse linear algebra of
# cuSPARSE and cuSPARSELt, and a default device set from inside a program.
UNSUPPORTED = {
    "mgpuSetDefaultDevice": "gpu.set_default_device",
    "mgpuCreateDnVec": "gpu.create_dn_tensor", "mgpuCreateDnMat": "gpu.create_dn_tensor",
    "mgpuCreateCuSparseLtDnMat": "gpu.create_dn_tensor",
    "mgpuDestroyDnVec": "gpu.destroy_dn_tensor", "mgpuDestroyDnMat": "gpu.destroy_dn_tensor",
    "mgpuCreateCoo": "gpu.create_coo", "mgpuCreateCooAoS": "gpu.create_coo_aos", "mgpuCreateCsr": "gpu.create_csr",
    "mgpuCreateCsc": "gpu.create_csc", "mgpuCreateBsr": "gpu.create_bsr",
    "mgpuCusparseLtCreate2To4SpMat": "gpu.create_2to4_spmat",
    "mgpuDestroySpMat": "gpu.destroy_sp_mat", "mgpuDestroyCuSparseLtSpMat": "gpu.destroy_sp_mat",
    "mgpuSpMVBufferSize": "gpu.spmv_buffer_size", "mgpuSpMV": "gpu.spmv",
    "mgpuSpMMBufferSize": "gpu.spmm_buffer_size", "mgpuCuSparseLtSpMMBufferSize": "gpu.spmm_buffer_size",
    "mgpuSpMM": "gpu.spmm", "mgpuCuSparseLtSpMM": "gpu.spmm",
    "mgpuSDDMMBufferSize": "gpu.sddmm_buffer_size", "mgpuSDDMM": "gpu.sddmm",
    "mgpuSpGEMMCreateDescr": "gpu.spgemm_create_descr", "mgpuSpGEMMDestroyDescr": "gpu.spgemm_destroy_descr",
    "mgpuSpGEMMWorkEstimation": "gpu.spgemm_work_estimation_or_compute",
    "mgpuSpGEMMCompute": "gpu.spgemm_work_estimation_or_compute",
    "mgpuSpGEMMCopy": "gpu.spgemm_copy", "mgpuSpMatGetSize": "gpu.spmat_get_size",
    "mgpuSetCsrPointers": "gpu.set_csr_pointers",
}

_STRIDED = re.compile(r"strided<\[([^\]]*)\](?:, offset: (\?|-?\d+))?>")


# The engine's function that a host loop calls at the top of each iteration
# (csrc/host/engine.h): Ctrl-C stops a call there with KeyboardInterrupt.
POLL = "mg_host_poll"


def _poll_loops(module):
    """A call of POLL at the top of each loop body of the host functions, but
    inside async.execute (whose body may run on a thread of the runtime) and
    gpu.launch (a kernel, which has no POLL): of scf and affine loops, and of
    every block a branch reaches (a loop of cf.br goes through one: an entry
    block has no predecessor)."""
    bodies = []
    for function in module.body.operations:
        if function.name != "func.func":
            continue
        for op in function.walk():
            if op.name in ("async.execute", "gpu.launch") or _inside(op, ("async.execute", "gpu.launch")):
                continue
            if op.name in ("scf.for", "scf.while", "affine.for"):
                bodies.append(op.regions[1 if op.name == "scf.while" else 0].blocks[0])
            for region in op.regions:
                bodies.extend(list(region.blocks)[1:])
    if not bodies:
        return
    context = module.context
    with ir.InsertionPoint(module.body):
        ir.Operation.create("func.func", regions=1, location=ir.Location.unknown(context=context), attributes={
            "sym_name": ir.Attribute.string(POLL, context=context),
            "function_type": ir.Attribute.type_attr(ir.Type.function([], [], context=context)),
            "sym_visibility": ir.Attribute.string("private", context=context)})
    for block in bodies:
        with ir.InsertionPoint.at_block_begin(block):
            ir.Operation.create("func.call", location=block.owner.location, attributes={
                "callee": ir.Attribute.symbol_ref(POLL, context=context)})


def _inside(op, names):
    """Whether an operation named in `names` holds `op`."""
    parent = op.parent
    while parent is not None and parent.name not in names:
        parent = parent.parent
    return parent is not None


def _check_lowered(module):
    """gpu-to-llvm converts partially: what it could not convert is an error
    here, before the translation to LLVM IR reports it as a cast it cannot
    translate."""
    left = [op for op in module.walk()
            if op.name not in ("builtin.module", "gpu.binary", "gpu.launch_func") and not op.name.startswith("llvm.")]
    # The casts left are those feeding the operation that stayed: name that one.
    left.sort(key=lambda op: op.name == "builtin.unrealized_conversion_cast")
    if left:
        op = left[0]
        raise CompileError(f"host stage failed: {op.location}: '{op.name}' was not lowered to the llvm "
                           f"dialect{ASYNC_HINT if op.name.startswith('gpu.') else ''}")


def _check_runtime(lowered, module):
    """Every mgpu* function the lowered host code calls must be one the
    runtime provides: else a CompileError naming the operation that needs it."""
    provided = set(_mlirgpu.runtime_functions())
    for op in lowered.body.operations:
        if op.name != "llvm.func" or op.regions[0].blocks:
            continue
        symbol = op.get_attribute("sym_name").value
        if not symbol.startswith("mgpu") or symbol in provided:
            continue
        needs = UNSUPPORTED.get(symbol)
        where = next((f"{user.location}: " for user in module.walk() if user.name == needs), "")
        raise CompileError(f"{where}'{needs or 'an operation'}' needs the GPU runtime function {symbol}, which "
                           "mlirgpu does not provide")


def _dtype(element_type):
    """The mlirgpu dtype of an MLIR element type, or None."""
    name = str(element_type)
    match = re.fullmatch(r"(u|s)?i(\d+)", name)
    if match:
        sign, bits = match.groups()
        name = "bool" if bits == "1" and sign is None else f"{'u' if sign == 'u' else 'i'}{bits}"
    try:
        return _mlirgpu.dtype(name)
    except (TypeError, ValueError):
        return None


class _MemRefSignature:
    """A memref parameter or result: rank, static sizes (None where dynamic),
    dtype, and what its layout lets a descriptor carry."""

    def __init__(self, type_, dtype):
        self.shape = type_.shape
        self.dtype = dtype
        self.text = str(type_)
        self.strides = None      # identity layout: C-contiguous only
        self.unsupported = None
        layout = self.text[self.text.index("<") + 1:-1].split(", ", 1)
        if len(layout) == 2 and not re.fullmatch(r"\d+|#gpu\.address_space<\w+>", layout[1]):
            match = _STRIDED.match(layout[1])
            if match is None:
                self.unsupported = f"{self.text}: only identity and strided layouts can be passed"
            else:
                self.strides = tuple(None if s.strip() == "?" else int(s)
                                     for s in match.group(1).split(",") if s.strip())
                if match.group(2) not in (None, "?", "0"):
                    self.unsupported = f"{self.text}: a static offset other than 0 cannot be passed"

    def fits(self, shape, strides, itemsize):
        """Whether an array of `shape` and byte `strides` is this memref as it is."""
        if 0 in shape:
            return True   # no element: any strides describe it (NumPy may give an empty array zeros)
        if any(s % itemsize for s in strides):
            return False
        if self.strides is None:
            expected = itemsize
            for size, stride in zip(reversed(shape), reversed(strides)):
                if size > 1 and stride != expected:
                    return False
                expected *= size
            return True
        return all(want is None or size <= 1 or want * itemsize == stride
                   for want, size, stride in zip(self.strides, shape, strides))


class _Scalar:
    def __init__(self, dtype):
        self.dtype = dtype


class _Function:
    """A public host func.func: what each parameter takes, what comes back."""

    def __init__(self, name, function_type):
        self.name = name
        self.params, self.results, self.unsupported = [], [], None
        for kind, types in (("parameter", function_type.inputs), ("result", function_type.results)):
            for i, t in enumerate(types):
                described = self._describe(t)
                if isinstance(described, str):
                    self.unsupported = self.unsupported or f"{kind} {i} of @{name} is {described}"
                (self.params if kind == "parameter" else self.results).append(described)

    @staticmethod
    def _describe(t):
        element = t.element_type if t.is_memref else t
        dtype = _dtype(element)
        if dtype is None or not (t.is_memref or t.is_integer or t.is_index or t.is_float):
            return f"{t}, which host programs cannot pass"
        if not t.is_memref:
            return _Scalar(dtype)
        memref = _MemRefSignature(t, dtype)
        return memref.unsupported or memref

    def results_spec(self):
        return [("memref", len(r.shape), r.dtype) if isinstance(r, _MemRefSignature) else ("scalar", r.dtype)
                for r in self.results]


class HostProgram:
    """A module of host functions in the gpu dialect, lowered and JIT-compiled.

    HostProgram(program, chip=None, *, format=None, opt_level=2,
    pipeline=None, ptxas_options=None, kernel_bare_pointers=False,
    host_bare_pointers=False): `program` is MLIR text or an
    mlirgpu.ir.Module (cloned, never changed). `chip` defaults to the current
    GPU's, else sm_90a. `format` is "cubin" (by ptxas: see
    mlirgpu.compiler.toolkit), "fatbin" (the cubin with its PTX) or "ptx"
    (the driver compiles the PTX when the program first launches a kernel);
    the default is "cubin" where ptxas is found, else "ptx". `opt_level` is
    the host JIT's (0..3). `pipeline` is a pass pipeline (text) run first,
    for programs written above the gpu dialect (linalg to parallel loops to
    gpu.launch, transform schedules). `ptxas_options` (a string) go to
    ptxas. The bare-pointer options are mlir-opt's
    host-bare-ptr-calling-convention and kernel-bare-ptr-calling-convention
    (kernels then take static shapes only).

    Everything is compiled here and needs no GPU: bad text or a module that
    does not verify raise MLIRError; a failing lowering stage raises
    CompileError naming the stage. Call the program with a host function's
    name and its arguments: `prog(name, *args)` or `prog.run(name, *args,
    timeline=False)`.

    For example::

        prog = mg.HostProgram(text)                 # MLIR text with host functions and gpu.modules
        C = prog("matmul_twice", A, B)              # NumPy arrays in, NumPy array out
        C = prog.run("matmul_twice", A, B, timeline=True)
        print(prog.timeline)                        # [(kernel, stream, start_ms, end_ms), ...]
    """

    def __init__(self, program, chip=None, *, format=None, opt_level=2, pipeline=None, ptxas_options=None,
                 kernel_bare_pointers=False, host_bare_pointers=False):
        if format is None:
            format = "cubin" if toolkit.PTXAS else "ptx"
        if format not in FORMATS:
            raise ValueError(f"format must be one of {tuple(FORMATS)}, not {format!r}")
        if pipeline is not None and not isinstance(pipeline, str):
            raise TypeError(f"pipeline must be a pass pipeline (str), not {type(pipeline).__name__}")
        if ptxas_options is not None and (not isinstance(ptxas_options, str) or any(c in ptxas_options for c in '"{}')):
            raise ValueError(f"ptxas_options must be a string of options without quotes or braces, "
                             f"not {ptxas_options!r}")
        if ptxas_options and format == "ptx":
            raise ValueError("ptxas_options need format='cubin' or 'fatbin' (with 'ptx' the driver compiles)")
        if format != "ptx" and toolkit.PTXAS is None:
            raise CompileError(NO_PTXAS)
        if isinstance(program, str):
            module = ir.Module.parse(program)
        elif isinstance(program, ir.Module):
            module = program.clone()
        else:
            raise TypeError(f"expected MLIR text or an mlirgpu.ir.Module, not {type(program).__name__}")
        module.verify()
        self.gpu = str(module)
        self.format = format
        self.timeline = None
        # Each stage runs on a copy of the module in an MLIR context of its own, without the GIL
        # (see compiler.nvvm); what the next steps look at is parsed back into the module's context.
        if pipeline:
            module = ir.Module.parse(lower_stage(module, "pipeline", pipeline), context=module.context)
        # A transform script (run by the pipeline's transform-interpreter) is not part of the program.
        for op in module.body.operations:
            if op.name.startswith("transform."):
                op.erase()
        module = ir.Module.parse(lower_stage(module, "prepare", PREPARE_PIPELINE), context=module.context)
        _poll_loops(module)
        self._functions = {}
        for op in module.body.operations:
            if op.name != "func.func" or not op.regions[0].blocks:
                continue
            visibility = op.attributes.get("sym_visibility")
            if visibility is not None and visibility.value != "public":
                continue
            name = op.get_attribute("sym_name").value
            self._functions[name] = _Function(name, op.get_attribute("function_type").value)
            op.set_attribute("llvm.emit_c_interface", ir.Attribute.unit(context=module.context))
        # Kernels take memref descriptors unless asked otherwise: dynamic shapes
        # and strided layouts reach them as the host code has them.
        self.compilation = Compilation(module, chip or default_chip(), bare_pointers=kernel_bare_pointers)
        if any(op.name.startswith("async.") for op in module.walk()):
            host = lower_stage(self.compilation._outlined, "host",
                               async_pipeline(host_bare_pointers, kernel_bare_pointers))
        else:
            host = lower_stage(self.compilation._nvvm, "host", host_pipeline(host_bare_pointers, kernel_bare_pointers),
                               ASYNC_HINT)
        options = f"format={FORMATS[format]}"
        if toolkit.PTXAS:
            # ptxas, and libdevice (nvvm/libdevice) for the math functions, which every format links.
            options += f" toolkit={toolkit.PTXAS.home}"
        if ptxas_options:
            options += f' opts="{ptxas_options}"'
        lowered = ir.Module.parse(lower_stage(host, "binary", f"builtin.module(gpu-module-to-binary{{{options}}})"),
                                  context=module.context)
        _check_lowered(lowered)
        _check_runtime(lowered, module)
        self._lowered = lowered
        self.engine = _engine((self.gpu, self.chip, format, opt_level, pipeline, ptxas_options,
                               kernel_bare_pointers, host_bare_pointers), lowered, opt_level)

    @property
    def chip(self):
        return self.compilation.target.chip

    @property
    def compiler_log(self):
        """With format="ptx": what the driver's JIT reported compiling the
        kernels (registers, spills, shared memory per kernel), once a call
        loaded them; '' before. A cubin's ptxas log is not kept (ptxas_options
        with "-v" has no log to show): use format="ptx" to read one."""
        return self.engine.compiler_log

    @property
    def functions(self):
        """Names of the host functions a call can name."""
        return tuple(self._functions)

    @property
    def outlined(self):
        return self.compilation.outlined

    @property
    def nvvm(self):
        return self.compilation.nvvm

    @cached_property
    def lowered(self):
        """The host code in the llvm dialect, the kernels as gpu.binary: what the JIT translates."""
        return str(self._lowered)

    @cached_property
    def llvm_ir(self):
        """The host code's LLVM IR: it declares the mgpu* functions it calls."""
        return _mlirgpu.translate_to_llvm_ir(self._lowered)

    @property
    def ptx(self):
        """PTX of the program's one gpu.module (`compilation.objects("ptx")` for several)."""
        return self.compilation.ptx

    def __call__(self, name, *args):
        return self.run(name, *args)

    def run(self, name, *args, timeline=False):
        """Calls the host function `name`. Memref parameters take NumPy arrays
        (dtype, rank and static sizes must match) or DeviceArrays; scalar
        parameters take Python or NumPy scalars. Returns None, a NumPy array
        or scalar, or a tuple of them for several results. With timeline=True,
        `self.timeline` lists each kernel launch as (kernel, stream, start_ms,
        end_ms) from the earliest start."""
        function = self._functions.get(name)
        if function is None:
            raise LaunchError(f"the program has no public host function @{name} "
                              f"(it has: {', '.join(self._functions) or 'none'})")
        if function.unsupported:
            raise LaunchError(function.unsupported)
        if len(args) != len(function.params):
            raise LaunchError(f"@{name} takes {len(function.params)} arguments, got {len(args)}")
        packed, copies, on_device = [], [], False
        for i, (param, arg) in enumerate(zip(function.params, args)):
            if isinstance(param, _Scalar):
                packed.append(scalar_bytes(f"argument {i} of @{name} ({param.dtype.name})", param.dtype, arg))
                continue
            value = _memref_argument(name, i, param, arg, copies)
            on_device |= isinstance(value, DeviceArray) and not value.is_host
            packed.append(value)
        if on_device:
            # The program's streams are non-blocking: work queued on the
            # arrays' streams must be done before its copies read them.
            _mlirgpu.synchronize()
        record = [] if timeline else None
        out = self.engine.invoke(name, packed, function.results_spec(), timeline=record)
        for original, copy in copies:
            np.copyto(original, copy)
        if timeline:
            self.timeline = record
        if not function.results:
            return None
        return out[0] if len(out) == 1 else out

    def __repr__(self):
        return f"<mlirgpu.HostProgram functions={self.functions} chip={self.chip!r}>"


#: How many engines of host programs are kept for programs built again from
#: the same text, the most recently used first: each holds its JIT'd code
#: (about 1.5 MB). An engine no program uses and this cache has let go of is
#: torn down.
ENGINE_CACHE_SIZE = 8
# Keyed by the verified input and the build options, not the lowered module,
# whose gpu.object carries the compile's own timings and so differs every build.
_engines = collections.OrderedDict()


def _engine(source, lowered, opt_level):
    """The engine for `lowered`, shared by every build of `source` (the input
    text, chip and build options, which determine `lowered`)."""
    key = hashlib.sha256(repr(source).encode()).hexdigest()
    engine = _engines.get(key)
    if engine is None:
        engine = _engines[key] = _mlirgpu.ExecutionEngine(lowered, opt_level=opt_level, runtime=True)
        while len(_engines) > ENGINE_CACHE_SIZE:
            _engines.popitem(last=False)
    _engines.move_to_end(key)
    return engine


def _memref_argument(name, i, param, arg, copies):
    where = f"argument {i} of @{name} ({param.text})"
    if isinstance(arg, DeviceArray):
        shape, strides, dtype = arg.shape, arg.strides, arg.dtype
    elif isinstance(arg, np.ndarray):
        shape, strides = arg.shape, arg.strides
        try:
            dtype = _mlirgpu.dtype(arg.dtype)
        except (TypeError, ValueError):
            dtype = None
    else:
        raise LaunchError(f"{where}: expected a numpy.ndarray or an mlirgpu.DeviceArray, "
                          f"not {type(arg).__name__}")
    if dtype is None or dtype != param.dtype:
        raise LaunchError(f"{where}: expected elements of {param.dtype.name}, got {arg.dtype}")
    if len(shape) != len(param.shape) or any(want is not None and want != size
                                             for want, size in zip(param.shape, shape)):
        wanted = "x".join("?" if s is None else str(s) for s in param.shape) or "rank 0"
        raise LaunchError(f"{where}: expected shape {wanted}, got {tuple(shape)}")
    itemsize = param.dtype.itemsize
    if param.fits(shape, strides, itemsize) and (not isinstance(arg, np.ndarray) or arg.flags.aligned):
        return arg
    if isinstance(arg, np.ndarray):
        # What the layout cannot describe runs on a C-contiguous copy, copied back after the call.
        copy = np.ascontiguousarray(arg)
        if param.fits(copy.shape, copy.strides, itemsize):
            if arg.flags.writeable:
                copies.append((arg, copy))
            return copy
    raise LaunchError(f"{where}: strides {tuple(strides)} (bytes) do not fit its layout")
