"""The CPU lowering: what the kernel language becomes when a kernel runs on the host.

A kernel traced for the host is a `func.func` with a C interface whose
arguments are the kernel's followed by the thread, block, block_dim and
grid_dim x/y/z as `index`. The operations that need the other threads of the
block, or the host, are calls of the runtime in csrc/cpu/, declared in the
module on first use:

    mg_cpu_barrier(line)                         mg.syncthreads()
    mg_cpu_grid_sync(line)                       mg.grid.sync(): every thread of the grid
    mg_cpu_shared(which) -> memref<?xi8>         the block's static (0) or dynamic (1) shared memory
    mg_cpu_shuffle(mode, bits, offset, width, line)
                                                 mg.warp.shfl_*, ballot, any, all: a warp-level barrier
    mg_cpu_warp_put(bits), mg_cpu_warp_collective(mode, line), mg_cpu_warp_get(k)
                                                 mg.mma.sync and mg.mma.ldmatrix: a lane's
                                                 operands, the warp-level barrier that computes
                                                 the collective, its results
    mg_cpu_printf_arg(bits), mg_cpu_printf(fmt)  mg.printf
    mg_cpu_bounds_index(i, size), mg_cpu_out_of_bounds(name, kind, line)
                                                 a failed bounds check
    mg_cpu_division_fault(overflow, line)        an integer division by zero (or INT_MIN by -1),
                                                 which would kill the process with SIGFPE
    mg_cpu_poll(line)                            at the top of a long loop's body: ends the launch
                                                 once Ctrl-C was pressed
    mg_cpu_shared_access(address, bytes, kind, line)
                                                 before an access of shared memory: the race and
                                                 uninitialized-read checks
    mg_cpu_global_access(address, element, size, count, kind, array, line)
                                                 before a load or store of an array the kernel was
                                                 launched with: the race check
    mg_cpu_mbarrier_init(address, count, line), mg_cpu_mbarrier_arrive(address, bytes, line),
    mg_cpu_mbarrier_wait(address, parity, line)  mg.mbarrier: the PTX ISA's phases, arrivals and
                                                 transaction bytes; a wait lets the other threads run
    mg_cpu_named_barrier(id, threads, wait, line)
                                                 mg.warpgroup.barrier and arrive (bar.sync, bar.arrive)
    mg_cpu_tma_load(map, destination, barrier, rank, c0..c4, line),
    mg_cpu_tma_store(map, source, rank, c0..c4, line),
    mg_cpu_tma_reduce_add(map, source, rank, c0..c4, line)
                                                 mg.tma: the box copied at once, swizzled as the
                                                 hardware lays it out; a load completes its bytes
                                                 on the mbarrier
    mg_cpu_wgmma_buffer() -> memref<?xf32>, mg_cpu_wgmma(n, a, b, mode, line)
                                                 mg.wgmma.mma: the thread's accumulators in the
                                                 buffer, updated from the operands the
                                                 descriptors name

Strings (printf formats, array names) are passed by index into a table the
module carries as its `mg.cpu.strings` attribute; the bytes of its static
shared arrays are `mg.cpu.static_shared`. Shared addresses
(mg.shared.address) are the low 32 bits of host addresses: the runtime
finds them in the block's shared memory, which it aligns to 1024 bytes so
that the swizzles see the same address bits as on the GPU. mlirgpu.compiler.cpu's `PIPELINE`
lowers such a module to the llvm dialect for the ExecutionEngine. docs/design/cpu_backend.md has
the design.
"""
import os

from .. import ir
from .._mlirgpu import CompileError
from ..language import core as lang
from ..language.intrinsics import Vector
from ..language.shared import SharedMemRef
from .gpu import GpuLowering, llvm_atomicrmw

__all__ = ["ACCESS_CHECKS", "CHECKS", "CpuLowering", "INDICES", "checks_from_environment"]

# The trailing index arguments of a host function, in order.
INDICES = [(op, axis) for op in ("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim")
           for axis in "xyz"]

_i32 = lambda: ir.Type.integer(32)  # noqa: E731
_i64 = lambda: ir.Type.integer(64)  # noqa: E731
_ptr = lambda: ir.Type.parse("!llvm.ptr")  # noqa: E731

# name: (inputs, results, C interface)
_RUNTIME = {
    "mg_cpu_barrier": (lambda: [_i32()], lambda: [], False),
    "mg_cpu_grid_sync": (lambda: [_i32()], lambda: [], False),
    "mg_cpu_shared": (lambda: [_i32()], lambda: [ir.Type.parse("memref<?xi8>")], True),
    "mg_cpu_shuffle": (lambda: [_i32(), _i64(), _i32(), _i32(), _i32()], lambda: [_i64()], False),
    "mg_cpu_warp_put": (lambda: [_i64()], lambda: [], False),
    "mg_cpu_warp_collective": (lambda: [_i32(), _i32()], lambda: [], False),
    "mg_cpu_warp_get": (lambda: [_i32()], lambda: [_i64()], False),
    "mg_cpu_printf_arg": (lambda: [_i64()], lambda: [], False),
    "mg_cpu_printf": (lambda: [_i32()], lambda: [], False),
    "mg_cpu_bounds_index": (lambda: [_i64(), _i64()], lambda: [], False),
    "mg_cpu_out_of_bounds": (lambda: [_i32(), _i32(), _i32()], lambda: [], False),
    "mg_cpu_division_fault": (lambda: [_i32(), _i32()], lambda: [], False),
    "mg_cpu_poll": (lambda: [_i32()], lambda: [], False),
    "mg_cpu_shared_access": (lambda: [_i64(), _i32(), _i32(), _i32()], lambda: [], False),
    "mg_cpu_global_access": (lambda: [_i64(), _i64()] + [_i32()] * 5, lambda: [], False),
    "mg_cpu_mbarrier_init": (lambda: [_i32()] * 3, lambda: [], False),
    "mg_cpu_mbarrier_arrive": (lambda: [_i32()] * 3, lambda: [], False),
    "mg_cpu_mbarrier_wait": (lambda: [_i32()] * 3, lambda: [], False),
    "mg_cpu_named_barrier": (lambda: [_i32()] * 4, lambda: [], False),
    "mg_cpu_tma_load": (lambda: [_ptr()] + [_i32()] * 9, lambda: [], False),
    "mg_cpu_tma_store": (lambda: [_ptr()] + [_i32()] * 8, lambda: [], False),
    "mg_cpu_tma_reduce_add": (lambda: [_ptr()] + [_i32()] * 8, lambda: [], False),
    "mg_cpu_wgmma_buffer": (lambda: [], lambda: [ir.Type.parse("memref<?xf32>")], True),
    "mg_cpu_wgmma": (lambda: [_i32(), _i64(), _i64(), _i32(), _i32()], lambda: [], False),
    "mg_cpu_float8x4": (lambda: [ir.Type.f32()] * 4 + [_i32()], lambda: [_i32()], False),
}

_SHUFFLE_MODES = {"xor": 0, "down": 1, "up": 2, "idx": 3, "ballot": 4}  # cpu.c's MG_SHFL_*, MG_VOTE_BALLOT
_MMA_MODES = {"f16": 16, "bf16": 17, "tf32": 18}  # cpu.c's MG_WARP_MMA_*
_LDMATRIX_MODE = 32  # cpu.c's MG_WARP_LDMATRIX
# mg_cpu_wgmma's mode bits: A's type (bits 0-1), B's (2-3), B MN-major, A from registers.
_WGMMA_TYPES, _WGMMA_B_MN_MAJOR, _WGMMA_A_IN_REGISTERS = {"f16": 0, "bf16": 1, "e4m3": 2, "e5m2": 3}, 16, 32
_WGMMA_SLOTS = 128  # MG_CPU_WGMMA_MAX: the accumulators' slots of the thread's wgmma buffer, before A's words


# Loops of at most this many iterations need no check for Ctrl-C of their own:
# the enclosing loop's (a matmul's inner loop over a tile runs at full speed).
_SHORT_LOOP = 64

# MLIRGPU_CHECK's checks; "races" costs a runtime call per load and store,
# "uninitialized" one per access of shared memory. "uninitialized" is asked for: a
# kernel may read what it then discards (a select), which is no bug.
CHECKS = ("bounds", "races", "uninitialized")
DEFAULT_CHECKS = frozenset({"bounds", "races"})
_SHARED_CHECKS = {"races": 8, "uninitialized": 16}  # mg_cpu_shared_access's kind bits
# The runtime's checks of an access: they read the address they are given, never write through it.
ACCESS_CHECKS = ("mg_cpu_shared_access", "mg_cpu_global_access")


def checks_from_environment():
    """The checks MLIRGPU_CHECK asks for: a comma-separated list of CHECKS
    ("bounds": every array index; "races": two threads of a block touching a
    byte of shared memory or an element of an array with no barrier between,
    one of them writing;
    "uninitialized": a read of shared memory no thread of the block wrote),
    or "none" for no check; unset or empty, DEFAULT_CHECKS (bounds, races)."""
    names = frozenset(c.strip() for c in os.environ.get("MLIRGPU_CHECK", "").split(",") if c.strip())
    if not names:
        return DEFAULT_CHECKS
    unknown = names - set(CHECKS) - {"none"}
    if unknown:
        raise ValueError(f"MLIRGPU_CHECK: unknown check {sorted(unknown)[0]!r} (known: {', '.join(CHECKS)}, none)")
    return names - {"none"}


class CpuLowering(GpuLowering):
    """The kernel language for the CPU backend, with the run-time `checks`
    asked for (a subset of CHECKS). It overrides every hook of GpuLowering,
    whose class is the list of hooks a lowering has."""

    return_op = "func.return"

    def __init__(self, checks=frozenset(), runtime=True):
        self.checks = frozenset(checks)
        # False for a build that runs without mlirgpu's CPU runtime (a kernel exported into a
        # C library): no Ctrl-C polls, and a division that would trap gives an unspecified
        # value, as on a GPU.
        self.runtime = runtime

    # -- functions and their index arguments ------------------------------
    def kernel_function(self, module, name, types, location, attributes, argument_attributes=None):
        # No LLVM argument attributes: a memref descriptor is no pointer, and the
        # host has no read-only cache for them to unlock.
        inputs = types + self.extra_argument_types()
        with ir.InsertionPoint(module.body), location:
            func = ir.Operation.create("func.func", regions=1, attributes={
                "sym_name": ir.Attribute.string(name),
                "function_type": ir.Attribute.type_attr(ir.Type.function(inputs, [])),
                "llvm.emit_c_interface": ir.Attribute.unit()})
        return func.regions[0].append_block(inputs, [location] * len(inputs))

    def memref_parameter_types(self, shape, dtype):
        # A memref descriptor carries its sizes: dynamic extents are `?`.
        return [ir.Type.memref([ir.DYNAMIC if d is None else d for d in shape], lang.ir_type(dtype))]

    def memref_parameter(self, arguments, shape, dtype, name, readonly=False):
        return lang.MemRef(next(arguments), dtype, shape, name, readonly)

    def extra_argument_types(self):
        return [ir.Type.index()] * len(INDICES)

    def bind_extra_arguments(self, trace, arguments):
        trace.host_indices = {key: lang.Scalar(value, lang.index) for key, value in zip(INDICES, arguments)}

    def extra_call_operands(self):
        indices = lang.current_trace().host_indices
        return [indices[key].value for key in INDICES]

    def index(self, op, axis):
        return lang.current_trace().host_indices[op, axis]

    def require_gpu(self, what):
        raise CompileError(f"{what} runs only on the GPU (the CPU backend has no thread-block clusters): "
                           f"use mg.set_backend('cuda')")

    def finish(self, module, state):
        # What the runtime needs besides the code: its string table and static shared bytes.
        module.operation.set_attribute("mg.cpu.strings", ir.Attribute.array(
            [ir.Attribute.string(text) for text in state.get("host_strings", [])]))
        module.operation.set_attribute("mg.cpu.static_shared", ir.Attribute.integer(
            state.get("host_shared_bytes", 0)))

    # -- the runtime's operations ------------------------------------------
    def barrier(self):
        # The runtime's fiber switch, told the line for its errors.
        _call("mg_cpu_barrier", [_line()])

    def grid_sync(self):
        # The runtime runs a kernel that calls it with every block's threads as
        # fibers of one launch; this fiber switch waits for all of them.
        _call("mg_cpu_grid_sync", [_line()])

    def printf(self, format, operands):
        # Each value's bits, then the format's index; cpu.c formats them.
        for value in operands:
            _call("mg_cpu_printf_arg", [_to_bits(value)])
        _call("mg_cpu_printf", [_i32_constant(_string(format))])

    def shuffle(self, mode, value, offset, width):
        # A warp-level barrier in the runtime exchanges the bits.
        bits = _call("mg_cpu_shuffle", [_i32_constant(_SHUFFLE_MODES[mode]), _to_bits(value), offset,
                                        _i32_constant(width), _line()])[0]
        return _from_bits(lang.Scalar(bits, lang.i64), value.dtype)

    def vote(self, kind, pred):
        # The runtime's ballot; any and all are read from one.
        if kind == "all":
            return self.vote("ballot", ~pred) == 0
        bits = _call("mg_cpu_shuffle", [_i32_constant(_SHUFFLE_MODES["ballot"]), lang.cast(pred, lang.i64),
                                        _i32_constant(0), _i32_constant(32), _line()])[0]
        ballot = lang.cast(lang.Scalar(bits, lang.i64), lang.u32)
        return ballot if kind == "ballot" else ballot != 0

    def warp_reduce(self, op, value):
        # No single instruction: the library's shuffles.
        return None

    def global_pointer(self, pointer):
        # The host has one address space.
        return pointer, 0

    def sync_scope(self, scope):
        # One process runs the whole grid: every scope is the system's.
        return ""

    def atomic_rmw(self, operation, pointer, value, order, scope, space):
        # The host's atomics honour every ordering (scopes: see sync_scope).
        return llvm_atomicrmw(operation, pointer, value, order, "")

    def fence(self, scope):
        # The blocks of a launch run one after another on one thread and a
        # block's threads are fibers on it, so a fence only has to keep the
        # compiler from moving memory accesses across it: an LLVM fence does.
        lang.emit("llvm.fence", attributes={"ordering": ir.Attribute.integer(7, ir.Type.integer(64)),
                                            "syncscope": ir.Attribute.string("")})

    def hinted_load(self, memref, indices, length, cache):
        # The host's caches take no hints: a plain load.
        if length is None:
            return lang.Scalar(lang.emit("memref.load", [memref.value, *indices], [lang.ir_type(memref.dtype)]).result,
                               memref.dtype)
        vector_type = ir.Type.vector([length], lang.ir_type(memref.dtype))
        op = lang.emit("vector.load", [memref.value, *indices], [vector_type], attributes={
            "alignment": ir.Attribute.integer(memref.dtype.itemsize)})
        return Vector(op.result, memref.dtype, length)

    def hinted_store(self, memref, indices, value, cache):
        # The host's caches take no hints: a plain store.
        if isinstance(value, Vector):
            lang.emit("vector.store", [value.value, memref.value, *indices], attributes={
                "alignment": ir.Attribute.integer(memref.dtype.itemsize)})
        else:
            lang.emit("memref.store", [value, memref.value, *indices])

    def reciprocal_approx(self, x):
        # The host has no approximate reciprocal: the division, correctly rounded.
        return 1.0 / x

    def exp2_approx(self, x):
        # The host has no approximate exponential: math.exp2's.
        return lang.Scalar(lang.emit("math.exp2", [x.value], [x.value.type]).result, x.dtype)

    def lane_id(self):
        return _linear_thread() % 32

    # -- tensor cores: warp collectives of the runtime ----------------------
    def mma_sync(self, kind, a, b, c):
        # Each lane's registers go in as words; the runtime computes the
        # warp's 16x8 product at the warp barrier (cpu.c: mma).
        from ..language.mma import registers
        dtype = lang.f32 if kind == "tf32" else (lang.f16 if kind == "f16" else lang.bf16)
        for register in registers(a, dtype) + registers(b, dtype) + registers(c, lang.f32):
            _call("mg_cpu_warp_put", [lang.cast(lang.cast(register, lang.u32), lang.u64)])
        _call("mg_cpu_warp_collective", [_i32_constant(_MMA_MODES[kind]), _line()])
        return [_from_bits(lang.Scalar(_call("mg_cpu_warp_get", [_i32_constant(i)])[0], lang.i64), lang.f32)
                for i in range(4)]

    def ldmatrix(self, memref, indices, count, transpose):
        # The lane's row address goes in; the runtime reads the rows of all
        # lanes at the warp barrier and hands each its registers.
        from ..language.mma import unpack_pair
        _call("mg_cpu_warp_put", [_address(memref, indices)])
        _call("mg_cpu_warp_collective", [_i32_constant(_LDMATRIX_MODE | count | (8 if transpose else 0)), _line()])
        values = []
        for j in range(count):
            bits = lang.Scalar(_call("mg_cpu_warp_get", [_i32_constant(j)])[0], lang.i64)
            values.extend(unpack_pair(lang.cast(bits, lang.i32), memref.dtype))
        return values

    def async_copy(self, dst, dst_indices, src, src_indices, elements, valid):
        # At once, element by element: by the time a wait_group could wait for
        # it the copy is done, so commit_group and wait_group do nothing here.
        def copy(zero):
            self.check_access(dst, dst_indices, lang.STORE, elements)
            if not zero:
                self.check_access(src, src_indices, lang.LOAD, elements)
            for e in range(elements):
                d = [*dst_indices[:-1], dst_indices[-1] + e]
                if zero:
                    value = lang.constant(0, dst.dtype)
                else:
                    s = [*src_indices[:-1], src_indices[-1] + e]
                    value = lang.Scalar(lang.emit("memref.load", [src.value, *s], [lang.ir_type(src.dtype)]).result,
                                        src.dtype)
                lang.emit("memref.store", [value, dst.value, *d])
        if valid is None:
            copy(False)
            return
        op = lang.emit("scf.if", [valid], [], regions=2)
        for region, zero in zip(op.regions, (False, True)):
            with ir.InsertionPoint(region.append_block()):
                copy(zero)
                lang.emit("scf.yield")

    def async_commit(self):
        pass

    def async_wait(self, n):
        pass

    # -- Hopper: mbarriers, named barriers, TMA, wgmma ---------------------
    # Calls of the runtime, which keeps an mbarrier's state in its 8 bytes of
    # shared memory, copies a TMA box and computes a wgmma when it is issued:
    # every copy and wgmma is complete when its call returns.
    def mbarrier_init(self, address, count):
        _call("mg_cpu_mbarrier_init", [lang.cast(address, lang.i32), count, _line()])

    def mbarrier_arrive(self, address, nbytes=None):
        _call("mg_cpu_mbarrier_arrive", [lang.cast(address, lang.i32),
                                         _i32_constant(0) if nbytes is None else nbytes, _line()])

    def mbarrier_wait(self, address, parity):
        # A fiber switch until the phase completes.
        _call("mg_cpu_mbarrier_wait", [lang.cast(address, lang.i32), parity, _line()])

    def mbarrier_fence_init(self):
        # The runtime's barriers are visible to every thread once written.
        pass

    def named_barrier(self, barrier_id, threads, wait):
        _call("mg_cpu_named_barrier", [barrier_id, threads, _i32_constant(int(wait)), _line()])

    def set_max_registers(self, count, increase):
        # The host's threads have no register file to share.
        pass

    def tma_load(self, tensor_map, destination, coords, barrier, mask):
        # (No mask: mg.tma.load refuses multicast on the CPU backend.)
        padded = list(coords) + [_i32_constant(0)] * (5 - len(coords))
        _call("mg_cpu_tma_load", [tensor_map, lang.cast(destination, lang.i32), lang.cast(barrier, lang.i32),
                                  _i32_constant(len(coords)), *padded, _line()])

    def tma_store(self, tensor_map, source, coords, add=False):
        padded = list(coords) + [_i32_constant(0)] * (5 - len(coords))
        _call("mg_cpu_tma_reduce_add" if add else "mg_cpu_tma_store",
              [tensor_map, lang.cast(source, lang.i32), _i32_constant(len(coords)), *padded, _line()])

    def tma_commit(self):
        # Each store was complete when it returned: no group is ever in flight.
        pass

    def tma_wait(self, pending, read):
        pass

    def fence_proxy_async(self):
        # The runtime's copies read shared memory as every other access does.
        pass

    def wgmma_mma(self, values, a, b, n, k, type_a, type_b, b_major):
        # The thread's accumulators through its buffer in the runtime, which
        # adds the products of the rows and columns it holds (32 bytes of K:
        # k16 of 16-bit floats, k32 of 8-bit ones, which mg.wgmma has checked).
        buffer = _call("mg_cpu_wgmma_buffer")[0]
        for i, v in enumerate(values):
            lang.emit("memref.store", [v, buffer, lang.constant(i, lang.index)])
        mode = _WGMMA_TYPES[type_a] | _WGMMA_TYPES[type_b] << 2 | (_WGMMA_B_MN_MAJOR if b_major == "MN" else 0)
        _call("mg_cpu_wgmma", [_i32_constant(n), lang.cast(a, lang.i64), lang.cast(b, lang.i64),
                               _i32_constant(mode), _line()])
        return [lang.Scalar(lang.emit("memref.load", [buffer, lang.constant(i, lang.index)],
                                      [ir.Type.f32()]).result, lang.f32) for i in range(len(values))]

    def wgmma_mma_registers(self, values, words, b, n, type_ab, b_major):
        # A's rows r and r + 8 over the 32 bytes of K lie in the 4 lanes of the
        # thread's quad: their 16 words, gathered by shuffles, go to the runtime
        # beside the accumulators (after its MG_CPU_WGMMA_MAX slots).
        from ..language import warp
        buffer = _call("mg_cpu_wgmma_buffer")[0]
        for i, v in enumerate(values):
            lang.emit("memref.store", [v, buffer, lang.constant(i, lang.index)])
        quad = self.lane_id() // 4 * 4
        for j in range(4):
            for i, word in enumerate(words):
                bits = lang.emit("arith.bitcast", [warp.shfl_idx(word, quad + j)], [ir.Type.f32()]).result
                lang.emit("memref.store", [bits, buffer, lang.constant(_WGMMA_SLOTS + 4 * j + i, lang.index)])
        mode = (_WGMMA_TYPES[type_ab] | _WGMMA_TYPES[type_ab] << 2 | _WGMMA_A_IN_REGISTERS |
                (_WGMMA_B_MN_MAJOR if b_major == "MN" else 0))
        _call("mg_cpu_wgmma", [_i32_constant(n), lang.constant(0, lang.i64),
                               lang.cast(b, lang.i64), _i32_constant(mode), _line()])
        return [lang.Scalar(lang.emit("memref.load", [buffer, lang.constant(i, lang.index)],
                                      [ir.Type.f32()]).result, lang.f32) for i in range(len(values))]

    def float8_word(self, values, type_name):
        # The runtime rounds as cvt.rn.satfinite does.
        return lang.Scalar(_call("mg_cpu_float8x4", [*values, _i32_constant(int(type_name == "e5m2"))])[0],
                           lang.i32)

    def wgmma_fence(self):
        # Each wgmma was complete when it returned: nothing to order or wait for.
        pass

    def wgmma_commit(self):
        pass

    def wgmma_wait(self, pending, values):
        return values

    def shared_memory_space(self):
        # Shared memory is ordinary memory: the runtime's per-block buffer.
        return ""

    def static_shared(self, state, shape, dtype, type_text, nbytes):
        # A 16-byte aligned place in the block's static buffer.
        offset = (state.get("host_shared_bytes", 0) + 15) // 16 * 16
        state["host_shared_bytes"] = offset + nbytes
        return offset

    def static_shared_value(self, key, type_text):
        return lang.emit("memref.view", [_shared_buffer(0), lang.constant(key, lang.index)],
                         [ir.Type.parse(type_text)]).result

    def dynamic_shared_bytes(self, state):
        raw = _shared_buffer(1)
        nbytes = lang.Scalar(lang.emit("memref.dim", [raw, lang.constant(0, lang.index)],
                                       [ir.Type.index()]).result, lang.index)
        return raw, nbytes

    def vector_alignment(self, dtype, nbytes):
        # An access the GPU would fault on as misaligned must not crash the process.
        return dtype.itemsize

    def check_access(self, memref, indices, kind, length=1):
        """With the "bounds" check, that the indices are in range; with "races"
        or "uninitialized", for shared memory, the runtime's check of the bytes,
        and with "races", for an array the kernel was launched with, of the
        elements (atomics excepted: they never race)."""
        if "bounds" in self.checks:
            self._check_bounds(memref, indices, kind, length)
        if kind == lang.ATOMIC:
            return
        if isinstance(memref, SharedMemRef):
            flags = sum(bit for check, bit in _SHARED_CHECKS.items() if check in self.checks)
            if flags:
                _call("mg_cpu_shared_access", [_address(memref, indices),
                                               _i32_constant(memref.dtype.itemsize * length),
                                               _i32_constant(kind | flags), _line()])
        elif "races" in self.checks:
            element = _element(memref, indices)
            _call("mg_cpu_global_access", [_element_address(memref, element), lang.cast(element, lang.i64),
                                           _i32_constant(memref.dtype.itemsize), _i32_constant(length),
                                           _i32_constant(kind), _i32_constant(_string(memref.name or "?")),
                                           _line()])

    def _check_bounds(self, memref, indices, kind, length):
        """A comparison of each index with its dimension (`length` elements
        along the innermost one) and, when one is out of range, the runtime's
        report of it (which ends the launch)."""
        index_type = ir.Type.index()
        i1 = ir.Type.integer(1)
        ult, ule = ir.Attribute.integer(6, ir.Type.integer(64)), ir.Attribute.integer(7, ir.Type.integer(64))
        sizes, ok = [], None
        for d, i in enumerate(indices):
            if memref.extents[d] is not None:
                size = lang.constant(memref.extents[d], lang.index)
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
                _call("mg_cpu_bounds_index", [lang.cast(i, lang.i64), lang.cast(size, lang.i64)])
            name = getattr(memref, "name", None) or "?"
            _call("mg_cpu_out_of_bounds", [_i32_constant(_string(name)), _i32_constant(kind), _line()])
            lang.emit("scf.yield")


    def loop_iteration(self, trips):
        """A check for Ctrl-C at the top of each iteration of a loop that may
        run long (a while loop, or more than a few iterations): the launch
        stops there with KeyboardInterrupt instead of running on for ever."""
        if self.runtime and (trips is None or trips > _SHORT_LOOP):
            _call("mg_cpu_poll", [_line()])

    def check_division(self, a, b):
        """The divisor, checked always: the host's division traps (SIGFPE) where the GPU's gives an
        unspecified value, so a zero divisor, or INT_MIN over -1, ends the
        launch with the runtime's report of it instead."""
        signed = a.dtype not in lang.UNSIGNED
        divisor = lang.constant_value(b)
        if divisor is not None and divisor != 0 and not (signed and divisor == -1):
            return b
        zero = b == lang.constant(0, b.dtype)
        bad = zero
        if signed:
            lowest = lang.integer_range(a.dtype)[0] if a.dtype != lang.index else -2 ** 63
            bad = bad | ((a == lang.constant(lowest, a.dtype)) & (b == lang.constant(-1, b.dtype)))
        if not self.runtime:
            return lang.select(bad, lang.constant(1, b.dtype), b)
        op = lang.emit("scf.if", [bad], [], regions=2)
        with ir.InsertionPoint(op.regions[0].append_block()):
            _call("mg_cpu_division_fault", [lang.cast(~zero, lang.i32), _line()])
            lang.emit("scf.yield")
        return b


def _call(name, operands=()):
    """func.call of a runtime function (declared in the module the first time); its results."""
    declared = lang.module_state().setdefault("host_declared", set())
    inputs, results, c_interface = _RUNTIME[name]
    if name not in declared:
        declared.add(name)
        attributes = {"sym_name": ir.Attribute.string(name),
                      "function_type": ir.Attribute.type_attr(ir.Type.function(inputs(), results())),
                      "sym_visibility": ir.Attribute.string("private")}
        if c_interface:
            attributes["llvm.emit_c_interface"] = ir.Attribute.unit()
        with lang.gpu_module_scope():
            ir.Operation.create("func.func", regions=1, attributes=attributes, location=lang.location())
    op = lang.emit("func.call", operands, results(), attributes={"callee": ir.Attribute.symbol_ref(name)})
    return op.results


def _i32_constant(value):
    return lang.constant(value, lang.i32)


def _line():
    """The user's line now traced, as an i32 constant (for the runtime's errors)."""
    return _i32_constant(lang.location().line)


def _string(text):
    """The index of `text` in the module's string table."""
    strings = lang.module_state().setdefault("host_strings", [])
    if text not in strings:
        strings.append(text)
    return strings.index(text)


def _linear_thread():
    """The thread's linear id in its block, x fastest (as the GPU numbers lanes)."""
    indices = lang.current_trace().host_indices
    x, y, z = (indices["gpu.thread_id", a] for a in "xyz")
    bx, by = indices["gpu.block_dim", "x"], indices["gpu.block_dim", "y"]
    return (z * by + y) * bx + x


def _element(memref, indices):
    """The element memref[indices] is of its buffer, from the aligned pointer (an index)."""
    rank = len(indices)
    index = ir.Type.index()
    base_type = ir.Type.parse(f"memref<{lang.ir_type(memref.dtype)}>")
    metadata = lang.emit("memref.extract_strided_metadata", [memref.value],
                         [base_type, index, *[index] * rank, *[index] * rank])
    offset = lang.Scalar(metadata.results[1], lang.index)
    for i, k in enumerate(indices):
        offset = offset + k * lang.Scalar(metadata.results[2 + rank + i], lang.index)
    return offset


def _element_address(memref, element):
    """The address of `element` (from _element) of memref's buffer as i64 (for the runtime to read)."""
    pointer = lang.Scalar(lang.emit("memref.extract_aligned_pointer_as_index", [memref.value],
                                    [ir.Type.index()]).result, lang.index)
    return lang.cast(pointer + element * memref.dtype.itemsize, lang.i64)


def _address(memref, indices):
    """The address of memref[indices] as i64 (for the runtime to read)."""
    return _element_address(memref, _element(memref, indices))


def _shared_buffer(which):
    """The block's static (0) or dynamic (1) shared memory, as memref<?xi8>."""
    return _call("mg_cpu_shared", [_i32_constant(which)])[0]


def _to_bits(value):
    """A 32- or 64-bit scalar's bits as i64 (zero-extended)."""
    dtype = value.dtype
    if lang.is_float(dtype):
        width = dtype.itemsize * 8
        bits = lang.Scalar(lang.emit("arith.bitcast", [value], [ir.Type.integer(width)]).result,
                           lang.u32 if width == 32 else lang.u64)
        return lang.cast(bits, lang.u64) if width == 32 else bits
    return lang.cast(value, lang.u64 if dtype in lang.UNSIGNED else lang.i64) if dtype.itemsize < 8 else value


def _from_bits(bits, dtype):
    """The inverse of _to_bits: i64 bits as a scalar of `dtype`."""
    width = dtype.itemsize * 8
    raw = bits.value
    if width < 64:
        raw = lang.emit("arith.trunci", [raw], [ir.Type.integer(width)]).result
    if lang.is_float(dtype):
        raw = lang.emit("arith.bitcast", [raw], [lang.ir_type(dtype)]).result
    return lang.Scalar(raw, dtype)

