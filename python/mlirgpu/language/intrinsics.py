"""Device-side building blocks of kernels: barriers, fences, vector loads
and stores, printf.

    mg.syncthreads()                     # gpu.barrier
    mg.threadfence()                     # membar.gl (block, system: membar.cta, membar.sys)
    v = mg.vload(A, (i, j), 4)           # vector.load: vector<4xf32>, v[0] .. v[3]
    mg.vstore(B, (i, j), v * 2.0)        # vector.store
    mg.printf("%d: %f\\n", i, x)          # gpu.printf (vprintf)
    mg.assume(M % 64 == 0)               # llvm.intr.assume: a fact the compiler may use
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .. import ir
from .._mlirgpu import CompileError
from . import core as lang

if TYPE_CHECKING:
    from .._mlirgpu import DType

__all__ = ["assume", "syncthreads", "threadfence", "threadfence_block", "threadfence_system", "vload", "vstore",
           "Vector", "load", "store", "LOAD_HINTS", "STORE_HINTS", "printf"]


# ---------------------------------------------------------------------------
# Facts

def assume(condition: lang.Scalar | bool) -> None:
    """State a fact the compiler may rely on (llvm.intr.assume; Triton's
    tl.assume), typically of a dynamic size::

        M = mg.generics("M", dynamic=True)
        ...
        mg.assume(M % 64 == 0)          # launches with other sizes are undefined

    A condition that Python decides (a generic with a value) must hold:
    a false one is a CompileError for the specialization."""
    if isinstance(condition, (bool, np.bool_)):
        if not condition:
            raise CompileError("mg.assume(...) is false for this specialization")
        return
    if not isinstance(condition, lang.Scalar) or condition.dtype != lang.bool_:
        raise CompileError(f"mg.assume takes a traced bool (a comparison), not {condition!r}")
    lang.emit("llvm.intr.assume", [condition], attributes={"op_bundle_sizes": ir.Attribute.dense_i32_array([]),
                                                           "op_bundle_tags": ir.Attribute.array([])})


# ---------------------------------------------------------------------------
# Barriers

def syncthreads() -> None:
    """Wait until every thread of the block gets here, and make their shared
    and global memory writes visible to each other (gpu.barrier; CUDA's
    __syncthreads). Every thread of the block must reach the same call.

    For example::

        tile[t] = x[i]
        mg.syncthreads()                       # every thread's write is done
        y[i] = tile[TILE - 1 - t]
    """
    lang.target().barrier()


# ---------------------------------------------------------------------------
# Fences (docs/language_more.md, "The memory model")

def threadfence() -> None:
    """Order this thread's memory accesses for every thread of the device:
    all its writes before the fence are seen by any thread that sees a write
    after it (CUDA's __threadfence; PTX membar.gl).

    For example::

        partial[mg.block_idx.x] = total       # publish this block's result
        mg.threadfence()                       # before the counter says it is there
        done = mg.atomic.add(counter, 0, 1)
    """
    lang.target().fence("gpu")


def threadfence_block() -> None:
    """As mg.threadfence, among the threads of the block (__threadfence_block; membar.cta).

    For example::

        flags[mg.thread_idx.x] = 1
        mg.threadfence_block()
    """
    lang.target().fence("cta")


def threadfence_system() -> None:
    """As mg.threadfence, also for the host and peer devices (__threadfence_system; membar.sys).

    For example::

        mailbox[0] = value                     # pinned host memory the host polls
        mg.threadfence_system()
        ready[0] = 1
    """
    lang.target().fence("sys")


# ---------------------------------------------------------------------------
# Vectors

class Vector:
    """A traced vector<n x dtype>: `v[k]` for a Python int k, `len(v)`,
    iteration (unrolled), `v.insert(k, x)`, and + - * / elementwise with a
    Vector of the same type, a traced scalar or a Python number (broadcast)."""

    __slots__ = ("value", "dtype", "length")

    def __init__(self, value: ir.Value, dtype: DType, length: int) -> None:
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

    def __getitem__(self, k: int) -> lang.Scalar:
        op = lang.emit("vector.extract", [self.value], [lang.ir_type(self.dtype)], attributes={
            "static_position": ir.Attribute.dense_i64_array([self._position(k)])})
        return lang.Scalar(op.result, self.dtype)

    def __setitem__(self, k, value):
        raise CompileError("a vector is a value: write `v = v.insert(k, x)`")

    def __iter__(self):
        return (self[k] for k in range(self.length))

    def insert(self, k: int, value: lang.Number) -> Vector:
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
        if isinstance(other, lang.Scalar) or lang.is_python_number(other):
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
            return Vector(lang.emit("arith.negf", [self.value], [self.value.type],
                                    lang.arith_attributes("negf")).result, self.dtype, self.length)
        return self._arith(0, None, "subi", "-", True)


_VECTOR_BYTES = 16  # the widest access PTX has (ld.v4.b32, ld.v2.b64)


def _vector_access(what, memref, index, length):
    """(indices, vector type, alignment) of a vector access, or CompileError."""
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"{what} takes a memref first, not {type(memref).__name__}")
    if not isinstance(length, int) or isinstance(length, bool) or length not in (2, 4, 8, 16):
        raise CompileError(f"{what}: the vector length must be 2 or 4 (8 for 16-bit types, 16 for 8-bit "
                           f"ones), not {length!r}")
    dtype = memref.dtype
    if dtype == lang.bool_ or dtype == lang.index:
        raise CompileError(f"{what} of {dtype.name} elements is not supported")
    nbytes = length * dtype.itemsize
    if nbytes > _VECTOR_BYTES:
        raise CompileError(f"{what}: {length} x {dtype.name} is {nbytes} bytes; a GPU vector access "
                           f"is at most {_VECTOR_BYTES} bytes")
    key = index if isinstance(index, tuple) else (index,)
    indices = memref._indices(key)
    inner = memref.extents[-1]
    last = key[-1]
    if inner is not None and len(memref.extents) > 1 and inner % length:
        raise CompileError(f"{what} of {length} needs rows whose length is a multiple of {length} "
                           f"(aligned to {nbytes} bytes); this memref's rows hold {inner}")
    if isinstance(last, (int, np.integer)) and not isinstance(last, bool):
        if last % length:
            raise CompileError(f"{what} of {length} at innermost index {last}: the index must be a "
                               f"multiple of {length} (aligned to {nbytes} bytes)")
        if inner is not None and last + length > inner:
            raise CompileError(f"{what} of {length} at innermost index {last} runs past the end ({inner})")
    target = lang.target()
    target.check_access(memref, indices, lang.VECTOR_LOAD if what == "mg.vload" else lang.VECTOR_STORE, length)
    vector_type = ir.Type.vector([length], lang.ir_type(dtype))
    return indices, vector_type, ir.Attribute.integer(target.vector_alignment(dtype, nbytes))


def vload(memref: lang.MemRef, index: lang.Indices, length: int, cache: str | None = None) -> Vector:
    """`length` consecutive elements along the innermost dimension, from
    `index` (an index or a tuple of indices), as a Vector (vector.load).

    The access is aligned to its size (16 bytes for 4 x f32): the innermost
    index must be a multiple of `length`, as for CUDA's float4 loads; a
    misaligned index is undefined behaviour on the GPU ("misaligned address").
    `cache` is a load hint, as for mg.load.

    For example::

        v = mg.vload(A, (row, col), 4)      # one 16-byte load of 4 float32
        mg.vstore(B, (row, col), v * 2.0)
    """
    indices, vector_type, alignment = _vector_access("mg.vload", memref, index, length)
    if cache is not None:
        return lang.target().hinted_load(memref, indices, length, _hint("mg.vload", cache, LOAD_HINTS, memref))
    op = lang.emit("vector.load", [memref.value, *indices], [vector_type], attributes={"alignment": alignment})
    return Vector(op.result, memref.dtype, length)


def vstore(memref: lang.MemRef, index: lang.Indices, vector: Vector | Sequence[lang.Number],
           cache: str | None = None) -> None:
    """Store a Vector (or a tuple/list of values) at `index` along the
    innermost dimension (vector.store); aligned as for mg.vload. `cache` is
    a store hint, as for mg.store.

    For example::

        mg.vstore(B, (row, col), mg.vload(A, (row, col), 4))
        mg.vstore(B, i, (a, b, c, d))             # a tuple of four values
    """
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
    memref.check_writable("mg.vstore")
    indices, vector_type, alignment = _vector_access("mg.vstore", memref, index, vector.length)
    if vector.dtype != memref.dtype:
        raise CompileError(f"mg.vstore of a {vector.dtype.name} vector into a {memref.dtype.name} memref: "
                           f"the element types must match")
    if cache is not None:
        lang.target().hinted_store(memref, indices, vector, _hint("mg.vstore", cache, STORE_HINTS, memref))
        return
    lang.emit("vector.store", [vector.value, memref.value, *indices], attributes={"alignment": alignment})


# ---------------------------------------------------------------------------
# Loads and stores with cache hints

#: Load hints and their PTX (CUDA's __ldg, __ldcs, __ldlu and the L1 eviction priorities).
LOAD_HINTS = {"readonly": "ld.global.nc", "streaming": "ld.global.cs", "last_use": "ld.global.lu",
              "evict_first": "ld.global.L1::evict_first", "evict_last": "ld.global.L1::evict_last",
              "no_allocate": "ld.global.L1::no_allocate"}
#: Store hints and their PTX (CUDA's __stcs, __stwt and the L1 eviction priorities).
STORE_HINTS = {"streaming": "st.global.cs", "write_through": "st.global.wt",
               "evict_first": "st.global.L1::evict_first", "evict_last": "st.global.L1::evict_last",
               "no_allocate": "st.global.L1::no_allocate"}


def _hint(what, cache, hints, memref):
    if cache not in hints:
        raise CompileError(f"{what}: cache must be one of {', '.join(map(repr, hints))}, not {cache!r}")
    if not isinstance(memref, lang.MemRef) or lang.address_space(memref):
        raise CompileError(f"{what}: cache hints are for arrays in global memory (kernel parameters)")
    return cache


def load(memref: lang.MemRef, index: lang.Indices, cache: str | None = None) -> lang.Scalar:
    """memref[index], with a cache hint (LOAD_HINTS): "readonly" reads through
    the read-only data cache (PTX ld.global.nc, CUDA's __ldg: the array must
    not change during the kernel), "streaming" marks the line as used once
    (ld.global.cs, __ldcs), "last_use" (ld.global.lu), "evict_first",
    "evict_last" and "no_allocate" set the L1 eviction priority. None is a
    plain load. On the CPU backend a hint is a plain load (the host's caches
    take none).

    For example::

        w = mg.load(weights, i, cache="readonly")      # ld.global.nc
        x = mg.load(stream_in, i, cache="streaming")   # ld.global.cs: read once
    """
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"mg.load takes a memref first, not {type(memref).__name__}")
    if cache is None:
        return memref[index]
    if memref.dtype in (lang.bool_, lang.index) or memref.dtype.itemsize < 2:
        raise CompileError(f"mg.load with a cache hint of {memref.dtype.name} elements is not supported")
    indices = memref._indices(index)
    lang.target().check_access(memref, indices, lang.LOAD)
    return lang.target().hinted_load(memref, indices, None, _hint("mg.load", cache, LOAD_HINTS, memref))


def store(memref: lang.MemRef, index: lang.Indices, value: lang.Number, cache: str | None = None) -> None:
    """memref[index] = value, with a cache hint (STORE_HINTS): "streaming"
    (st.global.cs, CUDA's __stcs: data not read again soon), "write_through"
    (st.global.wt), "evict_first", "evict_last", "no_allocate". None is a
    plain store; on the CPU backend every store is.

    For example::

        mg.store(out, i, y, cache="streaming")         # st.global.cs: written once, not read back
    """
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"mg.store takes a memref first, not {type(memref).__name__}")
    if cache is None:
        memref[index] = value
        return
    memref.check_writable("mg.store")
    if memref.dtype in (lang.bool_, lang.index) or memref.dtype.itemsize < 2:
        raise CompileError(f"mg.store with a cache hint of {memref.dtype.name} elements is not supported")
    indices = memref._indices(index)
    value = lang.coerce(value, memref.dtype, "the memref's element type")
    lang.target().check_access(memref, indices, lang.STORE)
    lang.target().hinted_store(memref, indices, value, _hint("mg.store", cache, STORE_HINTS, memref))


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


def printf(format: str, *values: lang.Number) -> None:
    """Print from every thread that runs it (gpu.printf, CUDA's printf):
    the output reaches the process's stdout when the host synchronizes.
    `format` is a Python str with C conversions (%d %u %ld %f %e %g %x %c %%);
    values are traced scalars or Python numbers. Floats print as double,
    index values as 64-bit integers (%ld / %lu).

    For example::

        mg.printf("thread %ld: x = %f\n", mg.thread_idx.x, x[i])
    """
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
    lang.target().printf(format, [_printf_value(v) for v in values])
