"""The IR of an element-wise kernel (@mg.vectorize): its linalg.generic form
and the two ways it reaches the GPU.

Every form is traced from the same scalar Python function, applied to
traced scalars by `apply` (vectorize.py), so they compute the same thing:

    linalg           func.func @f(inputs..., outputs...) holding one
                     linalg.generic over memrefs with identity maps and
                     parallel iterators. The CPU backend lowers it to loops;
                     the "parallel-loops" mapping lowers it to the GPU with
                     MLIR's passes (parallel_loops_pipeline below).
    direct           a gpu.func written here in the kernel language: over
                     contiguous arrays each thread loads `unroll` vectors of
                     `width` elements of every input before computing, a
                     warp's vectors adjacent (16-byte loads, coalesced); over
                     strided arrays (broadcasts, views) a grid-stride loop of
                     one element per thread.

Arrays are memrefs of dynamic sizes: rank 1 with the identity layout when
every array of a call is C-contiguous with the output's shape (the call
flattens them), else the output's rank with a strided layout whose strides
the call gives, 0 along broadcast dimensions (as NumPy's broadcast views).

With `flags`, every form takes one more parameter after the outputs: a
memref<?xi1> of fault flags that `apply` may store to (vectorize.py sets
one where an element's integer division gives a NumPy warning), on the
host and on the GPU alike.
"""
import functools

from .. import ir
from ..language import core as lang
from ..language import intrinsics as device
from ..language.core import block_idx, grid_dim, static_range, thread_idx
from .rewrite import rewrite
from .trace import instantiate

__all__ = ["memref_type", "linalg_function", "direct_kernel", "parallel_loops_pipeline"]

# MLIR's mapping of a linalg.generic to the GPU: parallel loops, the first
# tiled by a block of threads (the others by 1), the tile loops mapped to
# blocks and the loops inside a tile to threads, loop d0 to x, d1 to y, d2 to
# z. The GPU's form of the linalg.generic iterates in reversed order, so that
# x runs along the arrays' last (contiguous) dimension: its loads coalesce.
PARALLEL_LOOPS_THREADS = 256


def parallel_loops_pipeline(rank):
    """The pass pipeline of the parallel-loops mapping for a linalg form of `rank` loops."""
    tiles = ",".join([str(PARALLEL_LOOPS_THREADS)] + ["1"] * (rank - 1))
    return ("builtin.module(func.func(convert-linalg-to-parallel-loops, "
            f"scf-parallel-loop-tiling{{parallel-loop-tile-sizes={tiles} no-min-max-bounds=1}}, "
            "gpu-map-parallel-loops, convert-parallel-loops-to-gpu), canonicalize, cse)")


def memref_type(dtype, rank):
    """rank None: memref<?xT> (contiguous, flattened); else a strided memref of that rank."""
    element = lang.ir_type(dtype)
    if rank is None:
        return ir.Type.memref([None], element)
    return ir.Type.memref([None] * rank, element, layout=ir.Attribute.strided_layout(None, [None] * rank))


def _parameter_types(inputs, outputs, rank, flags):
    types = [memref_type(dtype, rank) if is_array else lang.ir_type(dtype) for dtype, is_array in inputs]
    return types + [memref_type(dtype, rank) for dtype in outputs] + [memref_type(lang.bool_, None)] * flags


def _flags_parameter(arguments, flags):
    """The fault flags (the last parameter) as a MemRef, or None without them."""
    return lang.MemRef(arguments[-1], lang.bool_, [None], "faults") if flags else None


def _traced_parameters(arguments, inputs, outputs, rank, names):
    """Block arguments as the kernel language's values: MemRefs and Scalars."""
    values = []
    for value, (dtype, is_array), name in zip(arguments, inputs, names):
        if is_array:
            values.append(lang.MemRef(value, dtype, [None] * (rank or 1), name))
        else:
            values.append(lang.Scalar(value, dtype))
    outs = [lang.MemRef(value, dtype, [None] * (rank or 1), f"out{k}")
            for k, (value, dtype) in enumerate(zip(arguments[len(inputs):], outputs))]
    return values, outs


# ---------------------------------------------------------------------------
# The linalg form

def linalg_function(module, name, inputs, outputs, rank, apply, location, reversed_loops=False, flags=False):
    """Adds func.func @name (with a C interface, for the host) whose body is
    the linalg.generic of `apply(values, flags)` over the arrays; scalar
    inputs and the fault flags are used by the region from the function's
    arguments. With `reversed_loops` its loop d0 runs along the arrays' last
    dimension (indexing maps (d0..dn) -> (dn..d0))."""
    r = 1 if rank is None else rank
    indexing = ir.Attribute.permutation_map(list(reversed(range(r)))) if reversed_loops else \
        ir.Attribute.identity_map(r)
    types = _parameter_types(inputs, outputs, rank, flags)
    with ir.InsertionPoint(module.body), location:
        func = ir.Operation.create("func.func", regions=1, attributes={
            "sym_name": ir.Attribute.string(name),
            "function_type": ir.Attribute.type_attr(ir.Type.function(types, [])),
            "llvm.emit_c_interface": ir.Attribute.unit()})
    entry = func.regions[0].append_block(types, [location] * len(types))
    arguments = list(entry.arguments)
    array_operands = [a for a, (_, is_array) in zip(arguments, inputs) if is_array]
    out_operands = arguments[len(inputs):len(inputs) + len(outputs)]
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    with ir.InsertionPoint(entry), location:
        generic = ir.Operation.create("linalg.generic", operands=array_operands + out_operands, regions=1, attributes={
            "indexing_maps": ir.Attribute.array([indexing] * len(array_operands + out_operands)),
            "iterator_types": ir.Attribute.array([parallel] * r),
            "operandSegmentSizes": ir.Attribute.dense_i32_array([len(array_operands), len(out_operands)])})
        ir.Operation.create("func.return")
    element_types = [lang.ir_type(d) for d, is_array in inputs if is_array] + [lang.ir_type(d) for d in outputs]
    body = generic.regions[0].append_block(element_types, [location] * len(element_types))
    elements = iter(body.arguments)
    values = [lang.Scalar(next(elements), dtype) if is_array else lang.Scalar(argument, dtype)
              for argument, (dtype, is_array) in zip(arguments, inputs)]
    with ir.InsertionPoint(body):
        results = apply(values, _flags_parameter(arguments, flags))
        lang.emit("linalg.yield", results)
    return func


# ---------------------------------------------------------------------------
# The direct mapping

def direct_kernel(module, name, inputs, outputs, rank, apply, location, names, width, unroll, threads,
                  flags=False):
    """Adds gpu.module @kernels { gpu.func @name } to `module`: the direct
    mapping for contiguous (rank None) or strided arrays of `apply(values,
    flags)`. Must run inside the Trace of `apply`'s function (locations, errors)."""
    module.operation.set_attribute("gpu.container_module", ir.Attribute.unit())
    types = _parameter_types(inputs, outputs, rank, flags)
    with ir.InsertionPoint(module.body):
        gpu_module = ir.Operation.create("gpu.module", attributes={"sym_name": ir.Attribute.string("kernels")},
                                         regions=1, location=location)
    with ir.InsertionPoint(gpu_module.regions[0].append_block()):
        func = ir.Operation.create("gpu.func", regions=1, location=location, attributes={
            "sym_name": ir.Attribute.string(name),
            "function_type": ir.Attribute.type_attr(ir.Type.function(types, [])),
            "gpu.kernel": ir.Attribute.unit(),
            "nvvm.maxntid": ir.Attribute.dense_i32_array([threads, 1, 1])})
    body = func.regions[0].append_block(types, [location] * len(types))
    values, outs = _traced_parameters(list(body.arguments), inputs, outputs, rank, names)
    apply = functools.partial(apply, flags=_flags_parameter(list(body.arguments), flags))
    with ir.InsertionPoint(body):
        if rank is None:
            _template("contiguous")(values, outs, apply, width, unroll, threads)
        else:
            _template("strided")(values, outs, apply, rank, threads)
        lang.emit("gpu.return")
    return func


_templates = {}


def _template(which):
    """The kernel-language function of a mapping, its control flow rewritten
    by the tracer (so `if` and `for ... in range` on traced values build scf
    operations), as @mg.kernel bodies are."""
    function = _templates.get(which)
    if function is None:
        source = {"contiguous": _contiguous, "strided": _strided}[which]
        code, free, _, _ = rewrite(source)
        function = _templates[which] = instantiate(source, code, free, {})
    return function


def _contiguous(inputs, outputs, apply, width, unroll, threads):
    """A block takes threads * unroll * width consecutive elements. A block
    wholly inside the arrays loads every vector first (unroll vectors of each
    input per thread), then computes and stores; the last block goes element
    by element."""
    n = _extent(outputs[0], 0)
    per_block = threads * unroll * width
    start = block_idx.x * per_block
    if start + per_block <= n:
        _full_block(inputs, outputs, apply, start, width, unroll, threads)
    else:
        for i in range(start + thread_idx.x, min(start + per_block, n), threads):
            _store(outputs, [i], apply([_element(a, [i]) for a in inputs]))


def _strided(inputs, outputs, apply, rank, threads):
    """A grid-stride loop over the output's elements in C order; each element's
    index is unravelled and every array read at it through its strides."""
    sizes = [_extent(outputs[0], d) for d in static_range(rank)]
    step = grid_dim.x * threads
    for linear in range(block_idx.x * threads + thread_idx.x, _product(sizes), step):
        index = _unravel(linear, sizes)
        _store(outputs, index, apply([_element(a, index) for a in inputs]))


def _extent(memref, axis):
    op = lang.emit("memref.dim", [memref.value, lang.constant(axis, lang.index)], [ir.Type.index()])
    return lang.Scalar(op.result, lang.index)


def _product(sizes):
    total = lang.constant(1, lang.index)
    for size in sizes:
        total = total * size
    return total


def _unravel(linear, sizes):
    """The C-order index of the element `linear`: the last axis varies fastest."""
    index = [linear] * len(sizes)
    for d in reversed(range(1, len(sizes))):
        index[d] = linear % sizes[d]
        linear = linear // sizes[d]
    if sizes:
        index[0] = linear
    return index


def _element(value, index):
    """An input's element at `index` (a scalar input is itself)."""
    return value[tuple(index)] if isinstance(value, lang.MemRef) else value


def _store(outputs, index, results):
    for out, result in zip(outputs, results):
        out[tuple(index)] = result


def _full_block(inputs, outputs, apply, start, width, unroll, threads):
    firsts = [start + (k * threads + thread_idx.x) * width for k in range(unroll)]
    # Every load is issued before the first use: unroll * inputs vectors in flight per thread.
    loaded = [[_load(a, i, width) for a in inputs] for i in firsts]
    for i, values in zip(firsts, loaded):
        lanes = [apply([_lane(v, lane) for v in values]) for lane in range(width)]
        for k, out in enumerate(outputs):
            if width == 1:
                out[i] = lanes[0][k]
            else:
                device.vstore(out, i, [lane[k] for lane in lanes])


def _load(value, i, width):
    if not isinstance(value, lang.MemRef):
        return value
    return value[i] if width == 1 else device.vload(value, i, width)


def _lane(value, lane):
    return value[lane] if isinstance(value, device.Vector) else value
