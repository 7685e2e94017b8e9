"""mg.shared: workgroup (shared) memory inside a kernel.

    tile = mg.shared.array((16, 16), mg.f32)   # static: a memref.global in the gpu.module
    buf = mg.shared.dynamic(mg.f32)            # the launch's shared_mem bytes, as f32
    a, b = buf[0:256], buf[256:512]            # 1-d slices are views (memref.subview)
    where = mg.shared.address(b, 16)           # u32 shared-memory address of b[16] (TMA, wgmma, mbarrier)

Static arrays are `memref.global`s in address space 3
(`#gpu.address_space<workgroup>`) of the kernel's gpu.module, read with
`memref.get_global`; each call site in the source is one array, as a
`__shared__` declaration is in CUDA (a call traced twice, in a loop body or
in both probes of a traced `if`, gets the same array). Together they may hold
48 KB per kernel, the static limit CUDA gives every chip.

Dynamic shared memory is one external, zero-sized, 16-byte aligned
`memref.global` (PTX `.extern .shared .align 16 .b8 __mg_dynamic_shared[]`),
viewed as a 1-d memref of the dtype whose length is the launch's
`shared_mem` divided by the dtype's size (PTX `%dynamic_smem_size`).
`gpu.dynamic_shared_memory` is not used: MLIR 22 lowers it to an *internal*
zero-sized global that the NVPTX back end demotes to a one-byte static
variable (ptxas warns of out-of-bound accesses, and the buffer may then
overlap static shared arrays).
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .. import ir
from .._mlirgpu import CompileError
from . import core as lang

if TYPE_CHECKING:
    from .._mlirgpu import DType

__all__ = ["array", "dynamic", "size", "address", "SharedMemRef", "STATIC_LIMIT"]

STATIC_LIMIT = 48 * 1024  # bytes of static shared memory a kernel may declare
_KDYNAMIC = ir.DYNAMIC  # ShapedType::kDynamic in static_offsets/static_sizes


def _type_text(shape, dtype, layout=None):
    dims = "".join(f"{'?' if d is None else d}x" for d in shape)
    layout = f", {layout}" if layout else ""
    return f"memref<{dims}{lang.ir_type(dtype)}{layout}{lang.target().shared_memory_space()}>"


class SharedMemRef(lang.MemRef):
    """A memref in workgroup memory: loads, stores, atomics and vector
    accesses as any MemRef, plus 1-d slices `s[a:b]` that are views."""

    __slots__ = ()

    def __repr__(self):
        dims = "x".join("?" if d is None else str(d) for d in self.extents)
        return f"<traced shared memref {dims}x{self.dtype.name}>"

    def __getitem__(self, key: lang.Indices | slice) -> lang.Scalar | SharedMemRef:
        if isinstance(key, slice):
            return self._slice(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if isinstance(key, slice):
            raise CompileError("cannot assign to a slice of shared memory: store element by element")
        super().__setitem__(key, value)

    def __len__(self):
        if self.extents[0] is None:
            raise CompileError("the length of dynamic shared memory is only known at launch: use mg.shared.size(s)")
        return self.extents[0]

    def _slice(self, key):
        if len(self.extents) != 1:
            raise CompileError(f"only 1-d shared memory can be sliced; this one is {len(self.extents)}-d")
        if key.step is not None and not (isinstance(key.step, int) and key.step == 1):
            raise CompileError("a slice of shared memory takes no step: s[a:b]")
        start, stop = key.start, key.stop
        for bound in (start, stop):
            if isinstance(bound, (int,)) and not isinstance(bound, bool) and bound < 0:
                raise CompileError(f"a slice bound of shared memory cannot be negative, got {bound}")
        length = self.extents[0]
        if start is None:
            start = 0
        if stop is None:
            stop = length if length is not None else size(self)
        static_start = start if _is_int(start) else None
        static_stop = stop if _is_int(stop) else None
        if static_stop is not None and length is not None and static_stop > length:
            raise CompileError(f"slice [{start}:{stop}] is out of bounds of shared memory of length {length}")
        if static_start is not None and static_stop is not None and static_start > static_stop:
            raise CompileError(f"empty or reversed slice [{start}:{stop}] of shared memory")
        operands, offsets, sizes = [], [], []
        if static_start is not None:
            offsets.append(int(static_start))
        else:
            operands.append(lang.as_index(start, "slice bound"))
            offsets.append(_KDYNAMIC)
        if static_start is not None and static_stop is not None:
            count = int(static_stop) - int(static_start)
            sizes.append(count)
            size_operands = []
        else:
            count = None
            size_operands = [lang.as_index(stop, "slice bound") - lang.as_index(start, "slice bound")]
            sizes.append(_KDYNAMIC)
        # The source's offset adds to this one: static only when both are.
        source_offset = _static_offset(self.value.type)
        offset = None if static_start is None or source_offset is None else source_offset + int(static_start)
        layout = f"strided<[1], offset: {'?' if offset is None else offset}>"
        result = ir.Type.parse(_type_text([count], self.dtype, layout))
        op = lang.emit("memref.subview", [self.value, *operands, *size_operands], [result], attributes={
            "operandSegmentSizes": ir.Attribute.dense_i32_array([1, len(operands), len(size_operands), 0]),
            "static_offsets": ir.Attribute.dense_i64_array(offsets),
            "static_sizes": ir.Attribute.dense_i64_array(sizes),
            "static_strides": ir.Attribute.dense_i64_array([1])})
        return SharedMemRef(op.result, self.dtype, (count,), "shared")


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _static_offset(memref_type):
    """The static offset of a memref type's layout (0 for the identity), or None."""
    text = str(memref_type)
    if "strided<" not in text:
        return 0
    marker = "offset: "
    at = text.find(marker)
    if at < 0:
        return 0
    rest = text[at + len(marker):]
    digits = rest[:min(i for i in (rest.find(">"), rest.find(",")) if i >= 0)].strip()
    return None if digits == "?" else int(digits)


def _shape(shape):
    shape = shape if isinstance(shape, (tuple, list)) else (shape,)
    if not shape:
        raise CompileError("mg.shared.array needs at least one dimension")
    for d in shape:
        if isinstance(d, lang.Scalar):
            raise CompileError("mg.shared.array needs Python int sizes (a generic's value works): "
                               "for a size known only at launch, use mg.shared.dynamic")
        if not _is_int(d) or d <= 0:
            raise CompileError(f"shared memory sizes are positive ints, not {d!r}")
    return tuple(int(d) for d in shape)


def _call_site():
    """(code, bytecode offset) of the user's call: one shared array per call site."""
    trace = lang.current_trace()
    frame = sys._getframe(2)
    while frame is not None and frame.f_code not in trace.codes:
        frame = frame.f_back
    return (frame.f_code, frame.f_lasti) if frame is not None else None


def array(shape: int | tuple[int, ...], dtype: DType) -> SharedMemRef:
    """A static shared-memory array of `shape` (ints) and `dtype`, one per
    call site, visible to every thread of the block."""
    site = _call_site()
    shape, dtype = _shape(shape), lang.as_dtype(dtype)
    state = lang.module_state()
    arrays = state.setdefault("shared_arrays", {})
    key = (site, shape, dtype)
    type_text = _type_text(shape, dtype)
    name = arrays.get(key)
    if name is None:
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        total = state.get("shared_bytes", 0) + nbytes
        if total > STATIC_LIMIT:
            raise CompileError(f"too much static shared memory: this array takes {nbytes} bytes, bringing the "
                               f"kernel to {total} bytes, over the {STATIC_LIMIT}-byte (48 KB) limit; use "
                               f"mg.shared.dynamic and the launch's shared_mem= for more")
        state["shared_bytes"] = total
        name = arrays[key] = lang.target().static_shared(state, shape, dtype, type_text, nbytes)
    return SharedMemRef(lang.target().static_shared_value(name, type_text), dtype, shape, "shared")


def dynamic(dtype: DType) -> SharedMemRef:
    """The launch's dynamic shared memory (`shared_mem=` bytes) as a 1-d
    array of `dtype`, 16-byte aligned; every call views the same bytes."""
    dtype = lang.as_dtype(dtype)
    raw, nbytes = lang.target().dynamic_shared_bytes(lang.module_state())
    count = nbytes // dtype.itemsize if dtype.itemsize > 1 else nbytes
    view = lang.emit("memref.view", [raw, lang.constant(0, lang.index), count],
                     [ir.Type.parse(_type_text([None], dtype))]).result
    return SharedMemRef(view, dtype, (None,), "shared")


def size(memref: lang.MemRef) -> lang.Scalar:
    """The number of elements of a 1-d memref as a traced index (memref.dim)."""
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"mg.shared.size takes a memref, not {type(memref).__name__}")
    if memref.extents[0] is not None:
        return lang.constant(memref.extents[0], lang.index)
    op = lang.emit("memref.dim", [memref.value, lang.constant(0, lang.index)], [ir.Type.index()])
    return lang.Scalar(op.result, lang.index)


def address(memref: SharedMemRef, offset: lang.Index = 0) -> lang.Scalar:
    """The shared-memory address (u32, in the shared window, as PTX's
    `.shared` instructions and wgmma descriptors take it) of element
    `offset` (an int or traced integer, in the memref's elements, counted
    from its first element) of a shared memref."""
    if not isinstance(memref, SharedMemRef):
        raise CompileError(f"mg.shared.address takes a shared-memory array, not {type(memref).__name__}")
    rank = len(memref.shape)
    base_type = ir.Type.parse(f"memref<{lang.ir_type(memref.dtype)}{lang.target().shared_memory_space()}>")
    pointer = lang.emit("memref.extract_aligned_pointer_as_index", [memref.value], [ir.Type.index()]).result
    metadata = lang.emit("memref.extract_strided_metadata", [memref.value],
                         [base_type] + [ir.Type.index()] * (1 + 2 * rank))
    elements = lang.Scalar(metadata.results[1], lang.index) + lang.as_index(offset, "the address's offset")
    byte_address = lang.Scalar(pointer, lang.index) + elements * memref.dtype.itemsize
    return lang.cast(byte_address, lang.u32)
