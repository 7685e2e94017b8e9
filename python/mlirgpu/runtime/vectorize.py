"""@mg.vectorize: element-wise kernels (GPU ufuncs) from scalar Python functions.

    @mg.vectorize
    def axpy(a, x, y):
        return a * x + y

    axpy(2.0, x, y)                       # NumPy in, NumPy out; device arrays in, a device array out
    axpy(2.0, dx, dy, out=dz, stream=s)   # into an existing array, on a stream
    spec = axpy[mg.f32, mg.f32, mg.f32]   # every input an array of these dtypes
    print(spec.ir())                      # the linalg.generic it is traced to
    print(spec.ptx(chip="sm_90a"))        # needs no GPU

The function is traced with the kernel language (docs/language.md), once per
input signature: each parameter is a traced scalar of its argument's dtype,
and what it returns (a value or a tuple) is the element of each output.
Arrays broadcast as in NumPy; Python scalars are passed by value, with the
dtype NumPy 2 would give them beside the array arguments. With signatures
(`@mg.vectorize(["f32(f32, f32)"])`) a call uses the first one its arguments
cast to safely, and the results are converted to the declared types.

On the GPU the "direct" mapping (elementwise.py) runs by default; the
"parallel-loops" mapping lowers the linalg.generic with MLIR's own passes.
On the CPU backend the linalg.generic is lowered to loops and run by MLIR's
ExecutionEngine. docs/vectorize.md has the rules.
"""
from __future__ import annotations

import functools
import inspect
import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _mlirgpu, cuda, ir
from .._mlirgpu import CompileError, DeviceArray, DType, LaunchError, Stream
from ..compiler.cpu import PIPELINE
from ..frontend import elementwise
from ..frontend import rewrite as tracer
from ..frontend.function import at_return
from ..frontend.trace import tracing
from ..ir import passes
from ..language import core as lang
from .backend import Backend, current, empty, read_only_error, zeros
from .compiled import CompiledModule, TracedGlobals
from .tracebacks import user_frames, user_stacklevel
from .host_program import HostProgram
from .scalars import scalar_bytes

__all__ = ["vectorize", "Vectorized", "ElementwiseSpecialization", "MAPPINGS"]

MAPPINGS = ("direct", "parallel-loops")
_VECTOR_BYTES = 16  # the widest GPU access (ld.global.v4.f32)
# The CPU backend's lowering of the linalg form: loops, then the kernels' host pipeline.
_CPU_LOOPS = "builtin.module(func.func(convert-linalg-to-loops))"


@user_frames
def vectorize(signatures: Callable | str | Sequence[str] | None = None, *, mapping: str = "direct", threads: int = 1024,
              unroll: int = 1, on_global_change: str | None = None) -> Vectorized | Callable[[Callable], Vectorized]:
    """`@mg.vectorize`, `@mg.vectorize(["f32(f32, f32)", ...])` or
    `@mg.vectorize(mapping="parallel-loops")`.

    `mapping` picks how the GPU runs it ("direct" or "parallel-loops", see
    elementwise.py); `threads` (a multiple of 32, at most 1024) and `unroll`
    (1 to 16) shape the direct mapping's blocks: each thread of a block
    handles `unroll` vectors of 16 bytes (the defaults are the fastest shape
    benchmarks/elementwise.py measured on the H100). `on_global_change`
    is what a call does when a global the function read has changed since it
    was traced, as for @mg.kernel: "recompile" (the default) or "error".

    For example::

        @mg.vectorize
        def axpy(a, x, y):
            return a * x + y

        z = axpy(2.0, np.arange(4.0), np.ones(4))     # NumPy in, NumPy out: [1. 3. 5. 7.]
    """
    if inspect.isfunction(signatures):
        return Vectorized(signatures, None, mapping, threads, unroll, on_global_change)
    if signatures is not None and not isinstance(signatures, (str, list, tuple)):
        raise TypeError(f"mg.vectorize takes a function or a list of signatures such as ['f32(f32, f32)'], "
                        f"not {type(signatures).__name__}")
    return user_frames(lambda function: Vectorized(function, signatures, mapping, threads, unroll, on_global_change))


class Signature:
    """A declared signature "f32(f32, f32)" or "(f32, i32)(f32)": output and input dtypes."""

    _FORM = re.compile(r"\s*(\([^()]*\)|[^()\s]+)\s*\(([^()]*)\)\s*")

    def __init__(self, text):
        if not isinstance(text, str):
            raise CompileError(f"a vectorize signature is a string such as 'f32(f32, f32)', not {text!r}")
        match = self._FORM.fullmatch(text)
        if match is None:
            raise CompileError(f"malformed vectorize signature {text!r}: write 'f32(f32, f32)', or "
                               f"'(f32, f32)(f64)' for two outputs")
        outputs, inputs = match.group(1).strip("()"), match.group(2)
        self.text = text
        self.outputs = self._dtypes(outputs)
        self.inputs = self._dtypes(inputs)
        if not self.outputs:
            raise CompileError(f"vectorize signature {text!r} declares no output")

    def _dtypes(self, names):
        result = []
        for name in (n.strip() for n in names.split(",")):
            if not name:
                continue
            try:
                result.append(_mlirgpu.dtype(name))
            except (TypeError, ValueError):
                raise CompileError(f"unknown dtype {name!r} in vectorize signature {self.text!r}") from None
        return tuple(result)

    def __repr__(self):
        return repr(self.text)


class Vectorized:
    """A scalar function made element-wise: call it on arrays and scalars,
    index it with input dtypes for a specialization to inspect."""

    def __init__(self, function, signatures=None, mapping="direct", threads=1024, unroll=1, on_global_change=None):
        if not inspect.isfunction(function):
            raise TypeError(f"@mg.vectorize decorates a function, not {type(function).__name__}")
        parameters = inspect.signature(function).parameters.values()
        for p in parameters:
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty:
                raise CompileError(f"{function.__qualname__}: @mg.vectorize takes plain positional "
                                   f"parameters, not {p}")
        if not parameters:
            raise CompileError(f"{function.__qualname__}: @mg.vectorize needs at least one parameter")
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping must be one of {', '.join(MAPPINGS)}, not {mapping!r}")
        if type(threads) is not int or not 32 <= threads <= 1024 or threads % 32:
            raise ValueError(f"threads must be a multiple of 32 in 32..1024, not {threads!r}")
        if type(unroll) is not int or not 1 <= unroll <= 16:
            raise ValueError(f"unroll must be an int in 1..16, not {unroll!r}")
        self.function = function
        self.traced_globals = TracedGlobals(function, on_global_change)
        self.__name__, self.__qualname__, self.__doc__ = function.__name__, function.__qualname__, function.__doc__
        self.names = [p.name for p in parameters]
        self.nin = len(self.names)
        self.mapping, self.threads, self.unroll = mapping, threads, unroll
        if isinstance(signatures, str):
            signatures = [signatures]
        self.signatures = [Signature(s) for s in signatures or ()]
        for s in self.signatures:
            if len(s.inputs) != self.nin:
                raise CompileError(f"vectorize signature {s.text!r} has {len(s.inputs)} inputs, but "
                                   f"{function.__qualname__} takes {self.nin}")
        self._rewritten = None
        self._outputs = {}
        self._faults = {}
        self._specializations = {}
        self.check_globals()
        for s in self.signatures:  # traced now: a function that cannot take them fails at its definition
            self._output_dtypes(tuple((d, True) for d in s.inputs), s.outputs)

    def __repr__(self):
        return f"<mlirgpu vectorized {self.__qualname__}>"

    # -- tracing ----------------------------------------------------------
    def check_globals(self) -> None:
        """Forgets every trace where a global or closure value it read has
        changed since (or raises CompileError, as `on_global_change` says)."""
        self.traced_globals.check(self.forget_traces)

    def forget_traces(self) -> None:
        self._outputs.clear()
        self._faults.clear()
        for spec in self._specializations.values():
            spec.forget_traces()

    def _traced(self, build):
        """build(instance) under a Trace of the function: operations at its lines,
        errors as CompileErrors pointing there."""
        if self._rewritten is None:
            self._rewritten = tracer.rewrite(self.function, returns=True)
        with ir.Context.current(), tracing(self.function, self._rewritten) as trace:
            return build(trace.instance)

    def _apply(self, instance, declared, values, faults):
        """The function on traced scalars: its results, as declared (converted) or as they are.
        Without declared signatures the inputs are first converted to their common type, as a
        NumPy ufunc's are (bools stay bools, for conditions). Integer // and % give NumPy's
        results, calling faults(condition, warning) for each condition NumPy warns about."""
        if not self.signatures:
            values = _promoted(values)
        outer, lang.state.division_faults = lang.state.division_faults, faults
        try:
            result = instance(*values)
        finally:
            lang.state.division_faults = outer
        results = list(result) if isinstance(result, tuple) else [result]
        try:
            if declared is not None:
                if len(results) != len(declared):
                    raise CompileError(f"{self.__qualname__} returns {len(results)} values, but the signature "
                                       f"declares {len(declared)}")
                results = [lang.cast(r, d) for r, d in zip(results, declared)]
            for r in results:
                if not isinstance(r, lang.Scalar):
                    what = "a Python number (write mg.constant(value, dtype))" if lang.is_python_number(r) else \
                        type(r).__name__
                    raise CompileError(f"{self.__qualname__} returns {what}: an element-wise function returns "
                                       f"traced values, or a tuple of them")
        except CompileError as error:
            raise at_return(self.function, self._rewritten[3], error) from None
        return results

    def _location(self):
        return ir.Location.file(self._rewritten[3] if self._rewritten else inspect.getsourcefile(self.function),
                                self.function.__code__.co_firstlineno, 0)

    def _output_dtypes(self, inputs, declared):
        """The output dtypes for inputs ((dtype, is_array) each), found by tracing once, which
        also finds the warnings its integer divisions may give (self._faults), in a fixed order."""
        key = (inputs, declared)
        outputs = self._outputs.get(key)
        if outputs is None:
            def probe(instance):
                module = ir.Module.create(location=self._location())
                types = [lang.ir_type(d) for d, _ in inputs]
                with ir.InsertionPoint(module.body):
                    func = ir.Operation.create("func.func", regions=1, location=self._location(), attributes={
                        "sym_name": ir.Attribute.string("probe"),
                        "function_type": ir.Attribute.type_attr(ir.Type.function(types, []))})
                block = func.regions[0].append_block(types, [self._location()] * len(types))
                with ir.InsertionPoint(block):
                    values = [lang.Scalar(a, d) for a, (d, _) in zip(block.arguments, inputs)]
                    warnings = []
                    results = self._apply(instance, declared, values, lambda _, warning: warnings.append(warning))
                    self._faults[key] = tuple(dict.fromkeys(warnings))
                    return tuple(r.dtype for r in results)
            outputs = self._outputs[key] = self._traced(probe)
        return outputs

    # -- specializations ----------------------------------------------------
    def specialization(self, inputs: Sequence[tuple[DType, bool]], declared: Sequence[DType] | None = None,
                       rank: int | None = None, width: int | None = None) -> ElementwiseSpecialization:
        """The ElementwiseSpecialization for `inputs` ((dtype, is_array) each):
        contiguous arrays (rank None) read `width` elements at a time (default:
        16 bytes' worth), or strided arrays of `rank` dimensions."""
        self.check_globals()
        inputs = tuple((_mlirgpu.dtype(d), bool(a)) for d, a in inputs)
        outputs = self._output_dtypes(inputs, declared)
        if width is None:
            width = _widest(inputs, outputs) if rank is None else 1
        key = (inputs, declared, rank, width)
        spec = self._specializations.get(key)
        if spec is None:
            spec = self._specializations[key] = ElementwiseSpecialization(self, inputs, declared, outputs, rank,
                                                                          width)
        return spec

    @user_frames
    def __getitem__(self, dtypes: Any) -> ElementwiseSpecialization:
        """vec[mg.f32, mg.f32] (every input an array of that dtype) or vec["f32(f32, f32)"]."""
        if isinstance(dtypes, str):
            signature = Signature(dtypes)
            if len(signature.inputs) != self.nin:
                raise CompileError(f"{self.__qualname__} takes {self.nin} inputs; {dtypes!r} has "
                                   f"{len(signature.inputs)}")
            return self.specialization([(d, True) for d in signature.inputs], signature.outputs)
        dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
        if len(dtypes) != self.nin:
            raise CompileError(f"{self.__qualname__} takes {self.nin} inputs, got {len(dtypes)} dtypes")
        try:
            return self.specialization([(d, True) for d in dtypes])
        except (TypeError, ValueError) as error:
            raise CompileError(f"{self.__qualname__}[...] takes dtypes: {error}") from None

    def specialize(self, *args: Any, out: Any = None) -> ElementwiseSpecialization:
        """The specialization a call with these arguments would run (for arrays
        whose memory is aligned for vector access)."""
        return self._plan(args, out).specialization()

    # -- calling -----------------------------------------------------------
    @user_frames
    def __call__(self, *args: Any, out: Any = None, dtype: Any = None, stream: Stream | None = None) -> Any:
        return current().run_vectorized(self._plan(args, out, dtype), stream)

    def _plan(self, args, out, dtype=None):
        self.check_globals()
        if len(args) != self.nin:
            raise LaunchError(f"{self.__qualname__} takes {self.nin} arguments ({', '.join(self.names)}), "
                              f"got {len(args)}")
        if dtype is not None:
            if self.signatures:
                raise LaunchError(f"{self.__qualname__} declares its signatures: dtype= applies to functions "
                                  f"without them")
            try:
                dtype = _mlirgpu.dtype(dtype)
            except (TypeError, ValueError) as error:
                raise LaunchError(f"{self.__qualname__}: dtype={dtype!r}: {error}") from None
        return _Plan(self, args, out, dtype)


def _widest(inputs, outputs):
    """Elements per vector access: 16 bytes of the widest array dtype (1 where a bool array takes part)."""
    arrays = [d for d, is_array in inputs if is_array] + list(outputs)
    if any(d == lang.bool_ for d in arrays):
        return 1
    return min(8, _VECTOR_BYTES // max(d.itemsize for d in arrays))


class _Argument:
    """One argument of a call, classified."""

    __slots__ = ("index", "value", "dtype", "is_array", "weak", "shape", "on_device")

    def __init__(self, index, value, dtype, is_array, weak=False, shape=(), on_device=False):
        self.index, self.value, self.dtype, self.is_array = index, value, dtype, is_array
        self.weak, self.shape, self.on_device = weak, tuple(shape), on_device


def _array_dtype(name, dtype):
    try:
        return _mlirgpu.dtype(dtype)
    except (TypeError, ValueError):
        raise LaunchError(f"argument {name!r} has dtype {dtype}, which mlirgpu does not support") from None


class _Plan:
    """A call bound to its arguments: dtypes, broadcast shape, outputs."""

    def __init__(self, vectorized, args, out, dtype=None):
        self.vectorized = v = vectorized
        self.dtype = dtype
        backend = current()
        self.arguments = [self._classify(v.names[i], i, a, backend) for i, a in enumerate(args)]
        arrays = [a for a in self.arguments if a.is_array]
        try:
            self.shape = tuple(np.broadcast_shapes(*[a.shape for a in arrays])) if arrays else ()
        except ValueError:
            raise LaunchError(f"{v.__qualname__}: the arguments' shapes " +
                              ", ".join(f"{a.shape} ({v.names[a.index]})" for a in arrays) +
                              " do not broadcast together") from None
        self.on_device = any(a.on_device for a in self.arguments)
        self._resolve_dtypes()
        self.outputs = v._output_dtypes(self.inputs, self.declared)
        self.out = self._check_out(out)

    @staticmethod
    def _classify(name, index, value, backend: Backend):
        if isinstance(value, (bool, int, float)):
            return _Argument(index, value, None, False, weak=True)
        if isinstance(value, np.generic):
            return _Argument(index, value, _array_dtype(name, value.dtype), False)
        if isinstance(value, (list, tuple)):
            value = np.asarray(value)  # what a NumPy ufunc makes of a list
        if isinstance(value, np.ndarray):
            return _Argument(index, value, _array_dtype(name, value.dtype), True, shape=value.shape)
        if isinstance(value, DeviceArray):
            if value.is_host != backend.host:
                where = "host memory (made on the CPU backend)" if value.is_host else "CUDA memory"
                raise LaunchError(f"argument {name!r} is a DeviceArray in {where}, but the backend is "
                                  f"{backend.name}")
            return _Argument(index, value, value.dtype, True, shape=value.shape, on_device=True)
        if backend.host:
            try:
                view = np.from_dlpack(value)
            except (AttributeError, TypeError, BufferError, RuntimeError) as error:
                raise LaunchError(f"argument {name!r}: the CPU backend takes NumPy arrays, DeviceArrays, "
                                  f"host DLPack objects and scalars, not {type(value).__name__} ({error})") from None
            return _Argument(index, view, _array_dtype(name, view.dtype), True, shape=view.shape)
        try:
            view = _mlirgpu.asarray(value)
        except TypeError as error:
            raise LaunchError(f"argument {name!r}: expected an array or a scalar, not {type(value).__name__} "
                              f"({error})") from None
        return _Argument(index, view, view.dtype, True, shape=view.shape, on_device=True)

    def _resolve_dtypes(self):
        v = self.vectorized
        strong = [a.dtype for a in self.arguments if not a.weak]
        if not v.signatures:
            for a in self.arguments:
                if a.weak:
                    a.dtype = _weak_dtype(a.value, strong)
                    _check_fits(v.names[a.index], a.value, a.dtype)
                if self.dtype is not None and a.dtype != lang.bool_ and a.dtype != self.dtype:
                    self._convert(a, self.dtype, f"dtype={self.dtype.name}")
            self.inputs = tuple((a.dtype, a.is_array) for a in self.arguments)
            self.declared = None
            return
        for signature in v.signatures:
            if all(_casts_to(a, d) for a, d in zip(self.arguments, signature.inputs)):
                break
        else:
            given = ", ".join("python " + type(a.value).__name__ if a.weak else a.dtype.name for a in self.arguments)
            raise LaunchError(f"{v.__qualname__}: no signature takes ({given}); its signatures are "
                              + ", ".join(s.text for s in v.signatures))
        for a, d in zip(self.arguments, signature.inputs):
            if a.dtype != d and a.is_array:
                self._convert(a, d, f"the signature {signature.text!r}")
            a.dtype = d
            if a.weak:
                _check_fits(v.names[a.index], a.value, d)
        self.inputs = tuple((d, a.is_array) for a, d in zip(self.arguments, signature.inputs))
        self.declared = signature.outputs

    def _convert(self, a, dtype, why):
        """Argument `a` as `dtype`: host arrays and scalars are converted, device arrays must have it."""
        name = self.vectorized.names[a.index]
        if a.on_device:
            raise LaunchError(f"argument {name!r} is a device array of {a.dtype.name}, but {why} takes "
                              f"{dtype.name}: convert it first")
        if a.is_array:
            a.value = a.value.astype(dtype.numpy)
        elif not a.weak:
            a.value = dtype.numpy.type(a.value)
        else:
            _check_fits(name, a.value, dtype)
        a.dtype = dtype

    def _check_out(self, out):
        """out= as classified arguments (the caller's objects kept in self.out_objects)."""
        v = self.vectorized
        self.out_objects = None
        if out is None:
            return None
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) != len(self.outputs):
            raise LaunchError(f"{v.__qualname__} has {len(self.outputs)} outputs; out= gives {len(outs)}")
        checked = []
        for k, (o, dtype) in enumerate(zip(outs, self.outputs)):
            a = self._classify(f"out[{k}]", -1, o, current())
            if not a.is_array:
                raise LaunchError(f"out[{k}] must be an array, not {type(o).__name__}")
            if a.shape != self.shape:
                raise LaunchError(f"out[{k}] has shape {a.shape}, but the arguments broadcast to {self.shape}")
            if a.dtype != dtype:
                raise LaunchError(f"out[{k}] has dtype {a.dtype.name}, but {v.__qualname__} returns "
                                  f"{dtype.name} there")
            if not a.value.flags.writeable if isinstance(a.value, np.ndarray) else a.value.readonly:
                raise read_only_error(f"out[{k}]", v.__name__)
            checked.append(a)
        for a in self.arguments:
            if a.is_array and any(_overlap(a.value, o.value) for o in checked):
                # As NumPy: the inputs are read as they were before any output is written.
                a.value = a.value.copy()
        self.out_objects = outs
        self.on_device = self.on_device or any(a.on_device for a in checked)
        return checked

    def _contiguous(self, arrays):
        return all(tuple(a.shape) == self.shape and _is_c_contiguous(a) for a in arrays)

    def specialization(self):
        """The specialization for these arguments, assuming vector-aligned memory."""
        arrays = [a.value for a in self.arguments if a.is_array] + [a.value for a in self.out or ()]
        rank = None if self._contiguous(arrays) else len(self.shape)
        return self.vectorized.specialization(self.inputs, self.declared, rank)

    def _scalars(self):
        """Each scalar argument's bytes in its dtype (the CPU engine's form); LaunchError when it does not fit."""
        return {a.index: scalar_bytes(f"parameter {self.vectorized.names[a.index]!r} ({a.dtype.name})", a.dtype,
                                      a.value)
                for a in self.arguments if not a.is_array}

    def _result(self, outs):
        """What the call returns: out= as given, else the outputs (a tuple of several)."""
        if self.out_objects is not None:
            results = list(self.out_objects)
        else:
            results = list(outs)
            if not self.on_device and self.shape == ():
                results = [r[()] for r in results]  # scalars in, a scalar out, as NumPy's ufuncs
        return results[0] if len(results) == 1 else tuple(results)

    # -- the CPU backend ---------------------------------------------------
    def run_cpu(self) -> Any:
        if self.out is not None:
            outs = [a.value for a in self.out]
        elif self.on_device:
            outs = [empty(self.shape, d) for d in self.outputs]
        else:
            outs = [np.empty(self.shape, d.numpy) for d in self.outputs]
        views = [_host_view(o) for o in outs]
        arrays = {a.index: _host_view(a.value) for a in self.arguments if a.is_array}
        contiguous = self._contiguous(list(arrays.values()) + views)
        if math.prod(self.shape) == 0:
            return self._result(outs)
        spec = self.vectorized.specialization(self.inputs, self.declared, None if contiguous else len(self.shape), 1)
        scalars = self._scalars()
        args = []
        for a in self.arguments:
            if not a.is_array:
                args.append(scalars[a.index])
            elif contiguous:
                args.append(arrays[a.index].reshape(-1))
            else:
                args.append(np.broadcast_to(arrays[a.index], self.shape))
        args += [o.reshape(-1) if contiguous else o for o in views]
        flags = spec.fault_flags(np.zeros)
        spec.cpu_engine().invoke(spec.name, args + [flags] * bool(spec.faults))
        spec.report_faults(flags)
        return self._result(outs)

    # -- the GPU -----------------------------------------------------------
    def run_gpu(self, stream: Stream | None) -> Any:
        device = {a.index: _mlirgpu.to_device(a.value, stream=stream) if isinstance(a.value, np.ndarray)
                  else a.value for a in self.arguments if a.is_array}
        if self.out is None:
            outs = [empty(self.shape, d, stream=stream) for d in self.outputs]
        else:  # NumPy outputs are computed on the device and copied back
            outs = [empty(self.shape, a.dtype, stream=stream) if isinstance(a.value, np.ndarray) else a.value
                    for a in self.out]
        arrays = list(device.values()) + outs
        contiguous = self._contiguous(arrays)
        if math.prod(self.shape) > 0:
            spec = self.vectorized.specialization(self.inputs, self.declared, None if contiguous else len(self.shape))
            if contiguous and spec.width > 1 and not all(_aligned(a, spec.width) for a in arrays):
                spec = self.vectorized.specialization(self.inputs, self.declared, None, 1)
            flags = spec.fault_flags(functools.partial(zeros, stream=stream))
            spec.launch(self, device, outs, flags, stream)
            if spec.faults:  # the flags, read once the launch is done: only a call that divides integers waits
                spec.report_faults(flags.get(stream=stream))
        if self.out is not None:
            for a, o in zip(self.out, outs):
                if isinstance(a.value, np.ndarray):
                    np.copyto(a.value, o.get(stream=stream))
        elif not self.on_device:
            return self._result([o.get(stream=stream) for o in outs])
        return self._result(outs)


def _numpy_error(message):
    """What NumPy does for an integer division fault, as np.seterr says: warn, raise or ignore."""
    action = np.geterr()["over" if message.startswith("overflow") else "divide"]
    if action == "raise":
        raise FloatingPointError(message)
    if action != "ignore":
        warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())


def _host_view(array):
    """A NumPy view of a host array (a host DeviceArray's memory, shared)."""
    return np.from_dlpack(array) if isinstance(array, DeviceArray) else array


def _promoted(values):
    """The traced inputs converted to NumPy's result type of their dtypes (bool inputs
    left as they are); bf16 has no NumPy promotion and meets f32 and f64 as f16 does."""
    numeric = [v.dtype for v in values if v.dtype != lang.bool_]
    if len(set(numeric)) <= 1:
        return values
    as_numpy = [np.dtype(np.float16) if d == lang.bf16 else d.numpy for d in numeric]
    common = _mlirgpu.dtype(np.result_type(*as_numpy))
    if common == lang.f16 and lang.bf16 in numeric:
        common = lang.f32  # bf16 with f16 or an integer: neither holds the other
    return [v if v.dtype == lang.bool_ else lang.cast(v, common) for v in values]


def _weak_dtype(value, strong):
    """The dtype of a Python scalar beside arguments of the `strong` dtypes
    (NumPy 2's rule: it takes theirs where its kind fits)."""
    numpy_dtypes = [d.numpy for d in strong if d.kind != "V"]  # bf16 (kind V) has no NumPy promotion
    try:
        return _mlirgpu.dtype(np.result_type(*numpy_dtypes, value))
    except (TypeError, ValueError):
        return _mlirgpu.dtype(np.result_type(value))


def _check_fits(name, value, dtype):
    """A Python int must fit the integer dtype it is given (NumPy would wrap it silently)."""
    if isinstance(value, int) and not isinstance(value, bool) and dtype.kind in "iu":
        lo, hi = lang.integer_range(dtype)
        if not lo <= value <= hi:
            raise LaunchError(f"argument {name!r} is {dtype.name}: {value} is out of its range {lo}..{hi}")


def _casts_to(argument, dtype):
    if argument.weak:
        kind = "b" if isinstance(argument.value, bool) else "i" if isinstance(argument.value, int) else "f"
        return {"b": True, "i": dtype.kind in "iuf", "f": dtype.kind == "f"}[kind]
    if argument.dtype == dtype:
        return True
    if argument.dtype.kind == "V" or dtype.kind == "V":
        return False
    return bool(np.can_cast(argument.dtype.numpy, dtype.numpy, "safe"))


def _byte_range(array):
    """(first, end) of the bytes the elements of a NumPy or device array span; None for no elements."""
    if 0 in array.shape:
        return None
    start = array.__array_interface__["data"][0] if isinstance(array, np.ndarray) else array.ptr
    reach = [stride * (size - 1) for stride, size in zip(array.strides, array.shape)]
    return start + sum(r for r in reach if r < 0), start + sum(r for r in reach if r > 0) + array.itemsize


def _overlap(given, out):
    """Whether writing `out` may change what reading the input `given` gives (the very same
    elements, read and written in one place, do not)."""
    if given is out:
        return False
    a, b = _byte_range(given), _byte_range(out)
    if a is None or b is None or a[1] <= b[0] or b[1] <= a[0]:
        return False
    return not (a[0] == b[0] and tuple(given.shape) == tuple(out.shape) and
                tuple(given.strides) == tuple(out.strides))


def _is_c_contiguous(array):
    if isinstance(array, np.ndarray):
        return array.flags.c_contiguous
    return array.is_c_contiguous


def _aligned(array, width):
    return array.ptr % (width * array.dtype.itemsize) == 0


def _strides(array, shape):
    """Strides in elements of `array` broadcast to `shape` (0 along broadcast dimensions)."""
    itemsize = array.dtype.itemsize
    lead = len(shape) - len(array.shape)
    strides = []
    for d, size in enumerate(shape):
        k = d - lead
        if k < 0 or array.shape[k] != size:
            strides.append(0)
        elif array.strides[k] % itemsize:
            raise LaunchError(f"an array with strides {array.strides} that are not whole elements of "
                              f"{itemsize} bytes")
        else:
            strides.append(array.strides[k] // itemsize)
    return strides


class ElementwiseSpecialization(CompiledModule):
    """One element-wise kernel: input dtypes (arrays or scalars), output
    dtypes, contiguous (rank None) or strided arrays of `rank` dimensions,
    and the elements of each vector access (`width`, direct mapping)."""

    # Dynamic sizes: memrefs pass as descriptors (pointers, offset, sizes, strides).
    bare_pointers = False

    def __init__(self, vectorized, inputs, declared, outputs, rank, width):
        super().__init__()
        self.vectorized, self.inputs, self.declared = vectorized, inputs, declared
        self.outputs, self.rank, self.width = outputs, rank, width
        # The warnings NumPy gives for its integer divisions, in the order of the kernel's fault flags.
        self.faults = vectorized._faults[inputs, declared]
        self._linalg = self._gpu = self._engine = None
        self._programs = {}

    def __repr__(self):
        layout = "contiguous" if self.rank is None else f"strided rank {self.rank}"
        ins = ", ".join(d.name if a else f"scalar {d.name}" for d, a in self.inputs)
        outs = ", ".join(d.name for d in self.outputs)
        return f"<{self.vectorized.__qualname__}({ins}) -> ({outs}), {layout}, width {self.width}>"

    @property
    def name(self):
        return self.vectorized.__name__

    @property
    def mapping(self):
        return self.vectorized.mapping

    @property
    def source_function(self):
        return self.vectorized.function

    @property
    def traced_globals(self):
        return self.vectorized.traced_globals

    def check_globals(self):
        self.vectorized.check_globals()

    def forget_traces(self):
        super().forget_traces()
        self._linalg = self._gpu = self._engine = None
        self._programs.clear()

    def _build(self, make):
        """A module that make(module, apply, flags) fills, `flags` whether it takes fault flags
        and apply(values, flags) the function on traced values, setting flags where it faults."""
        v = self.vectorized

        def build(instance):
            def apply(values, flags):
                return v._apply(instance, self.declared, values, functools.partial(self._flag, flags))
            module = ir.Module.create(location=v._location())
            make(module, apply, bool(self.faults))
            module.verify()
            return module
        return v._traced(build)

    def _flag(self, flags, condition, warning):
        """Sets the flag of `warning` where `condition` holds. Every element that
        faults stores the same value, so the GPU's threads may race to it."""
        op = lang.emit("scf.if", [condition], [], regions=2)
        with ir.InsertionPoint(op.regions[0].append_block()):
            flags[self.faults.index(warning)] = True
            lang.emit("scf.yield")

    def fault_flags(self, zeros_like_numpy):
        """The fault flags a launch passes, all clear: an array made by zeros_like_numpy(shape,
        dtype) (np.zeros on the host, mg.zeros on a stream); None for a kernel without them."""
        return zeros_like_numpy((len(self.faults),), np.bool_) if self.faults else None

    def report_faults(self, flags):
        """NumPy's warning (or error, as np.errstate says) for each fault flag that a launch set."""
        for warning, flagged in zip(self.faults, flags if flags is not None else ()):
            if flagged:
                _numpy_error(warning)

    def linalg(self):
        """The module holding func.func @<name>: one linalg.generic over memrefs
        (and the fault flags, where integer division may fault)."""
        if self._linalg is None:
            self._linalg = self._linalg_module()
        return self._linalg

    def _linalg_module(self):
        return self._build(lambda module, apply, flags: elementwise.linalg_function(
            module, self.name, self.inputs, self.outputs, self.rank, apply, self.vectorized._location(),
            flags=flags))

    def gpu_module(self):
        """The module the GPU mapping makes: gpu.module @kernels for "direct";
        for "parallel-loops" the linalg form after MLIR's mapping passes (a
        host function around gpu.launch)."""
        if self._gpu is None:
            v = self.vectorized
            if v.mapping == "direct":
                self._gpu = self._build(lambda module, apply, flags: elementwise.direct_kernel(
                    module, self.name, self.inputs, self.outputs, self.rank, apply, v._location(),
                    v.names, self.width, v.unroll, v.threads, flags))
            else:
                module = self._build(lambda module, apply, flags: elementwise.linalg_function(
                    module, self.name, self.inputs, self.outputs, self.rank, apply, v._location(),
                    reversed_loops=True, flags=flags))
                try:
                    passes.run(module, elementwise.parallel_loops_pipeline(1 if self.rank is None else self.rank))
                except _mlirgpu.MLIRError as error:
                    raise CompileError(f"the parallel-loops mapping of {self.name} failed:\n{error}") from error
                self._gpu = module
        return self._gpu

    def ir(self, stage: str = "linalg") -> str:
        """The IR, with the function's file:line locations: "linalg" (the
        linalg.generic) or "gpu" (what the mapping makes of it)."""
        if stage not in ("linalg", "gpu"):
            raise ValueError(f"stage is 'linalg' or 'gpu', not {stage!r}")
        return (self.linalg() if stage == "linalg" else self.gpu_module()).print(debug_info=True)

    def cache_fields(self):
        v = self.vectorized
        signature = ",".join(f"{d.name}{'' if a else ' scalar'}" for d, a in self.inputs) + "->" + \
            ",".join(d.name for d in self.outputs)
        return signature, (f"vectorize,mapping={v.mapping},rank={self.rank},width={self.width},"
                           f"threads={v.threads},unroll={v.unroll}")

    # -- running -----------------------------------------------------------
    def cpu_engine(self) -> _mlirgpu.ExecutionEngine:
        """The linalg form lowered to loops and JIT-compiled for the host."""
        if self._engine is None:
            module = self._linalg_module()
            passes.run(module, _CPU_LOOPS)
            passes.run(module, PIPELINE)
            self._engine = _mlirgpu.ExecutionEngine(module)
        return self._engine

    def function_params(self):
        """The direct kernel's parameters for Function packing: each memref as its descriptor's fields."""
        rank = 1 if self.rank is None else self.rank
        memref = ["ptr", "ptr", _mlirgpu.i64] + [_mlirgpu.i64] * (2 * rank)
        params = []
        for dtype, is_array in self.inputs:
            params += memref if is_array else [dtype]
        flags = ["ptr", "ptr", _mlirgpu.i64, _mlirgpu.i64, _mlirgpu.i64] * bool(self.faults)
        return params + memref * len(self.outputs) + flags

    def launch(self, plan, device_inputs, outs, flags, stream):
        """Runs on the GPU over DeviceArrays: `device_inputs` by argument index, `outs` the outputs,
        `flags` the fault flags (fault_flags())."""
        if self.vectorized.mapping == "direct":
            self._launch_direct(plan, device_inputs, outs, flags, stream)
        else:
            self._run_parallel_loops(plan, device_inputs, outs, flags)

    def _launch_direct(self, plan, device_inputs, outs, flags, stream):
        v, shape = self.vectorized, plan.shape
        args = []

        def descriptor(array):
            if self.rank is None:
                return [array, array, 0, math.prod(shape), 1]
            return [array, array, 0, *shape, *_strides(array, shape)]

        for a in plan.arguments:
            if a.is_array:
                args += descriptor(device_inputs[a.index])
            else:
                args.append(_as_python_number(a.value))
        for o in outs:
            args += descriptor(o)
        if flags is not None:
            args += [flags, flags, 0, len(self.faults), 1]
        total = math.prod(shape)
        if self.rank is None:
            grid = -(-total // (v.threads * v.unroll * self.width))
        else:
            grid = min(-(-total // v.threads), _resident_blocks(_current_device(), v.threads))
        self.function()(*args, grid=grid, block=v.threads, stream=stream)

    def program(self) -> HostProgram:
        """The parallel-loops mapping's module as an mlirgpu.HostProgram, on the current device."""
        device = cuda.current_device()
        program = self._programs.get(device)
        if program is None:
            program = self._programs[device] = HostProgram(self.gpu_module(), cuda.Device(device).chip)
        return program

    def _run_parallel_loops(self, plan, device_inputs, outs, flags):
        """The host function MLIR's mapping made, run by the ExecutionEngine on
        the mgpu* runtime: it waits for the device first and for the kernel after."""
        shape = plan.shape
        flat = (math.prod(shape),)

        def memref(array):
            if self.rank is None:
                return _view(array, flat, (array.dtype.itemsize,))
            return _view(array, shape, [s * array.dtype.itemsize for s in _strides(array, shape)])

        args = [memref(device_inputs[a.index]) if a.is_array else _as_python_number(a.value) for a in plan.arguments]
        self.program().run(self.name, *args, *[memref(o) for o in outs], *[flags] * bool(self.faults))


def _as_python_number(value):
    return value.item() if isinstance(value, np.generic) else value


class _Interface:
    """__cuda_array_interface__ of another shape and strides over an array's memory."""

    def __init__(self, array, shape, strides):
        self.array = array  # keeps the memory alive while the view lives
        self.__cuda_array_interface__ = {"shape": tuple(shape), "strides": tuple(strides), "version": 3,
                                         "typestr": array.__cuda_array_interface__["typestr"],
                                         "data": (array.ptr, False), "stream": None}


def _view(array, shape, strides):
    """A DeviceArray view of `array`'s memory with `shape` and byte `strides` (0 to broadcast)."""
    if tuple(array.shape) == tuple(shape) and tuple(array.strides) == tuple(strides):
        return array
    try:
        return _mlirgpu.asarray(_Interface(array, shape, strides))
    except TypeError as error:  # bf16 has no __cuda_array_interface__ typestr
        raise LaunchError(f"the parallel-loops mapping cannot view a {array.dtype.name} array at another shape "
                          f"({error}); use the direct mapping") from None


def _current_device():
    return cuda.current_device()


@functools.lru_cache(maxsize=None)
def _resident_blocks(device, threads):
    """Blocks of `threads` a GPU holds at once: the strided kernel's grid-stride width."""
    return cuda.Device(device).multiprocessor_count * max(1, 2048 // threads)
