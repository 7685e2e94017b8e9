"""What the device features become in the host trace (the CPU backend).

A kernel traced with `host=True` (kernel.py) is a `func.func` whose trailing
`index` arguments are the thread, block, block_dim and grid_dim x/y/z. The
features that need the other threads of the block, or the host, are calls of
the runtime in csrc/cpu.c, declared in the module on first use:

    mg_cpu_barrier(line)                         mg.syncthreads()
    mg_cpu_shared(which) -> memref<?xi8>         the block's static (0) or dynamic (1) shared memory
    mg_cpu_shuffle(mode, bits, offset, line)     mg.warp.shfl_*: a warp-level barrier
    mg_cpu_printf_arg(bits), mg_cpu_printf(fmt)  mg.printf
    mg_cpu_bounds_index(i, size), mg_cpu_out_of_bounds(name, kind, line)
                                                 a failed check under MLIRGPU_CHECK=bounds

Strings (printf formats, array names) are passed by index into a table the
module carries as its `mg.cpu.strings` attribute; the bytes of its static
shared arrays are `mg.cpu.static_shared`. docs/cpu.md has the design.
"""
import os

from . import ir, language as lang

__all__ = ["INDICES", "active", "checks_from_environment", "call", "string", "linear_thread", "shared_buffer",
           "check_bounds", "LOAD", "STORE", "ATOMIC", "VECTOR_LOAD", "VECTOR_STORE"]

# The trailing index arguments of a host function, in order.
INDICES = [(op, axis) for op in ("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim")
           for axis in "xyz"]

# The kinds of access a failed bounds check names (cpu.c's raise_bounds knows them by number).
LOAD, STORE, ATOMIC, VECTOR_LOAD, VECTOR_STORE = range(5)

_i32 = lambda: ir.Type.integer(32)  # noqa: E731
_i64 = lambda: ir.Type.integer(64)  # noqa: E731

# name: (inputs, results, C interface)
_RUNTIME = {
    "mg_cpu_barrier": (lambda: [_i32()], lambda: [], False),
    "mg_cpu_shared": (lambda: [_i32()], lambda: [ir.Type.parse("memref<?xi8>")], True),
    "mg_cpu_shuffle": (lambda: [_i32(), _i64(), _i32(), _i32()], lambda: [_i64()], False),
    "mg_cpu_printf_arg": (lambda: [_i64()], lambda: [], False),
    "mg_cpu_printf": (lambda: [_i32()], lambda: [], False),
    "mg_cpu_bounds_index": (lambda: [_i64(), _i64()], lambda: [], False),
    "mg_cpu_out_of_bounds": (lambda: [_i32(), _i32(), _i32()], lambda: [], False),
}


def active():
    """Whether the code being traced is for the host."""
    trace = lang.state.tracer
    return trace is not None and getattr(trace, "host_indices", None) is not None


def checks_from_environment():
    """The checks MLIRGPU_CHECK asks for (a comma-separated list; "bounds" is the one there is)."""
    return frozenset(c.strip() for c in os.environ.get("MLIRGPU_CHECK", "").split(",") if c.strip())


def _state():
    from .device import module_state
    return module_state()


def call(name, operands=()):
    """func.call of a runtime function (declared in the module the first time); its results."""
    from .device import gpu_module_scope
    state = _state()
    declared = state.setdefault("host_declared", set())
    inputs, results, c_interface = _RUNTIME[name]
    if name not in declared:
        declared.add(name)
        attributes = {"sym_name": ir.Attribute.string(name),
                      "function_type": ir.Attribute.type_attr(ir.Type.function(inputs(), results())),
                      "sym_visibility": ir.Attribute.string("private")}
        if c_interface:
            attributes["llvm.emit_c_interface"] = ir.Attribute.unit()
        with gpu_module_scope():
            ir.Operation.create("func.func", regions=1, attributes=attributes, location=lang.location())
    op = lang.emit("func.call", operands, results(), attributes={"callee": ir.Attribute.symbol_ref(name)})
    return op.results


def i32(value):
    return lang.constant(value, lang.i32)


def line():
    """The user's line now traced, as an i32 constant (for the runtime's errors)."""
    return i32(lang._trace().location().line)


def string(text):
    """The index of `text` in the module's string table."""
    strings = _state().setdefault("host_strings", [])
    if text not in strings:
        strings.append(text)
    return strings.index(text)


def index(axis_op, axis):
    return lang._trace().host_indices[axis_op, axis]


def linear_thread():
    """The thread's linear id in its block, x fastest (as the GPU numbers lanes)."""
    x, y, z = (index("gpu.thread_id", a) for a in "xyz")
    bx, by = index("gpu.block_dim", "x"), index("gpu.block_dim", "y")
    return (z * by + y) * bx + x


def shared_buffer(which):
    """The block's static (0) or dynamic (1) shared memory, as memref<?xi8>."""
    return call("mg_cpu_shared", [i32(which)])[0]


def to_bits(value):
    """A 32- or 64-bit scalar's bits as i64 (zero-extended)."""
    dtype = value.dtype
    if lang.is_float(dtype):
        width = dtype.itemsize * 8
        bits = lang.Scalar(lang.emit("arith.bitcast", [value], [ir.Type.integer(width)]).result,
                           lang.u32 if width == 32 else lang.u64)
        return lang.cast(bits, lang.u64) if width == 32 else bits
    return lang.cast(value, lang.u64 if dtype in lang.UNSIGNED else lang.i64) if dtype.itemsize < 8 else value


def from_bits(bits, dtype):
    """The inverse of to_bits: i64 bits as a scalar of `dtype`."""
    width = dtype.itemsize * 8
    raw = bits.value
    if width < 64:
        raw = lang.emit("arith.trunci", [raw], [ir.Type.integer(width)]).result
    if lang.is_float(dtype):
        raw = lang.emit("arith.bitcast", [raw], [lang.ir_type(dtype)]).result
    return lang.Scalar(raw, dtype)


# ---------------------------------------------------------------------------
# Bounds checks

def check_bounds(memref, indices, kind, length=1):
    """With MLIRGPU_CHECK=bounds: before an access of `memref` at `indices`
    (index values; `length` elements along the innermost one), a comparison
    of each with its dimension and, when one is out of range, the runtime's
    report of it (which ends the launch). Without: nothing."""
    if not active() or "bounds" not in _state().get("host_checks", ()):
        return
    index_type = ir.Type.index()
    i1 = ir.Type.integer(1)
    ult, ule = ir.Attribute.integer(6, ir.Type.integer(64)), ir.Attribute.integer(7, ir.Type.integer(64))
    sizes, ok = [], None
    for d, i in enumerate(indices):
        if memref.shape[d] is not None:
            size = lang.constant(memref.shape[d], lang.index)
        else:
            size = lang.Scalar(lang.emit("memref.dim", [memref.value, lang.constant(d, lang.index)],
                                         [index_type]).result, lang.index)
        sizes.append(size)
        # Unsigned: a negative index is a huge one.
        good = lang.Scalar(lang.emit("arith.cmpi", [i, size], [i1], {"predicate": ult}).result, lang.bool_)
        if length > 1 and d == len(indices) - 1:
            end = lang.Scalar(lang.emit("arith.addi", [i, lang.constant(length, lang.index)],
                                        [index_type]).result, lang.index)
            fits = lang.emit("arith.cmpi", [end, size], [i1], {"predicate": ule}).result
            good = good & lang.Scalar(fits, lang.bool_)
        ok = good if ok is None else ok & good
    if ok is None:
        return
    bad = ~ok
    op = lang.emit("scf.if", [bad], [], regions=2)
    with ir.InsertionPoint(op.regions[0].append_block()):
        for i, size in zip(indices, sizes):
            call("mg_cpu_bounds_index", [lang.cast(i, lang.i64), lang.cast(size, lang.i64)])
        name = getattr(memref, "name", None) or "?"
        call("mg_cpu_out_of_bounds", [i32(string(name)), i32(kind), line()])
        lang.emit("scf.yield")
