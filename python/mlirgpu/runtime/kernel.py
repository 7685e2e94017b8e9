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
import inspect

import numpy as np

from .. import _mlirgpu, ir
from .._mlirgpu import CompileError, DeviceArray, DType, LaunchError, TensorMap
from ..frontend import rewrite as tracer
from ..frontend.kernel import trace_kernel
from ..language import core as lang
from ..language.generics import Generic, MemRefType, is_symbol, symbol_name
from . import cpu
from .backend import _kernels as _backend_kernels, on_cpu
from .compiled import CompiledModule, read_values, source_digest

__all__ = ["kernel", "Kernel", "Specialization"]


_SCALAR_ANNOTATIONS = {int: lang.i32, float: lang.f32, bool: lang.bool_}
_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without asking


class Parameter:
    def __init__(self, name, annotation):
        self.name = name
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
    """A Python function traced into a gpu.func per specialization.

    Calling it launches: the C dispatcher it is reads the arguments' types,
    shapes and dtypes, finds the loaded kernel of that signature and launches
    it; only a signature it has not seen (or NumPy arguments, which are copied
    in and back) comes to `_miss`, which binds the generics, compiles and
    registers the specialization. On the CPU backend nothing is registered
    (host arrays never take the C fast path): every call comes to `_miss`,
    which runs it through mlirgpu.cpu."""

    def __new__(cls, function, generics=None, max_threads=None, min_blocks=None):
        # The dispatcher's miss handler refers back to the kernel through a
        # cell: a reference cycle, which the GC collects.
        cell = []
        self = super().__new__(cls, lambda args, kwargs: cell[0]._miss(args, kwargs),
                               getattr(function, "__name__", "kernel"))
        cell.append(self)
        _backend_kernels.add(self)
        return self

    def __init__(self, function, generics=None, max_threads=None, min_blocks=None):
        if not inspect.isfunction(function):
            raise TypeError(f"@mg.kernel decorates a function, not {type(function).__name__}")
        for name, value in (("max_threads", max_threads), ("min_blocks", min_blocks)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"@mg.kernel({name}=...) takes a positive int, not {value!r}")
        if max_threads is not None and max_threads > 1024:
            raise ValueError(f"@mg.kernel(max_threads={max_threads}): a block holds at most 1024 threads")
        if min_blocks is not None and max_threads is None:
            raise ValueError("@mg.kernel(min_blocks=...) needs max_threads=... too, as __launch_bounds__ does")
        self.max_threads, self.min_blocks = max_threads, min_blocks
        self.function = function
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__doc__ = function.__doc__
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
        self._rewritten = None
        self._specializations = {}

    def __repr__(self):
        return f"<mlirgpu kernel {self.__qualname__}[{', '.join(self.generics)}]>"

    # -- specializations -------------------------------------------------
    def __getitem__(self, values):
        values = values if isinstance(values, tuple) else (values,)
        if len(values) != len(self.generics):
            raise CompileError(f"{self.__qualname__} has {len(self.generics)} generics ({', '.join(self.generics)}), "
                               f"got {len(values)} values")
        bound = {}
        for name, value in zip(self.generics, values):
            bound[name] = check_generic_value(name, value, self.dtype_generics())
        return self.specialize(bound)

    def argument_generics(self):
        """The generics the parameters' annotations name: those a launch binds from its arguments."""
        return {symbol_name(s) for p in self.parameters for s in p.symbols()}

    def dtype_generics(self):
        names = set()
        for p in self.parameters:
            entry = p.memref.dtype if p.memref else p.dtype
            if is_symbol(entry):
                names.add(symbol_name(entry))
        return names

    def specialize(self, bound):
        key = tuple(bound[name] for name in self.generics)
        spec = self._specializations.get(key)
        if spec is None:
            spec = self._specializations[key] = Specialization(self, dict(bound))
        return spec

    def rewritten(self):
        if self._rewritten is None:
            self._rewritten = tracer.rewrite(self.function)
        return self._rewritten

    def source_digest(self):
        """sha256 of the kernel's source."""
        return source_digest(self.function)

    def read_values(self):
        """The globals and closure variables the kernel's code names, except
        its generics: what a compile depends on besides the source."""
        return read_values(self.function)

    # -- launching -------------------------------------------------------
    def bind(self, args, unbound=()):
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
        spec = self.specialize(self.bind(args))
        if on_cpu():
            spec.launch(args, **kwargs)
            return
        if not any(isinstance(a, np.ndarray) for a in args):
            try:
                self.register(args, spec.function())
            except ValueError:
                pass  # arguments the dispatcher cannot classify: this path serves them each time
        spec.launch(args, **kwargs)


def show(value):
    return value.name if isinstance(value, DType) else repr(value)


def check_generic_value(name, value, dtype_generics):
    if name in dtype_generics:
        if not isinstance(value, DType):
            try:
                value = _mlirgpu.dtype(value)
            except (TypeError, ValueError):
                raise CompileError(f"generic {name} is an element type: give a dtype such as mg.f32, "
                                   f"not {value!r}") from None
        return value
    if isinstance(value, DType) or isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise CompileError(f"generic {name} is a size: give a positive int, not {value!r}")
    if value <= 0:
        raise CompileError(f"generic {name} must be positive, got {value}")
    return int(value)


def _array_shape_dtype(name, arg):
    """(shape, dtype) of an array argument, or LaunchError naming the parameter."""
    if isinstance(arg, DeviceArray):
        array = arg
    elif isinstance(arg, np.ndarray):
        try:
            return tuple(arg.shape), _mlirgpu.dtype(arg.dtype)
        except (TypeError, ValueError):
            raise LaunchError(f"parameter {name!r}: NumPy dtype {arg.dtype} has no mlirgpu dtype") from None
    elif hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__dlpack__"):
        # On the CPU backend a DLPack object (a CPU tensor) is read as host memory.
        host = on_cpu() and not hasattr(arg, "__cuda_array_interface__")
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


def _host_view(name, arg):
    """A NumPy view of an array argument of a CPU launch (zero copy): a NumPy
    array as is, a host DeviceArray or host DLPack object through DLPack."""
    if isinstance(arg, np.ndarray):
        return arg
    if isinstance(arg, DeviceArray) and not arg.is_host:
        raise LaunchError(f"parameter {name!r} is a DeviceArray in CUDA memory, but the backend is 'cpu': "
                          f"copy it with .get() or use mg.set_backend('cuda')")
    try:
        if not isinstance(arg, DeviceArray) and arg.__dlpack_device__()[0] not in (1, 3):  # kDLCPU, kDLCUDAHost
            raise TypeError("device memory")
        return np.from_dlpack(arg)
    except (AttributeError, TypeError, BufferError, RuntimeError) as error:
        raise LaunchError(f"parameter {name!r}: the CPU backend takes host arrays (DeviceArray, NumPy, host "
                          f"DLPack), not {type(arg).__name__} ({error})") from None


def _check_scalar(p, arg, bound, bind_one):
    if isinstance(arg, (np.ndarray, DeviceArray)) or hasattr(arg, "__cuda_array_interface__"):
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


def kernel(function=None, *, generics=None, max_threads=None, min_blocks=None):
    """`@mg.kernel` or `@mg.kernel(generics=(M, K, N, dtype), max_threads=256, min_blocks=2)`.

    `max_threads` and `min_blocks` are CUDA's `__launch_bounds__`: the most
    threads a launch's block may have (PTX `.maxntid`; a larger block is a
    LaunchError) and the blocks that should fit on one multiprocessor at once
    (`.minnctapersm`), which caps the registers ptxas may give a thread."""
    if function is None:
        return lambda f: Kernel(f, generics, max_threads, min_blocks)
    return Kernel(function, generics, max_threads, min_blocks)


class Specialization(CompiledModule):
    """A kernel with every generic given a value: its IR, PTX, cubin, and
    launches with arguments that must match it."""

    def __init__(self, kernel, values):
        super().__init__()
        self.kernel, self.values = kernel, values
        self._module = None
        self._shared_limits = {}

    def __repr__(self):
        return f"<{self.kernel.__qualname__}[{', '.join(f'{k}={show(v)}' for k, v in self.values.items())}]>"

    @property
    def name(self):
        return self.kernel.function.__name__

    @property
    def source_function(self):
        return self.kernel.function

    def gpu_module(self):
        return self.module()

    def module(self):
        """The traced module (gpu.module @kernels holding gpu.func @<name>)."""
        if self._module is None:
            self._module = self.trace()
        return self._module

    def _param_types(self):
        result = []
        for p in self.kernel.parameters:
            if p.memref is not None:
                shape = [self.values[symbol_name(s)] if is_symbol(s) else s for s in p.memref.shape]
                dtype = self.values[symbol_name(p.memref.dtype)] if is_symbol(p.memref.dtype) else p.memref.dtype
                result.append((p, shape, dtype))
            else:
                dtype = self.values[symbol_name(p.dtype)] if is_symbol(p.dtype) else p.dtype
                result.append((p, None, dtype))
        return result

    def trace(self, target=None):
        """The kernel traced into a module for `target` (default: the GPU's
        gpu.module @kernels holding gpu.func @<name>)."""
        kernel = self.kernel
        return trace_kernel(kernel.function, kernel.rewritten(), self.name,
                            [(p.name, shape, dtype) for p, shape, dtype in self._param_types()], self.values,
                            target=target, attributes=self._launch_bounds())

    def ir(self):
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

    def cache_fields(self):
        kernel = self.kernel
        return (",".join(f"{k}={show(v)}" for k, v in self.values.items()),
                f"opt_level=3,bare_pointers=1,max_threads={kernel.max_threads},min_blocks={kernel.min_blocks}")

    def function_params(self):
        return ["ptr" if shape is not None else "tensormap" if dtype is TensorMap else dtype
                for _, shape, dtype in self._param_types()]

    def __call__(self, *args, grid, block, shared_mem=0, stream=None, cluster=None):
        # Generics the arguments do not determine (tile sizes) take the specialization's values.
        bound = self.kernel.bind(args, unbound=self.values)
        diff = [f"{k}={show(v)} (specialized for {show(self.values[k])})" for k, v in bound.items()
                if v != self.values[k]]
        if diff:
            raise LaunchError(f"the arguments do not match {self!r}: {', '.join(diff)}")
        self.launch(args, grid, block, shared_mem, stream, cluster)

    def launch(self, args, grid=None, block=None, shared_mem=0, stream=None, cluster=None):
        """Launches with arguments already checked against this specialization;
        `cluster=(x, y, z)` launches thread-block clusters of that shape."""
        if grid is None or block is None:
            raise LaunchError(f"launching {self.name} needs grid= and block=")
        if on_cpu():
            if any(isinstance(a, TensorMap) for a in args) or cluster is not None:
                raise LaunchError(f"{self.name} takes tensor maps or clusters, which only the GPU has: "
                                  f"use mg.set_backend('cuda')")
            # The CPU backend runs the launch to completion: `stream` has nothing to order.
            cpu.run(self, [_host_view(p.name, a) if shape is not None else a
                           for (p, shape, _), a in zip(self._param_types(), args)], grid, block, shared_mem)
            return
        function = self.function()
        host = [(i, a) for i, a in enumerate(args) if isinstance(a, np.ndarray)]
        if host:
            args = list(args)
            for i, a in host:
                args[i] = _mlirgpu.to_device(a, stream=stream)
        if shared_mem > _DEFAULT_SHARED_LIMIT and self._shared_limits.get(id(function), 0) < shared_mem:
            # Beyond 48 KB a kernel must be allowed its dynamic shared memory first.
            function.set_max_dynamic_shared_memory(shared_mem)
            self._shared_limits[id(function)] = shared_mem
        if cluster is None:
            function(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream)
        else:
            function(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream, cluster=cluster)
        for i, a in host:
            # NumPy arrays are copied in, and back after the launch.
            np.copyto(a, args[i].get(stream=stream))

