"""Generics and array annotations: what a kernel's signature is written with.

    M, K, N, dtype = mg.generics("M K N dtype")
    def sgemm(A: mg.memref[M, K, dtype], ...)

A generic is a symbolic size or element type, given a concrete value by each
specialization of the kernel; `mg.memref[...]` annotates an array parameter
with its sizes (ints or generics) and element type (a dtype or a generic).
PEP 695 type parameters (`def f[M, N](...)`) are generics too.
"""
import typing

from .._mlirgpu import CompileError, DType

__all__ = ["Generic", "generics", "memref", "MemRefType", "is_symbol", "symbol_name"]


class Generic:
    """A symbolic size or dtype of a kernel, given a value per specialization.
    Generics made by one mg.generics call keep its order, which is the order
    of kernel[...] values when a kernel does not list them itself."""

    __slots__ = ("name", "order")
    _made = 0

    def __init__(self, name):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a generic's name must be an identifier, got {name!r}")
        self.name = name
        self.order = Generic._made
        Generic._made += 1

    def __repr__(self):
        return f"mg.generic({self.name})"


def generics(names):
    """`M, K, N, dtype = mg.generics("M K N dtype")`"""
    if not isinstance(names, str):
        raise TypeError("mg.generics takes the names in one string, e.g. 'M K N dtype'")
    return tuple(Generic(name) for name in names.replace(",", " ").split())


def is_symbol(x):
    return isinstance(x, Generic) or isinstance(x, typing.TypeVar)


class MemRefType:
    """The annotation `mg.memref[d0, d1, ..., dtype]`: each size an int, a
    generic or None (a dynamic extent: any size, read in the kernel as
    `A.shape[d]`, and no new compile for a new size), the element type a
    dtype or a generic."""

    def __init__(self, params):
        params = params if isinstance(params, tuple) else (params,)
        if len(params) < 2:
            raise CompileError("mg.memref[...] takes the sizes and then the element type, e.g. mg.memref[M, K, mg.f32]")
        *shape, dtype = params
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

    def readonly(self):
        """This annotation for an array the kernel only reads and that no other
        parameter aliases (CUDA's `const T* __restrict__`): loads through it
        may use the read-only data cache (PTX ld.global.nc), and storing to
        it is a CompileError."""
        copy = self.noalias()
        copy.is_readonly = True
        return copy

    def noalias(self):
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
    """`mg.memref[M, K, dtype]`: the annotation of an array parameter."""

    def __class_getitem__(cls, params):
        return MemRefType(params)


def symbol_name(symbol):
    """The name of a generic (or PEP 695 type parameter)."""
    return symbol.name if isinstance(symbol, Generic) else symbol.__name__


