"""@mg.kernel: Python functions traced into gpu.func, with reified generics.

    M, K, N, dtype = mg.generics("M K N dtype")

    @mg.kernel(generics=(M, K, N, dtype))
    def sgemm(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype]): ...

    sgemm[256, 128, 256, mg.f32]          # a Specialization: .ir(), .ptx(chip=), .cubin(chip=)
    sgemm(dA, dB, dC, grid=..., block=...)  # generics inferred from the arguments

A specialization gives each generic a concrete value: sizes become the
static shapes of the gpu.func's memrefs, a dtype generic their element type,
and inside the body the generic's name evaluates to its value (so
`range(K)` has a constant bound and `mg.constant(1.0, dtype)` a concrete type).
"""
from __future__ import annotations

import contextlib
import heapq
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _mlirgpu, cuda, ir
from .._mlirgpu import CompileError, DeviceArray, DType, Function, LaunchError, Stream, TensorMap
from ..frontend import rewrite as tracer
from ..frontend.kernel import trace_kernel
from ..language import core as lang
from ..language.generics import ALIGNMENT, Dynamic, Generic, MemRefType, as_element_type, is_symbol, symbol_name
from .backend import Dims, _kernels as _backend_kernels, current
from .compiled import CompiledModule, TracedGlobals, read_values, source_digest, stored_params
from .tracebacks import user_frames

if TYPE_CHECKING:
    from ..targets.gpu import GpuLowering

__all__ = ["kernel", "Kernel", "Specialization"]


_SCALAR_ANNOTATIONS = {int: lang.i32, float: lang.f32, bool: lang.bool_}
_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without asking

#: How many specializations of all kernels stay in memory with what they
#: traced and compiled (about 1.6 MB each on the CPU backend). Beyond it the
#: one least recently used (specialized, or launched from Python or from the
#: C dispatcher) is dropped: the next launch that needs it traces it again,
#: and compiles it again or, for a GPU, loads its image from the disk cache.
SPECIALIZATION_CACHE_SIZE = 1024
_resident = set()  # the Specializations held; each one's last_used (a Dispatcher's) orders them
_resident_lock = threading.Lock()  # threads specialize concurrently


class Parameter:
    def __init__(self, name, annotation):
        self.name = name
        annotation = as_element_type(annotation)
        if isinstance(annotation, MemRefType):
            self.memref, self.dtype = annotation, None
        elif annotation is TensorMap:
            self.memref, self.dtype = None, TensorMap
        elif annotation in _SCALAR_ANNOTATIONS:
            self.memref, self.dtype = None, _SCALAR_ANNOTATIONS[annotation]
        elif isinstance(annotation, DType) or is_symbol(annotation):
            self.memref, self.dtype = None, annotation
        else:
            raise CompileError(f"parameter {name!r} needs an annotation: mg.memref[...] for an array, a dtype "
                               f"(or a dtype generic, int, float, bool) for a scalar, mg.TensorMap for a "
                               f"tensor map; got {annotation!r}")

    def symbols(self):
        if self.memref is None and self.dtype is TensorMap:
            return []
        entries = (self.memref.shape + (self.memref.dtype,)) if self.memref else (self.dtype,)
        return [e for e in entries if is_symbol(e)]


class Kernel(_mlirgpu.Dispatcher):
    """What @mg.kernel makes: a Python function traced into a gpu.func per
    specialization (one per set of generic values).

    Calling it launches. The arguments' kinds, shapes and dtypes are looked up
    in C and a kernel compiled for them before launches at once; a new
    signature (or NumPy arguments, which are copied in and back) binds the
    generics, compiles the specialization and keeps it. On the CPU backend
    every call binds its arguments and runs through mlirgpu.cpu.

    For example::

        scale(x, 2.0, grid=4, block=256)        # launch: generics from the arguments
        spec = scale[1000]                       # the Specialization for N = 1000
        print(spec.ir(), spec.ptx(chip="sm_90a"))
    """

    def __new__(cls, function, generics=None, max_threads=None, min_blocks=None, fastmath=False,
                on_global_change=None):
        # The dispatcher's miss handler refers back to the kernel through a
        # cell: a reference cycle, which the GC collects.
        cell = []
        self = super().__new__(cls, user_frames(lambda args, kwargs: cell[0]._miss(args, kwargs)),
                               getattr(function, "__name__", "kernel"))
        cell.append(self)
        _backend_kernels.add(self)
        return self

    def __init__(self, function, generics=None, max_threads=None, min_blocks=None, fastmath=False,
                 on_global_change=None):
        if not inspect.isfunction(function):
            raise TypeError(f"@mg.kernel decorates a function, not {type(function).__name__}")
        for name, value in (("max_threads", max_threads), ("min_blocks", min_blocks)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"@mg.kernel({name}=...) takes a positive int, not {value!r}")
        if max_threads is not None and max_threads > 1024:
            raise ValueError(f"@mg.kernel(max_threads={max_threads}): a block holds at most 1024 threads")
        if min_blocks is not None and max_threads is None:
            raise ValueError("@mg.kernel(min_blocks=...) needs max_threads=... too, as __launch_bounds__ does")
        if not isinstance(fastmath, bool):
            raise ValueError(f"@mg.kernel(fastmath=...) takes True or False, not {fastmath!r}")
        self.max_threads, self.min_blocks, self.fastmath = max_threads, min_blocks, fastmath
        self.function = function
        self.traced_globals = TracedGlobals(function, on_global_change)
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__module__ = function.__module__
        self.__wrapped__ = function
        annotations = inspect.get_annotations(function, eval_str=True)
        signature = inspect.signature(function)
        for p in signature.parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty:
                raise CompileError(f"kernel parameter {p.name!r}: only plain positional parameters are supported")
        self.parameters = [Parameter(name, annotations.get(name)) for name in signature.parameters]
        declared = list(generics) if generics is not None else list(getattr(function, "__type_params__", ()))
        used = []
        for p in self.parameters:
            for s in p.symbols():
                if symbol_name(s) not in [symbol_name(u) for u in used]:
                    used.append(s)
        if generics is None and not declared:
            declared = sorted(used, key=lambda s: s.order if isinstance(s, Generic) else -1)
        for s in declared:
            if not is_symbol(s):
                raise CompileError(f"generics=... lists mg.generics symbols, not {s!r}")
        missing = [symbol_name(s) for s in used if symbol_name(s) not in [symbol_name(d) for d in declared]]
        if missing:
            raise CompileError(f"{function.__qualname__} uses generics {missing} that generics=... does not list")
        self.generics = [symbol_name(s) for s in declared]
        self.dynamic = _dynamic_generics(function, self.parameters, declared)
        self.__signature__ = signature.replace(parameters=list(signature.parameters.values()) + _LAUNCH_KEYWORDS)
        self.__doc__ = _launch_doc(self, function.__doc__)
        self._rewritten = None
        self._specializations, self._aligned_specializations = {}, {}
        # The C dispatcher's signatures leave out the dynamic extents: a new size is no miss.
        self.set_dynamic(self.dynamic_extents())

    def __repr__(self):
        return f"<mlirgpu kernel {self.__qualname__}[{', '.join(self.generics)}]>"

    # -- specializations -------------------------------------------------
    @user_frames
    def __getitem__(self, values: Any) -> Specialization:
        values = values if isinstance(values, tuple) else (values,)
        # kernel[blocks, threads](...) is how Numba launches; here brackets give generics.
        numba_style = (" (to launch, pass the launch shape as keywords: "
                       f"{self.__name__}(..., grid=blocks, block=threads))"
                       if any(isinstance(v, (tuple, list)) for v in values) or len(values) == 2 else "")
        if len(values) != len(self.generics):
            raise CompileError(f"{self.__qualname__} has {len(self.generics)} generics ({', '.join(self.generics)}), "
                               f"got {len(values)} values{numba_style}")
        if any(isinstance(v, (tuple, list)) for v in values):
            raise CompileError(f"{self.__qualname__}[...] takes one value per generic "
                               f"({', '.join(self.generics)}), not tuples{numba_style}")
        bound = {}
        for name, value in zip(self.generics, values):
            bound[name] = check_generic_value(name, value, self.dtype_generics())
        return self.specialize(bound)

    def dynamic_extents(self) -> list[list[int]]:
        """Per parameter, the dimensions annotated None or a dynamic generic (sizes known only at launch)."""
        return [[d for d, size in enumerate(p.memref.shape)
                 if size is None or (is_symbol(size) and symbol_name(size) in self.dynamic)]
                if p.memref else [] for p in self.parameters]

    def variants(self, bound: dict[str, Any]) -> dict[str, Any]:
        """`bound` with each dynamic generic's size replaced by the variant that serves it."""
        return {k: Dynamic.of(v) if k in self.dynamic and not isinstance(v, Dynamic) else v
                for k, v in bound.items()}

    def argument_generics(self) -> set[str]:
        """The generics the parameters' annotations name: those a launch binds from its arguments."""
        return {symbol_name(s) for p in self.parameters for s in p.symbols()}

    def dtype_generics(self) -> set[str]:
        names = set()
        for p in self.parameters:
            entry = p.memref.dtype if p.memref else p.dtype
            if is_symbol(entry):
                names.add(symbol_name(entry))
        return names

    def specialize(self, bound: dict[str, Any], aligned: bool = False) -> Specialization:
        """The specialization for the generic values `bound` (a dynamic
        generic's: a size, or a Dynamic variant). `aligned`: for a kernel with
        dynamic generics, the variant whose array arguments all start at a
        multiple of 16 bytes (only such arrays may launch it)."""
        bound = self.variants(bound)
        aligned = aligned and bool(self.dynamic)
        store = self._aligned_specializations if aligned else self._specializations
        key = tuple(bound[name] for name in self.generics)
        spec = store.get(key)
        if spec is None:
            spec = store[key] = Specialization(self, dict(bound), aligned)
        _keep_resident(spec)
        return spec

    def specialization_for(self, args: Sequence) -> Specialization:
        """The specialization that a call with `args` launches."""
        return self.specialize(self.bind(args), self.aligned(args))

    def launch_plan(self, args: list, params: Sequence[tuple], **launch: Any) -> tuple | None:
        """Specialization.launch_plan of the specialization that a call with `args` launches."""
        return self.specialization_for(args).launch_plan(args, params, **launch)

    def forget_specialization(self, spec: Specialization) -> None:
        """Drops `spec` (the specialization cache let go of it) and the launches
        the dispatcher registered, which may hold its loaded kernel."""
        store = self._aligned_specializations if spec.aligned else self._specializations
        key = tuple(spec.values[name] for name in self.generics)
        if store.get(key) is spec:
            del store[key]
        self.clear()

    def check_globals(self) -> None:
        """Forgets every specialization's traces where a global or closure value
        they read has changed since (or raises CompileError, as `on_global_change` says)."""
        self.traced_globals.check(self.forget_traces)

    def forget_traces(self) -> None:
        for spec in (*self._specializations.values(), *self._aligned_specializations.values()):
            spec.forget_traces()
        self.clear()

    def aligned(self, args: Sequence) -> bool:
        """Whether the array arguments among `args` all start at a multiple of
        16 bytes: the variant a kernel with dynamic generics launches for them."""
        return bool(self.dynamic) and all(_address(p.name, arg) % ALIGNMENT == 0
                                          for p, arg in zip(self.parameters, args) if p.memref is not None)

    def rewritten(self) -> tuple:
        if self._rewritten is None:
            self._rewritten = tracer.rewrite(self.function)
        return self._rewritten

    def source_digest(self) -> str:
        """sha256 of the kernel's source."""
        return source_digest(self.function)

    def read_values(self) -> dict[str, Any]:
        """The globals and closure variables the kernel's code names, except
        its generics: what a compile depends on besides the source."""
        return read_values(self.function)

    # -- launching -------------------------------------------------------
    def bind(self, args: Sequence, unbound: Iterable[str] = ()) -> dict[str, Any]:
        """The generic values the arguments imply; LaunchError on a mismatch.
        Generics named in `unbound` may stay unbound: mg.autotune's configs give them."""
        if len(args) != len(self.parameters):
            raise LaunchError(f"{self.__qualname__} takes {len(self.parameters)} arguments "
                              f"({', '.join(p.name for p in self.parameters)}), got {len(args)}")
        bound, source = {}, {}

        def bind_one(symbol, value, where):
            name = symbol_name(symbol)
            if name in bound and bound[name] != value:
                raise LaunchError(f"generic {name} is {show(bound[name])} from {source[name]} but "
                                  f"{show(value)} from {where}")
            bound[name], source[name] = value, where

        scalars = []
        for p, arg in zip(self.parameters, args):
            if p.dtype is TensorMap:
                if not isinstance(arg, TensorMap):
                    raise LaunchError(f"parameter {p.name!r} is a tensor map: pass one made by mg.tensor_map, "
                                      f"not {type(arg).__name__}")
            elif p.memref is None:
                scalars.append((p, arg))
            else:
                shape, dtype = _array_shape_dtype(p.name, arg)
                m = p.memref
                if len(shape) != len(m.shape):
                    raise LaunchError(f"parameter {p.name!r} is a {len(m.shape)}-d memref, got a "
                                      f"{len(shape)}-d array")
                for axis, (want, got) in enumerate(zip(m.shape, shape)):
                    if want is None:
                        continue  # a dynamic extent: any size
                    if is_symbol(want):
                        bind_one(want, got, f"{p.name}.shape[{axis}]")
                    elif want != got:
                        raise LaunchError(f"parameter {p.name!r} needs size {want} in dimension {axis}, got {got}")
                if is_symbol(m.dtype):
                    bind_one(m.dtype, dtype, f"{p.name}.dtype")
                elif m.dtype != dtype:
                    raise LaunchError(f"parameter {p.name!r} has element type {m.dtype.name}, got a "
                                      f"{dtype.name} array")
        for p, arg in scalars:  # after the arrays: they may bind a scalar's dtype generic
            _check_scalar(p, arg, bound, bind_one)
        missing = [g for g in self.generics if g not in bound and g not in unbound]
        if missing:
            raise LaunchError(f"the arguments do not determine the generics {missing}: give them explicitly, "
                              f"{self.__qualname__}[...]")
        return bound

    def _miss(self, args, kwargs):
        self.check_globals()
        guards = _c_guards(self, args)
        spec = self.specialization_for(args)
        if guards is not None:
            try:
                self.register(args, spec.function_for(args), guards, spec)  # its hits tick spec.last_used
            except ValueError:
                pass  # arguments the dispatcher cannot classify: this path serves them each time
        spec.launch(args, **kwargs)


def _keep_resident(spec):
    """Marks `spec` the most recently used; forgets the least recently used
    beyond SPECIALIZATION_CACHE_SIZE. A launch the C dispatcher serves ticks
    its specialization's last_used as touch() does, with no Python call."""
    spec.touch()
    with _resident_lock:
        if spec in _resident:
            return
        _resident.add(spec)
        evicted = heapq.nsmallest(len(_resident) - SPECIALIZATION_CACHE_SIZE, _resident,
                                  key=lambda s: s.last_used)
        _resident.difference_update(evicted)
    for old in evicted:
        old.kernel.forget_specialization(old)


def _c_guards(kernel, args):
    """The guards under which later calls like this one launch from C (the
    globals the kernel reads, as they are just after check_globals), or None
    where they may not: on a backend that launches from Python, for NumPy
    arguments, or where a global has no witness the dispatcher can compare."""
    if not current().dispatches_in_c or any(isinstance(a, np.ndarray) for a in args):
        return None
    return kernel.traced_globals.guards()


_LAUNCH_KEYWORDS = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
                    for name, default in (("grid", inspect.Parameter.empty), ("block", inspect.Parameter.empty),
                                          ("shared_mem", 0), ("stream", None), ("cluster", None))]


def _launch_doc(kernel, doc):
    """The kernel's own docstring, then how to launch and specialize it (what help() shows)."""
    params = ", ".join(p.name for p in kernel.parameters)
    name = kernel.__name__
    lines = [inspect.cleandoc(doc), ""] if doc else []
    lines += [f"An mlirgpu kernel. Launch it with one argument per parameter and the launch shape:",
              "",
              f"    {name}({params}, grid=(blocks_x, blocks_y, blocks_z), block=(threads_x, threads_y, threads_z),",
              f"    {' ' * len(name)} shared_mem=0, stream=None, cluster=None)",
              "",
              "grid and block take 1 to 3 ints; arrays are mg.DeviceArray, NumPy arrays (copied in and back),",
              "or objects with __cuda_array_interface__ or __dlpack__; scalars are Python or NumPy numbers.",
              "cluster=(x, y, z) launches thread-block clusters of that shape (on a GPU that has them)."]
    if kernel.generics:
        lines += ["", f"Generics ({', '.join(kernel.generics)}) are taken from the arguments' shapes and dtypes;",
                  f"{name}[{', '.join(kernel.generics)}] gives a specialization with .ir(), .ptx(), .cubin()."]
    return "\n".join(lines)


def show(value: Any) -> str:
    return value.name if isinstance(value, DType) else repr(value)


def _address(name, arg):
    """The address of an array argument's first element."""
    if isinstance(arg, DeviceArray):
        return arg.ptr
    if isinstance(arg, np.ndarray):
        return arg.ctypes.data
    host = current().host and not _offers(arg, "__cuda_array_interface__")
    try:
        return _mlirgpu.asarray(arg, host=host).ptr
    except (TypeError, ValueError) as error:
        raise LaunchError(f"parameter {name!r}: {error}") from None


def _dynamic_generics(function, parameters, declared):
    """{name: (parameter, dimension)} of each dynamic generic among `declared`:
    the first array extent it sizes, which a launch passes as its value."""
    where = {}
    for s in declared:
        if not (isinstance(s, Generic) and s.dynamic):
            continue
        for i, p in enumerate(parameters):
            if (p.memref.dtype if p.memref else p.dtype) is s:
                raise CompileError(f"{function.__qualname__}: dynamic generic {s.name} is a size, not an "
                                   f"element type")
            sizes = [d for d, size in enumerate(p.memref.shape) if size is s] if p.memref else []
            if sizes and s.name not in where:
                where[s.name] = (i, sizes[0])
        if s.name not in where:
            raise CompileError(f"{function.__qualname__}: dynamic generic {s.name} sizes no array parameter, "
                               f"so no launch could pass its value: use it in an mg.memref[...] annotation")
    return where


def check_generic_value(name: str, value: Any, dtype_generics: set[str]) -> int | DType:
    if name in dtype_generics:
        if not isinstance(value, DType):
            try:
                value = _mlirgpu.dtype(value)
            except (TypeError, ValueError):
                raise CompileError(f"generic {name} is an element type: give a dtype such as mg.f32, "
                                   f"not {value!r}") from None
        return value
    if isinstance(value, Dynamic):
        return value
    if isinstance(value, DType) or isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise CompileError(f"generic {name} is a size: give a positive int, not {value!r}")
    if value <= 0:
        raise CompileError(f"generic {name} must be positive, got {value}")
    return int(value)


def _offers(arg, name):
    """Whether `arg` has the attribute `name`, asked without running it where
    its class or instance dict holds it: a protocol's property may build a
    whole dict, or fail (or worse) on an array whose memory is gone. An
    object that makes attributes on demand (__getattr__) is asked."""
    kind = type(arg)
    if hasattr(kind, name) or name in getattr(arg, "__dict__", ()):
        return True
    return hasattr(kind, "__getattr__") and hasattr(arg, name)


def _array_shape_dtype(name, arg):
    """(shape, dtype) of an array argument, or LaunchError naming the parameter."""
    if isinstance(arg, DeviceArray):
        array = arg
    elif isinstance(arg, np.ndarray):
        if not arg.flags.writeable:
            # A NumPy argument is copied back after the launch: a read-only one would lose the kernel's writes.
            raise LaunchError(f"parameter {name!r} is a read-only NumPy array, which the launch could not copy "
                              f"the kernel's writes back into: pass a writeable array, or mg.to_device(...) of "
                              f"it for an input")
        try:
            return tuple(arg.shape), _mlirgpu.dtype(arg.dtype)
        except (TypeError, ValueError):
            raise LaunchError(f"parameter {name!r}: NumPy dtype {arg.dtype} has no mlirgpu dtype") from None
    elif _offers(arg, "__cuda_array_interface__") or _offers(arg, "__dlpack__"):
        # On the CPU backend a DLPack object (a CPU tensor) is read as host memory.
        host = current().host and not _offers(arg, "__cuda_array_interface__")
        try:
            array = _mlirgpu.asarray(arg, host=host)
        except (TypeError, ValueError) as error:
            raise LaunchError(f"parameter {name!r}: {error}") from None
    else:
        raise LaunchError(f"parameter {name!r} is an array: pass a DeviceArray, a NumPy array or an object with "
                          f"__cuda_array_interface__ or __dlpack__, not {type(arg).__name__}")
    if not array.is_c_contiguous:
        raise LaunchError(f"parameter {name!r} needs a C-contiguous array, got strides {array.strides}")
    return tuple(array.shape), array.dtype


def _on_device(device):
    """A scope where `device` (None: the thread's own) is the thread's device."""
    if device is None or device == cuda.current_device():
        return contextlib.nullcontext()
    return cuda.device(device)


def _array_device(name, arg):
    """The CUDA ordinal of a device array argument."""
    if isinstance(arg, DeviceArray):
        return arg.device
    try:
        return _mlirgpu.asarray(arg).device
    except (TypeError, ValueError) as error:
        raise LaunchError(f"parameter {name!r}: {error}") from None


def _any_readonly(args):
    """Whether a device array among `args` is read-only (JAX exports its
    arrays so): the kernel must then know which parameters it stores to."""
    for arg in args:
        if isinstance(arg, DeviceArray):
            if arg.readonly:
                return True
        elif not isinstance(arg, (np.ndarray, TensorMap)) and (
                _offers(arg, "__cuda_array_interface__") or _offers(arg, "__dlpack__")):
            try:
                if _mlirgpu.asarray(arg).readonly:
                    return True
            except (TypeError, ValueError):
                pass   # not an array the launch takes: it says so itself
    return False


def _check_scalar(p, arg, bound, bind_one):
    if isinstance(arg, (np.ndarray, DeviceArray)) or _offers(arg, "__cuda_array_interface__"):
        raise LaunchError(f"parameter {p.name!r} is a scalar, got an array")
    if isinstance(arg, np.generic):
        dtype = _mlirgpu.dtype(arg.dtype)
        if is_symbol(p.dtype):
            bind_one(p.dtype, dtype, f"{p.name} (a NumPy {arg.dtype} scalar)")
            return
        want = p.dtype
    elif isinstance(arg, (bool, int, float)):
        want = bound.get(symbol_name(p.dtype)) if is_symbol(p.dtype) else p.dtype
        if want is None:
            return  # bound by another parameter, or reported as missing
    else:
        raise LaunchError(f"parameter {p.name!r} is a scalar, got {type(arg).__name__}")
    if isinstance(arg, (float, np.floating)) and not lang.is_float(want):
        raise LaunchError(f"parameter {p.name!r} is {want.name}: a float argument ({arg!r}) would be truncated")
    if isinstance(arg, (int, np.integer)) and not isinstance(arg, (bool, np.bool_)) and lang.is_integer(want):
        lo, hi = lang.integer_range(want)
        if not lo <= int(arg) <= hi:
            raise LaunchError(f"parameter {p.name!r} is {want.name}: {int(arg)} is out of its range {lo}..{hi}")


@user_frames
def kernel(function: Callable | None = None, *, generics: Iterable | None = None, max_threads: int | None = None,
           min_blocks: int | None = None, fastmath: bool = False,
           on_global_change: str | None = None) -> Kernel | Callable[[Callable], Kernel]:
    """`@mg.kernel` or `@mg.kernel(generics=(M, K, N, dtype), max_threads=256, min_blocks=2, fastmath=True)`.

    A kernel reads the module globals and closure variables it names (and
    those its @mg.func helpers name) when it is traced; a launch after one of
    them changed (rebound, or a list or array changed in place) traces and
    compiles it again (`on_global_change="recompile"`, the default) or raises
    CompileError naming the global (`on_global_change="error"`). The
    environment variable MLIRGPU_GLOBALS=error|recompile sets the default.
    A launch checks them in C, on the same fast path as a kernel that reads
    none, except where a global is a dict, a list of anything but scalars
    (or of more than 512), or a NumPy array that is not C-contiguous or holds
    more than 4 KiB: the launches of such a kernel check in Python each time.

    `max_threads` and `min_blocks` are CUDA's `__launch_bounds__`: the most
    threads a launch's block may have (PTX `.maxntid`; a larger block is a
    LaunchError) and the blocks that should fit on one multiprocessor at once
    (`.minnctapersm`), which caps the registers ptxas may give a thread.

    `fastmath=True` gives the kernel's float arithmetic and mg.math calls
    MLIR's `fast` flags (nvcc's --use_fast_math): `exp`, `log`, `sin`, `cos`,
    `pow` and friends become the approximate hardware instructions
    (ex2.approx, lg2.approx, sin.approx, ...) and `/` an approximate division;
    on the CPU backend the same flags let LLVM reassociate.

    For example::

        N = mg.generics("N")

        @mg.kernel
        def scale(x: mg.memref[N, mg.f32], a: mg.f32):
            i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
            if i < N:
                x[i] = a * x[i]

        x = mg.to_device(np.ones(1000, np.float32))
        scale(x, 2.0, grid=4, block=256)
    """
    if function is None:
        return user_frames(lambda f: Kernel(f, generics, max_threads, min_blocks, fastmath, on_global_change))
    return Kernel(function, generics, max_threads, min_blocks, fastmath, on_global_change)


class Specialization(CompiledModule, _mlirgpu.Dispatcher):
    """A kernel with every generic given a value: its IR, PTX, cubin, and
    launches with arguments that must match it.

    Calling it launches through a C dispatcher of its own, as calling the
    kernel does: the first call with a signature checks the arguments
    against the specialization (`_miss`) and registers them; later calls
    with that signature launch from C. Dynamic extents are no part of the
    signature, as for the kernel.

    For example::

        spec = scale[1000]
        print(spec.ir())                       # the gpu dialect, with file:line locations
        ptx = spec.ptx(chip="sm_90a")          # needs no GPU
        spec(x, 2.0, grid=4, block=256)        # launch with arguments that match it
    """

    def __new__(cls, kernel, values, aligned=False):
        # The miss handler refers back through a cell: a cycle the GC collects (as Kernel's).
        cell = []
        self = _mlirgpu.Dispatcher.__new__(cls, user_frames(lambda args, kwargs: cell[0]._miss(args, kwargs)),
                                           kernel.function.__name__)
        cell.append(self)
        _backend_kernels.add(self)
        return self

    def __init__(self, kernel, values, aligned=False):
        super().__init__()
        self.kernel, self.values, self.aligned = kernel, values, aligned
        self._module = None
        self.set_dynamic(kernel.dynamic_extents())

    def __repr__(self):
        aligned = ", arrays 16-byte aligned" if self.aligned else ""
        return f"<{self.kernel.__qualname__}[{', '.join(f'{k}={show(v)}' for k, v in self.values.items())}]{aligned}>"

    @property
    def name(self) -> str:
        return self.kernel.function.__name__

    @property
    def source_function(self) -> Callable:
        return self.kernel.function

    @property
    def traced_globals(self) -> TracedGlobals:
        return self.kernel.traced_globals

    def check_globals(self) -> None:
        self.kernel.check_globals()

    def forget_traces(self) -> None:
        super().forget_traces()
        self._module = None
        for attribute in ("_cpu_modules", "_cpu_engines", "_cpu_stores"):
            self.__dict__.pop(attribute, None)
        self.clear()

    def gpu_module(self) -> ir.Module:
        return self.module()

    def module(self) -> ir.Module:
        """The traced module (gpu.module @kernels holding gpu.func @<name>)."""
        self.check_globals()
        if self._module is None:
            self._module = self.trace()
        return self._module

    def _param_types(self):
        result = []
        for p in self.kernel.parameters:
            if p.memref is not None:
                shape = [self.values[symbol_name(s)] if is_symbol(s) else s for s in p.memref.shape]
                shape = [None if isinstance(size, Dynamic) else size for size in shape]  # None: dynamic
                dtype = self.values[symbol_name(p.memref.dtype)] if is_symbol(p.memref.dtype) else p.memref.dtype
                result.append((p, shape, dtype))
            else:
                dtype = self.values[symbol_name(p.dtype)] if is_symbol(p.dtype) else p.dtype
                result.append((p, None, dtype))
        return result

    def trace(self, target: GpuLowering | None = None, name: str | None = None) -> ir.Module:
        """The kernel traced into a module for `target` (default: the GPU's
        gpu.module @kernels holding gpu.func @<name>), its function named
        `name` (default: the kernel's)."""
        kernel = self.kernel
        return trace_kernel(kernel.function, kernel.rewritten(), name or self.name,
                            [(p.name, shape, dtype) for p, shape, dtype in self._param_types()], self.values,
                            target=target, attributes=self._launch_bounds(), fastmath=kernel.fastmath,
                            qualifiers=[(p.memref.is_readonly, p.memref.is_noalias) if p.memref else (False, False)
                                        for p in kernel.parameters],
                            dynamic={name: (i, d, self.values[name].multiple)
                                     for name, (i, d) in kernel.dynamic.items()}, aligned=self.aligned)

    @user_frames
    def ir(self) -> str:
        """The gpu-dialect module, with the user's file:line locations."""
        return self.module().print(debug_info=True)

    def _launch_bounds(self):
        """The gpu.func's nvvm.maxntid / nvvm.minctasm: @mg.kernel's max_threads, min_blocks."""
        kernel, bounds = self.kernel, {}
        if kernel.max_threads is not None:
            bounds["nvvm.maxntid"] = ir.Attribute.dense_i32_array([kernel.max_threads, 1, 1])
        if kernel.min_blocks is not None:
            bounds["nvvm.minctasm"] = ir.Attribute.integer(kernel.min_blocks, ir.Type.integer(32))
        return bounds

    def cache_fields(self) -> tuple[str, str]:
        kernel = self.kernel
        return (",".join(f"{k}={show(v)}" for k, v in self.values.items()) + (",aligned=16" if self.aligned else ""),
                f"opt_level=3,bare_pointers=1,max_threads={kernel.max_threads},min_blocks={kernel.min_blocks},"
                f"fastmath={int(kernel.fastmath)}")

    def function_params(self) -> list:
        # An array with dynamic extents: its pointer, then those extents (the launch reads them off the
        # array); a tensor map: its 128 bytes, by value.
        return [("tensormap" if dtype is TensorMap else dtype) if shape is None else
                ("ptr", tuple(d for d, size in enumerate(shape) if size is None)) if None in shape else "ptr"
                for _, shape, dtype in self._param_types()]

    def stored_params(self) -> set[int]:
        return stored_params(self.module(), self.name)

    def function(self, exact_stores: bool = False) -> Function:
        """The kernel loaded on the current device, allowed all the dynamic
        shared memory the device gives a block: past 48 KB a kernel must opt
        in, and every launch, the C dispatcher's too, may ask for more."""
        device = cuda.current_device()
        fresh = (device, exact_stores) not in self._functions
        function = super().function(exact_stores)
        if fresh:
            optin = cuda.Device(device).shared_memory_per_block_optin
            if optin > _DEFAULT_SHARED_LIMIT:
                function.set_max_dynamic_shared_memory(optin - function.shared_size_bytes)
        return function

    def _miss(self, args, kwargs):
        """A call whose signature the dispatcher has not seen: check the
        arguments against the specialization, register them (on the GPU,
        device arrays only) and launch."""
        # Generics the arguments do not determine (tile sizes) take the specialization's values.
        bound = self.kernel.variants(self.kernel.bind(args, unbound=self.values))
        diff = [f"{k}={show(v)} (specialized for {show(self.values[k])})" for k, v in bound.items()
                if v != self.values[k]]
        if self.aligned and not self.kernel.aligned(args):
            diff.append("an array that does not start at a multiple of 16 bytes")
        if diff:
            raise LaunchError(f"the arguments do not match {self!r}: {', '.join(diff)}")
        unknown = set(kwargs) - {"grid", "block", "shared_mem", "stream", "cluster"}
        if unknown:
            raise TypeError(f"{self!r}: unknown launch keyword {sorted(unknown)[0]!r}")
        self.kernel.check_globals()
        self.touch()  # a use, as a hit of this dispatcher is
        guards = _c_guards(self.kernel, args)
        if guards is not None:
            try:
                self.register(args, self.function_for(args), guards)
            except ValueError:
                pass  # arguments the dispatcher cannot classify: this path serves them each time
        self.launch(args, **kwargs)

    def launch(self, args: list, grid: Dims | None = None, block: Dims | None = None, shared_mem: int = 0,
               stream: Stream | None = None, cluster: Dims | None = None) -> None:
        """Launches with arguments already checked against this specialization;
        `cluster=(x, y, z)` launches thread-block clusters of that shape."""
        if grid is None or block is None:
            raise LaunchError(f"launching {self.name} needs grid= and block=")
        current().launch(self, args, grid, block, shared_mem, stream, cluster)

    def max_cooperative_grid_blocks(self, block: Dims, shared_mem: int = 0) -> int:
        """The most blocks of `block` threads (an int or a tuple) with
        `shared_mem` bytes of dynamic shared memory that can run at once: the
        largest grid a launch of a kernel that calls mg.grid.sync() may have
        (CUDA's occupancy per multiprocessor times the multiprocessors of the
        current device; on the CPU backend, its limit of threads run at once).
        A persistent kernel sizes its grid with it::

            blocks = spec.max_cooperative_grid_blocks(256)
            spec(X, out, grid=blocks, block=256)
        """
        return current().max_cooperative_grid_blocks(self, block, shared_mem)

    @contextlib.contextmanager
    def loaded(self, args: list) -> Iterator[Function]:
        """The kernel loaded on the device of the array arguments `args`, that
        device the thread's current one until the with-block ends."""
        with _on_device(self._launch_device(args)):
            yield self.function(_any_readonly(args))

    def function_for(self, args: list) -> Function:
        """The kernel loaded on the device of the array arguments `args`."""
        with self.loaded(args) as function:
            return function

    def launch_plan(self, args: list, params: Sequence[tuple], **launch: Any) -> tuple | None:
        """(plan, guards, owner), what Dispatcher.register takes after a
        call's arguments: an mlirgpu.LaunchPlan of this kernel as loaded for
        `args` (arguments it was just launched with), its parameters given
        by `params` (LaunchPlan's entries) and `launch` (LaunchPlan's
        keywords); the guards under which a Dispatcher may run it (the
        globals its trace read, as they are now); and this specialization,
        whose last_used its runs tick. None where launches may not run from
        C (a backend that launches from Python)."""
        self.kernel.check_globals()
        guards = _c_guards(self.kernel, args)
        if guards is None:
            return None
        return _mlirgpu.LaunchPlan(self.function_for(args), tuple(params), **launch), guards, self

    def _launch_device(self, args):
        """The device the arrays among `args` live on (None: no device
        array, the thread's device), or LaunchError naming the parameters
        when they live on several."""
        devices = {}
        for (p, shape, _), arg in zip(self._param_types(), args):
            if shape is not None and not isinstance(arg, np.ndarray):
                devices.setdefault(_array_device(p.name, arg), []).append(p.name)
        if len(devices) > 1:
            where = "; ".join(f"{', '.join(map(repr, names))} on device {d}" for d, names in sorted(devices.items()))
            raise LaunchError(f"the array arguments of {self.name} live on different devices ({where}): "
                              f"copy them to one device first, e.g. with array.to(device)")
        return next(iter(devices), None)

