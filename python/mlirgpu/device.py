"""Device-side building blocks of kernels: barriers, vector loads and
stores, printf, and @mg.func device functions.

    mg.syncthreads()                     # gpu.barrier
    v = mg.vload(A, (i, j), 4)           # vector.load: vector<4xf32>, v[0] .. v[3]
    mg.vstore(B, (i, j), v * 2.0)        # vector.store
    mg.printf("%d: %f\\n", i, x)          # gpu.printf (vprintf)

    @mg.func
    def axpy(a, x, y):                   # func.func in the gpu.module, per argument types
        return a * x + y

Also the helpers the other device modules share: `module_state()` (what a
kernel's trace has put into its gpu.module) and `gpu_module_scope()` (an
insertion point in the gpu.module, before the function being traced).
"""
import ast
import contextlib
import functools
import inspect
import linecache
import re
import textwrap

import numpy as np

from . import host, ir, language as lang, tracer
from ._mlirgpu import CompileError

__all__ = ["syncthreads", "vload", "vstore", "Vector", "printf", "func", "DeviceFunction"]


# ---------------------------------------------------------------------------
# The gpu.module being built

def module_state():
    """A dict shared by everything traced into one kernel's gpu.module (the
    kernel and the device functions it calls): shared arrays, device
    function specializations, the device-function call stack."""
    trace = lang._trace()
    state = getattr(trace, "module_state", None)
    if state is None:
        state = trace.module_state = {}
    return state


def _top_level():
    """The function (gpu.func or func.func) of the gpu.module being traced
    into, or for the host (host.py) of the builtin.module."""
    op = ir.InsertionPoint.current().block.owner
    while op is not None and (op.parent is None or op.parent.name not in ("gpu.module", "builtin.module")):
        op = op.parent
    if op is None:
        raise CompileError("no gpu.module around the code being traced")
    return op


@contextlib.contextmanager
def gpu_module_scope():
    """Insert into the gpu.module (the host module when tracing for the host),
    before the function being traced."""
    with ir.InsertionPoint.before(_top_level()):
        yield


def unique_symbol(name):
    """`name`, or name_2, name_3, ...: a symbol not yet used in the gpu.module."""
    state = module_state()
    used = state.get("symbols")
    if used is None:
        used = state["symbols"] = {op.get_attribute("sym_name").value for op in _top_level().block.operations
                                   if "sym_name" in op.attributes}
    symbol, n = name, 1
    while symbol in used:
        n += 1
        symbol = f"{name}_{n}"
    used.add(symbol)
    return symbol


# ---------------------------------------------------------------------------
# Barriers

def syncthreads():
    """Wait until every thread of the block gets here, and make their shared
    and global memory writes visible to each other (gpu.barrier; CUDA's
    __syncthreads). Every thread of the block must reach the same call."""
    lang._trace()
    if host.active():
        # The CPU backend: the runtime's fiber switch, told the line for its errors.
        host.call("mg_cpu_barrier", [host.line()])
        return
    lang.emit("gpu.barrier")


# ---------------------------------------------------------------------------
# Vectors

class Vector:
    """A traced vector<n x dtype>: `v[k]` for a Python int k, `len(v)`,
    iteration (unrolled), `v.insert(k, x)`, and + - * / elementwise with a
    Vector of the same type, a traced scalar or a Python number (broadcast)."""

    __slots__ = ("value", "dtype", "length")

    def __init__(self, value, dtype, length):
        self.value, self.dtype, self.length = value, dtype, length

    def __repr__(self):
        return f"<traced vector {self.length}x{self.dtype.name}>"

    def __len__(self):
        return self.length

    def __bool__(self):
        raise CompileError("a vector has no Python truth value")

    def _position(self, k):
        if isinstance(k, lang.Scalar):
            raise CompileError("a vector is indexed by a Python int (its lanes are registers), not a traced value")
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise CompileError(f"a vector index must be an int, not {type(k).__name__}")
        k = int(k)
        if not -self.length <= k < self.length:
            raise CompileError(f"index {k} is out of range for a vector of {self.length}")
        return k % self.length

    def __getitem__(self, k):
        op = lang.emit("vector.extract", [self.value], [lang.ir_type(self.dtype)], attributes={
            "static_position": ir.Attribute.dense_i64_array([self._position(k)])})
        return lang.Scalar(op.result, self.dtype)

    def __setitem__(self, k, value):
        raise CompileError("a vector is a value: write `v = v.insert(k, x)`")

    def __iter__(self):
        return (self[k] for k in range(self.length))

    def insert(self, k, value):
        """This vector with lane k replaced by `value` (vector.insert)."""
        value = lang.coerce(value, self.dtype, "the vector's element type")
        op = lang.emit("vector.insert", [value, self.value], [self.value.type], attributes={
            "static_position": ir.Attribute.dense_i64_array([self._position(k)])})
        return Vector(op.result, self.dtype, self.length)

    def _operand(self, other, op):
        if isinstance(other, Vector):
            if other.dtype != self.dtype or other.length != self.length:
                raise CompileError(f"{op} of vectors {self.length}x{self.dtype.name} and "
                                   f"{other.length}x{other.dtype.name}: they must have one type")
            return other
        if isinstance(other, lang.Scalar) or lang._python_scalar(other):
            if isinstance(other, float) and not lang.is_float(self.dtype):
                raise CompileError(f"a Python float meets a {self.dtype.name} vector in {op}")
            scalar = lang.coerce(other, self.dtype, f"the vector's element type in {op}")
            broadcast = lang.emit("vector.broadcast", [scalar], [self.value.type])
            return Vector(broadcast.result, self.dtype, self.length)
        raise CompileError(f"unsupported operand for {op} with a vector: {type(other).__name__}")

    def _arith(self, other, float_op, int_op, op, reverse=False):
        other = self._operand(other, op)
        a, b = (other, self) if reverse else (self, other)
        if self.dtype == lang.bool_:
            raise CompileError(f"{op} on bool vectors")
        if float_op is None and lang.is_float(self.dtype):
            raise CompileError(f"{op} on {self.dtype.name} vectors")
        if int_op is None and not lang.is_float(self.dtype):
            raise CompileError(f"{op} on {self.dtype.name} vectors: / needs floats")
        name = float_op if lang.is_float(self.dtype) else int_op
        result = lang.emit("arith." + name, [a.value, b.value], [self.value.type], lang.arith_attributes(name))
        return Vector(result.result, self.dtype, self.length)

    def __add__(self, other): return self._arith(other, "addf", "addi", "+")
    def __radd__(self, other): return self._arith(other, "addf", "addi", "+", True)
    def __sub__(self, other): return self._arith(other, "subf", "subi", "-")
    def __rsub__(self, other): return self._arith(other, "subf", "subi", "-", True)
    def __mul__(self, other): return self._arith(other, "mulf", "muli", "*")
    def __rmul__(self, other): return self._arith(other, "mulf", "muli", "*", True)
    def __truediv__(self, other): return self._arith(other, "divf", None, "/")
    def __rtruediv__(self, other): return self._arith(other, "divf", None, "/", True)

    def __neg__(self):
        if lang.is_float(self.dtype):
            return Vector(lang.emit("arith.negf", [self.value], [self.value.type]).result, self.dtype, self.length)
        return self._arith(0, None, "subi", "-", True)


_VECTOR_BYTES = 16  # the widest access PTX has (ld.v4.b32, ld.v2.b64)


def _vector_access(what, memref, index, length):
    """(indices, vector type, alignment) of a vector access, or CompileError."""
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"{what} takes a memref first, not {type(memref).__name__}")
    if not isinstance(length, int) or isinstance(length, bool) or length not in (2, 4, 8):
        raise CompileError(f"{what}: the vector length must be 2 or 4 (8 for 16-bit types), not {length!r}")
    dtype = memref.dtype
    if dtype == lang.bool_ or dtype == lang.index:
        raise CompileError(f"{what} of {dtype.name} elements is not supported")
    nbytes = length * dtype.itemsize
    if nbytes > _VECTOR_BYTES:
        raise CompileError(f"{what}: {length} x {dtype.name} is {nbytes} bytes; a GPU vector access "
                           f"is at most {_VECTOR_BYTES} bytes")
    key = index if isinstance(index, tuple) else (index,)
    indices = memref._indices(key)
    inner = memref.shape[-1]
    last = key[-1]
    if inner is not None and len(memref.shape) > 1 and inner % length:
        raise CompileError(f"{what} of {length} needs rows whose length is a multiple of {length} "
                           f"(aligned to {nbytes} bytes); this memref's rows hold {inner}")
    if isinstance(last, (int, np.integer)) and not isinstance(last, bool):
        if last % length:
            raise CompileError(f"{what} of {length} at innermost index {last}: the index must be a "
                               f"multiple of {length} (aligned to {nbytes} bytes)")
        if inner is not None and last + length > inner:
            raise CompileError(f"{what} of {length} at innermost index {last} runs past the end ({inner})")
    host.check_bounds(memref, indices, host.VECTOR_LOAD if what == "mg.vload" else host.VECTOR_STORE, length)
    vector_type = ir.Type.vector([length], lang.ir_type(dtype))
    # On the host an access the GPU would fault on as misaligned must not crash the process.
    return indices, vector_type, ir.Attribute.integer(dtype.itemsize if host.active() else nbytes)


def vload(memref, index, length):
    """`length` consecutive elements along the innermost dimension, from
    `index` (an index or a tuple of indices), as a Vector (vector.load).

    The access is aligned to its size (16 bytes for 4 x f32): the innermost
    index must be a multiple of `length`, as for CUDA's float4 loads; a
    misaligned index is undefined behaviour on the GPU ("misaligned address")."""
    indices, vector_type, alignment = _vector_access("mg.vload", memref, index, length)
    op = lang.emit("vector.load", [memref.value, *indices], [vector_type], attributes={"alignment": alignment})
    return Vector(op.result, memref.dtype, length)


def vstore(memref, index, vector):
    """Store a Vector (or a tuple/list of values) at `index` along the
    innermost dimension (vector.store); aligned as for mg.vload."""
    if isinstance(vector, (tuple, list)):
        if not vector:
            raise CompileError("mg.vstore of an empty tuple")
        if not isinstance(memref, lang.MemRef):
            raise CompileError(f"mg.vstore takes a memref first, not {type(memref).__name__}")
        values = [lang.coerce(v, memref.dtype, "the memref's element type") for v in vector]
        vt = ir.Type.vector([len(values)], lang.ir_type(memref.dtype))
        vector = Vector(lang.emit("vector.from_elements", values, [vt]).result, memref.dtype, len(values))
    if not isinstance(vector, Vector):
        raise CompileError(f"mg.vstore stores a vector (from mg.vload, or a tuple of values), "
                           f"not {type(vector).__name__}")
    indices, vector_type, alignment = _vector_access("mg.vstore", memref, index, vector.length)
    if vector.dtype != memref.dtype:
        raise CompileError(f"mg.vstore of a {vector.dtype.name} vector into a {memref.dtype.name} memref: "
                           f"the element types must match")
    lang.emit("vector.store", [vector.value, memref.value, *indices], attributes={"alignment": alignment})


# ---------------------------------------------------------------------------
# printf

_CONVERSION = re.compile(r"%(?:%|[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?(hh|h|ll|l|j|z|t|L)?([diouxXeEfFgGaAcspn]))")


def _printf_value(value):
    """A printf argument promoted as C varargs are: small ints to 32 bits,
    floats to f64, index to 64 bits."""
    if isinstance(value, Vector):
        raise CompileError("mg.printf prints scalars: print a vector's elements v[0], v[1], ...")
    if isinstance(value, lang.MemRef):
        raise CompileError("mg.printf prints scalars, not a memref")
    if isinstance(value, (bool, np.bool_)):
        return lang.constant(int(value), lang.i32)
    if isinstance(value, (int, np.integer)):
        return lang.constant(int(value), lang.i32 if -2 ** 31 <= int(value) < 2 ** 31 else lang.i64)
    if isinstance(value, (float, np.floating)):
        return lang.constant(float(value), lang.f64)
    if not isinstance(value, lang.Scalar):
        raise CompileError(f"mg.printf prints traced values and Python numbers, not {type(value).__name__}")
    dtype = value.dtype
    if lang.is_float(dtype):
        return lang.cast(value, lang.f64)
    if dtype == lang.bool_:
        return lang.cast(value, lang.i32)
    if dtype == lang.index:
        return lang.cast(value, lang.i64)
    if dtype.itemsize < 4:
        return lang.cast(value, lang.u32 if dtype in lang.UNSIGNED else lang.i32)
    return value


def printf(format, *values):
    """Print from every thread that runs it (gpu.printf, CUDA's printf):
    the output reaches the process's stdout when the host synchronizes.
    `format` is a Python str with C conversions (%d %u %ld %f %e %g %x %c %%);
    values are traced scalars or Python numbers. Floats print as double,
    index values as 64-bit integers (%ld / %lu)."""
    if not isinstance(format, str):
        raise CompileError(f"mg.printf takes a Python str format first, not {type(format).__name__}")
    conversions = [m for m in _CONVERSION.finditer(format) if m.group(0) != "%%"]
    if any(m.group(2) in ("s", "p", "n") for m in conversions):
        raise CompileError("mg.printf: %s, %p and %n have no traced value to print")
    if "*" in "".join(m.group(0) for m in conversions):
        raise CompileError("mg.printf: a `*` width or precision is not supported")
    if len(conversions) != len(values):
        raise CompileError(f"mg.printf: the format has {len(conversions)} conversions but {len(values)} "
                           f"values were given")
    operands = [_printf_value(v) for v in values]
    if host.active():
        # The CPU backend: each value's bits, then the format's index; cpu.c formats them.
        for value in operands:
            host.call("mg_cpu_printf_arg", [host.to_bits(value)])
        host.call("mg_cpu_printf", [host.i32(host.string(format))])
        return
    lang.emit("gpu.printf", operands, attributes={"format": ir.Attribute.string(format)})


# ---------------------------------------------------------------------------
# Device functions

class DeviceFunction:
    """A Python function traced into a private func.func of the kernel's
    gpu.module, once per argument signature, and called with func.call."""

    __mlirgpu__ = True  # tracer._call lets traced values into it

    def __init__(self, function):
        if not inspect.isfunction(function):
            raise TypeError(f"@mg.func decorates a function, not {type(function).__name__}")
        self.function = function
        self.signature = inspect.signature(function)
        for p in self.signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise CompileError(f"device function {function.__qualname__}: *args and **kwargs are not "
                                   f"supported")
        functools.update_wrapper(self, function)
        self._rewritten = None

    def __repr__(self):
        return f"<mlirgpu device function {self.function.__qualname__}>"

    def rewritten(self):
        if self._rewritten is None:
            self._rewritten = tracer.rewrite(self.function, returns=True)
        return self._rewritten

    def __call__(self, *args, **kwargs):
        if lang.state.tracer is None:
            raise CompileError(f"device function {self.function.__qualname__} can only be called from a kernel "
                               f"(or another device function) while it is traced")
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise CompileError(f"device function {self.function.__qualname__}: {error}") from None
        bound.apply_defaults()
        args = list(bound.arguments.values())
        key = tuple(_argument_key(self.function, name, a) for name, a in zip(bound.arguments, args))
        state = module_state()
        stack = state.setdefault("device_stack", [])
        if self in stack:
            chain = " -> ".join(f.function.__qualname__ for f in stack[stack.index(self):] + [self])
            raise CompileError(f"device function {self.function.__qualname__} is recursive ({chain}): mlirgpu "
                               f"does not support recursion in device functions; write a loop")
        defined = state.setdefault("device_functions", {})
        entry = defined.get((self, key))
        if entry is None:
            stack.append(self)
            try:
                entry = defined[(self, key)] = self._define(args, state)
            finally:
                stack.pop()
        name, result_dtypes = entry
        operands = [a.value for a in args if isinstance(a, (lang.Scalar, lang.MemRef))]
        if host.active():  # the caller's thread, block and dims, as the host function's last arguments
            operands += [lang._trace().host_indices[key].value for key in host.INDICES]
        op = lang.emit("func.call", operands, [lang.ir_type(d) for d in result_dtypes],
                       attributes={"callee": ir.Attribute.symbol_ref(name)})
        results = [lang.Scalar(r, d) for r, d in zip(op.results, result_dtypes)]
        if not results:
            return None
        return results[0] if len(results) == 1 and not isinstance(entry, _TupleResult) else tuple(results)

    def _define(self, args, state):
        """Trace the function for these arguments into a func.func; (symbol, result dtypes)."""
        function = self.function
        code, free, generic_params, filename = self.rewritten()
        def_line = function.__code__.co_firstlineno
        where = ir.Location.file(filename, def_line, 0)
        name = unique_symbol(function.__name__)
        traced = [a for a in args if isinstance(a, (lang.Scalar, lang.MemRef))]
        types = [a.value.type for a in traced]
        on_host = host.active()
        if on_host:
            types += [ir.Type.index()] * len(host.INDICES)
        with gpu_module_scope():
            op = ir.Operation.create("func.func", regions=1, location=where, attributes={
                "sym_name": ir.Attribute.string(name),
                "sym_visibility": ir.Attribute.string("private"),
                "function_type": ir.Attribute.type_attr(ir.Type.function(types, []))})
        block = op.regions[0].append_block(types, [where] * len(types))
        block_args = iter(block.arguments)
        parameters = []
        for a in args:
            if isinstance(a, lang.Scalar):
                parameters.append(lang.Scalar(next(block_args), a.dtype))
            elif isinstance(a, lang.MemRef):
                parameters.append(type(a)(next(block_args), a.dtype, a.shape, a.name))
            else:
                parameters.append(a)  # a Python number: a constant of this specialization
        closure = dict(zip(function.__code__.co_freevars, (c.cell_contents for c in function.__closure__ or ())))
        generic_values = getattr(lang.state.tracer, "generic_values", {})
        for p in generic_params:
            if p in generic_values:
                closure[p] = generic_values[p]
        for n_ in free:
            if n_ not in closure:
                raise CompileError(f"{function.__qualname__}: no value for {n_!r}")
        instance = tracer.instantiate(function, code, free, closure)
        # Inside its body the function's own name is the rewritten def (a cell
        # of the maker): make it this DeviceFunction, so recursion is seen.
        if function.__name__ in instance.__code__.co_freevars:
            cell = instance.__closure__[instance.__code__.co_freevars.index(function.__name__)]
            cell.cell_contents = self
        from .kernel import Generic
        instance.__globals__.update({k: generic_values[v.name] for k, v in function.__globals__.items()
                                     if isinstance(v, Generic) and v.name in generic_values})
        codes = tracer.code_objects(instance.__code__)
        trace = tracer.Trace(codes, filename, def_line)
        trace.module_state = state
        trace.generic_values = generic_values
        if on_host:
            trace.host_indices = {key: lang.Scalar(v, lang.index) for key, v in zip(host.INDICES, block_args)}
        try:
            with trace, ir.InsertionPoint(block):
                result = instance(*parameters)
                try:
                    values = _results(function, result)
                except CompileError as error:
                    raise _at_return(function, filename, error) from None
                lang.emit("func.return", values)
        except Exception as error:
            raise tracer.trace_error(error, codes, filename) from None
        op.set_attribute("function_type", ir.Attribute.type_attr(
            ir.Type.function(types, [v.value.type for v in values])))
        dtypes = [v.dtype for v in values]
        return _TupleResult((name, dtypes)) if isinstance(result, tuple) else (name, dtypes)


class _TupleResult(tuple):
    """(symbol, dtypes) of a device function that returns a tuple (of any length)."""


def _results(function, result):
    if result is None:
        return []
    values = list(result) if isinstance(result, tuple) else [result]
    for v in values:
        if not isinstance(v, lang.Scalar):
            what = "a Python number (make it mg.constant(...))" if lang._python_scalar(v) else type(v).__name__
            raise CompileError(f"device function {function.__qualname__} returns {what}: it may return traced "
                               f"scalars, a tuple of them, or nothing")
    return values


def _at_return(function, filename, error):
    """`error` located at the function's return statement: returns are only
    allowed at its top level, so the first one there is the one that ran."""
    lines, first = inspect.getsourcelines(function)
    definition = ast.parse(textwrap.dedent("".join(lines))).body[0]
    returns = [s for s in definition.body if isinstance(s, ast.Return)]
    lineno = returns[0].lineno + first - 1 if returns else function.__code__.co_firstlineno
    return CompileError(f"{filename}:{lineno}: {error}\n    {linecache.getline(filename, lineno).strip()}")


def _argument_key(function, name, value):
    """What a specialization depends on for one argument."""
    if isinstance(value, lang.Scalar):
        return ("scalar", value.dtype)
    if isinstance(value, lang.MemRef):
        return ("memref", type(value), str(value.value.type), value.dtype, value.shape)
    if lang._python_scalar(value):
        return ("constant", type(value), value)
    raise CompileError(f"device function {function.__qualname__}: argument {name!r} is a "
                       f"{type(value).__name__}; device functions take traced scalars, memrefs and Python numbers")


def func(function):
    """`@mg.func`: a device function callable from kernels and from other
    device functions, traced per argument types (Python numbers are
    constants of the specialization) into a private func.func."""
    return DeviceFunction(function)
