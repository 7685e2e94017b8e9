"""Generics and array annotations: what a kernel's signature is written with.

    M, K, N, dtype = mg.generics("M K N dtype")
    def sgemm(A: mg.memref[M, K, dtype], ...)

A generic is a symbolic size or element type, given a concrete value by each
specialization of the kernel; `mg.memref[...]` annotates an array parameter
with its sizes (ints or generics) and element type (a dtype or a generic).
PEP 695 type parameters (`def f[M, N](...)`) are generics too.
"""
from __future__ import annotations

import typing

import numpy as np

from .. import _mlirgpu
from .._mlirgpu import CompileError, DType

__all__ = ["ALIGNMENT", "DIVISOR", "Generic", "Dynamic", "generics", "memref", "MemRefType", "as_element_type",
           "is_symbol", "symbol_name"]

#: The divisor a dynamic size is checked against at launch: a multiple of it gets a variant of its own
#: (the C dispatcher's signature, csrc/dispatch/dispatch.c, tells the two apart by the same number).
DIVISOR = 16
#: The alignment in bytes of array arguments that select a variant of their own (the dispatcher's too).
ALIGNMENT = 16


class Generic:
    """A symbolic size or dtype of a kernel, given a value per specialization.
    Generics made by one mg.generics call keep its order, which is the order
    of kernel[...] values when a kernel does not list them itself. A dynamic
    one is a size known only at launch: one compile serves every value."""

    __slots__ = ("name", "order", "dynamic")
    _made = 0

    def __init__(self, name: str, dynamic: bool = False) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a generic's name must be an identifier, got {name!r}")
        if not isinstance(dynamic, bool):
            raise ValueError(f"mg.generics(..., dynamic=...) takes True or False, not {dynamic!r}")
        self.name, self.dynamic = name, dynamic
        self.order = Generic._made
        Generic._made += 1

    def __repr__(self):
        return f"mg.generic({self.name}{', dynamic' if self.dynamic else ''})"


class Dynamic:
    """A dynamic generic's value in a specialization: the size itself is read
    at launch, and what the variant knows of it is that it is a multiple of
    `multiple` (DIVISOR, or 1 for any size)."""

    __slots__ = ("multiple",)

    def __init__(self, multiple: int) -> None:
        self.multiple = multiple

    @classmethod
    def of(cls, size: int) -> Dynamic:
        """The variant that serves `size`."""
        return cls(DIVISOR if size % DIVISOR == 0 else 1)

    def __eq__(self, other):
        return isinstance(other, Dynamic) and other.multiple == self.multiple

    def __hash__(self):
        return hash((Dynamic, self.multiple))

    def __repr__(self):
        return f"dynamic(multiple of {self.multiple})" if self.multiple > 1 else "dynamic"


def generics(names: str, *, dynamic: bool = False) -> Generic | tuple[Generic, ...]:
    """Make the symbolic sizes and element types of a kernel.

    Several names give a tuple, one name gives that one generic (as
    sympy.symbols does)::

        M, K, N, dtype = mg.generics("M K N dtype")
        N = mg.generics("N")

    `dynamic=True` makes sizes known only at launch: each is an extent of an
    array parameter, read from the array and passed to the kernel, so one
    compile serves every value. A size that is a multiple of 16 selects a
    variant of its own, compiled knowing so (it may vectorize);
    `mg.assume(M % 64 == 0)` in the kernel states more.

        @mg.kernel
        def scale(x: mg.memref[N, mg.f32], a: mg.f32):
            i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
            x[i] = a * x[i]
    """
    if not isinstance(names, str):
        raise TypeError("mg.generics takes the names in one string, e.g. 'M K N dtype'")
    made = tuple(Generic(name, dynamic) for name in names.replace(",", " ").split())
    if not made:
        raise ValueError("mg.generics needs at least one name, e.g. mg.generics('N')")
    return made[0] if len(made) == 1 else made


def as_element_type(entry: object) -> object:
    """A dtype given as an mlirgpu dtype or a NumPy one (np.float32,
    np.dtype('f4')), as an mlirgpu dtype; anything else is returned as is."""
    if isinstance(entry, np.dtype) or (isinstance(entry, type) and issubclass(entry, np.generic)):
        try:
            return _mlirgpu.dtype(entry)
        except (TypeError, ValueError) as error:
            raise CompileError(f"{entry!r} has no mlirgpu dtype: {error}") from None
    return entry


def is_symbol(x: object) -> bool:
    return isinstance(x, Generic) or isinstance(x, typing.TypeVar)


class MemRefType:
    """The annotation `mg.memref[d0, d1, ..., dtype]`: each size an int, a
    generic or None (a dynamic extent: any size, read in the kernel as
    `A.shape[d]`, and no new compile for a new size), the element type a
    dtype or a generic."""

    def __init__(self, params: object) -> None:
        params = params if isinstance(params, tuple) else (params,)
        if len(params) < 2:
            raise CompileError("mg.memref[...] takes the sizes and then the element type, e.g. mg.memref[M, K, mg.f32]")
        *shape, dtype = params
        dtype = as_element_type(dtype)
        for size in shape:
            if not (size is None or is_symbol(size) or (isinstance(size, int) and not isinstance(size, bool)
                                                        and size > 0)):
                raise CompileError(f"memref sizes are positive ints, generics or None (known at launch), "
                                   f"not {size!r}")
        if not (is_symbol(dtype) or isinstance(dtype, DType)):
            raise CompileError(f"the last entry of mg.memref[...] is the element type (a dtype or a generic), "
                               f"not {dtype!r}")
        self.shape, self.dtype = tuple(shape), dtype
        self.is_readonly = self.is_noalias = False

    def readonly(self) -> MemRefType:
        """This annotation for an array the kernel only reads and that no other
        parameter aliases (CUDA's `const T* __restrict__`): loads through it
        may use the read-only data cache (PTX ld.global.nc), and storing to
        it is a CompileError."""
        copy = self.noalias()
        copy.is_readonly = True
        return copy

    def noalias(self) -> MemRefType:
        """This annotation for an array no other parameter aliases (CUDA's
        `T* __restrict__`): LLVM may reorder and combine its accesses."""
        copy = MemRefType(self.shape + (self.dtype,))
        copy.is_readonly, copy.is_noalias = self.is_readonly, True
        return copy

    def __repr__(self):
        text = f"mg.memref[{', '.join(map(_name, self.shape + (self.dtype,)))}]"
        return text + (".readonly()" if self.is_readonly else ".noalias()" if self.is_noalias else "")


def _name(x):
    if x is None:
        return "None"
    return x.__name__ if isinstance(x, typing.TypeVar) else x.name if isinstance(x, (Generic, DType)) else repr(x)


class memref:
    """The annotation of an array parameter: its sizes, then its element type.

    Sizes are positive ints or generics; the element type is an mlirgpu dtype,
    a NumPy one (``np.float32``) or a generic::

        M, N = mg.generics("M N")

        @mg.kernel
        def fill(out: mg.memref[M, N, np.float32], value: mg.f32):
            out[mg.thread_idx.y, mg.thread_idx.x] = value
    """

    def __class_getitem__(cls, params: object) -> MemRefType:
        return MemRefType(params)


def symbol_name(symbol: Generic | typing.TypeVar) -> str:
    """The name of a generic (or PEP 695 type parameter)."""
    return symbol.name if isinstance(symbol, Generic) else symbol.__name__


