"""What the kernel language's target-dependent operations become.

Most of the language (arithmetic, loads, stores, loops) is the same MLIR for
every target. A few operations are not: thread indices, barriers, printf,
shuffles, votes and warp reductions, shared memory, memref parameters with
dynamic extents, fences, the grid barrier, ordered atomics, cache-hinted accesses, approximate
reciprocals, the Hopper operations only a GPU has, and the checks a
debugging target adds around memory accesses. The trace asks its lowering
for those. GpuLowering is the
GPU's meaning, the gpu and nvvm dialects' own operations; a backend that runs
kernels elsewhere (the CPU backend, targets/cpu.py) subclasses it, and
the language never needs to know which one it is tracing for.
"""
from .. import ir
from ..language import core as lang
from ..language.atomic import ORDERINGS
from ..language.intrinsics import LOAD_HINTS, STORE_HINTS, Vector

__all__ = ["GpuLowering", "llvm_atomicrmw", "shared_pointer"]
# LLVM's AtomicBinOp
_BIN_OPS = {"xchg": 0, "add": 1, "and": 3, "or": 5, "xor": 6, "max": 7, "min": 8, "umax": 9, "umin": 10,
            "fadd": 11, "fmax": 13, "fmin": 14}
# PTX's atom: the operation and type of each (LLVM operation, dtype), and register constraints.
_PTX_ATOM = {"xchg": "exch.b", "add": "add.u", "and": "and.b", "or": "or.b", "xor": "xor.b", "max": "max.s",
             "min": "min.s", "umax": "max.u", "umin": "min.u", "fadd": "add.f"}
_PTX_REGISTERS = {"i32": "r", "u32": "r", "i64": "l", "u64": "l", "f32": "f", "f64": "d"}
_PTX_SPACES = {1: ".global", 3: ".shared"}  # the pointers element_pointer gives on the GPU
_SHUFFLE_KINDS = {"xor": "bfly", "down": "down", "up": "up", "idx": "idx"}
_REGISTERS = {16: "h", 32: "r", 64: "l"}  # PTX register constraints by width


def shared_pointer(address):
    """A u32 shared-memory address (mg.shared.address) as an LLVM pointer in address space 3."""
    return lang.emit("llvm.inttoptr", [lang.cast(address, lang.i32)], [ir.Type.parse("!llvm.ptr<3>")]).result


def _f32_struct(values):
    """The f32 Scalars `values` packed into an LLVM struct, and its type."""
    struct = ir.Type.parse(f"!llvm.struct<({', '.join(['f32'] * len(values))})>")
    packed = lang.emit("llvm.mlir.undef", results=[struct]).result
    for i, v in enumerate(values):
        packed = lang.emit("llvm.insertvalue", [packed, v], [struct],
                           attributes={"position": ir.Attribute.dense_i64_array([i])}).result
    return packed, struct


def _f32_unpacked(struct_value, count):
    return [lang.Scalar(lang.emit("llvm.extractvalue", [struct_value], [ir.Type.f32()],
                                  attributes={"position": ir.Attribute.dense_i64_array([i])}).result, lang.f32)
            for i in range(count)]


def _require_hint(instruction):
    # PTX's L1 eviction priorities came with PTX ISA 7.4.
    if "::" in instruction:
        lang.require(f"the cache hint {instruction}", ptx=74)


def _words(dtype, count):
    """(bits, number) of the words a hinted access of `count` elements moves:
    the elements themselves from 32 bits up, else 32-bit words of them (one
    16-bit word for a lone 16-bit element)."""
    nbytes = count * dtype.itemsize
    if dtype.itemsize >= 4:
        return dtype.itemsize * 8, count
    return (32, nbytes // 4) if nbytes % 4 == 0 else (16, nbytes // 2)


def llvm_atomicrmw(operation, pointer, value, order, syncscope):
    """llvm.atomicrmw `operation` (an AtomicBinOp name) of `value` at `pointer`."""
    i64 = ir.Type.integer(64)
    op = lang.emit("llvm.atomicrmw", [pointer, value], [value.value.type], attributes={
        "bin_op": ir.Attribute.integer(_BIN_OPS[operation], i64),
        "ordering": ir.Attribute.integer(ORDERINGS[order], i64),
        "syncscope": ir.Attribute.string(syncscope)})
    return lang.Scalar(op.result, value.dtype)


class GpuLowering:
    """The GPU: each hook emits the gpu or nvvm dialect operation."""

    #: The operation that ends a kernel's body.
    return_op = "gpu.return"

    def kernel_function(self, module, name, types, location, attributes, argument_attributes=None):
        """The kernel's function in `module`, taking `types` (with
        `argument_attributes`, a dict of LLVM attribute names per argument:
        llvm.noalias, llvm.readonly); returns its entry block. On the GPU a
        gpu.func with the gpu.kernel attribute, in gpu.module @kernels of a
        gpu.container_module."""
        if argument_attributes and any(argument_attributes):
            attributes = dict(attributes, arg_attrs=ir.Attribute.array(
                [ir.Attribute.dictionary({k: ir.Attribute.unit() for k in names}) for names in argument_attributes]))
        module.operation.set_attribute("gpu.container_module", ir.Attribute.unit())
        with ir.InsertionPoint(module.body):
            gpu_module = ir.Operation.create("gpu.module", attributes={"sym_name": ir.Attribute.string("kernels")},
                                             regions=1, location=location)
        with ir.InsertionPoint(gpu_module.regions[0].append_block()):
            func = ir.Operation.create("gpu.func", regions=1, location=location, attributes={
                "sym_name": ir.Attribute.string(name),
                "function_type": ir.Attribute.type_attr(ir.Type.function(types, [])),
                "gpu.kernel": ir.Attribute.unit(), **attributes})
        return func.regions[0].append_block(types, [location] * len(types))

    def memref_parameter_types(self, shape, dtype):
        """The function's argument types for a memref parameter of `shape`
        (None for a dynamic extent). Static: the memref, passed as a bare
        pointer. Dynamic: a rank-0 memref (the bare pointer) and one index
        per dynamic extent, the launch passing each after the pointer."""
        element = lang.ir_type(dtype)
        if None not in shape:
            return [ir.Type.memref(shape, element)]
        return [ir.Type.memref([], element)] + [ir.Type.index()] * shape.count(None)

    def memref_parameter(self, arguments, shape, dtype, name, readonly=False):
        """The MemRef of a parameter, from the iterator of its block arguments
        (those memref_parameter_types gave): on the GPU, a dynamic one is its
        pointer viewed with its sizes (memref.reinterpret_cast, row-major)."""
        pointer = next(arguments)
        if None not in shape:
            return lang.MemRef(pointer, dtype, shape, name, readonly)
        sizes = [lang.Scalar(next(arguments), lang.index) if d is None else d for d in shape]
        strides = [1]  # row-major: each stride the product of the sizes after it
        for size in reversed(sizes[1:]):
            # Asked of an int only: a traced stride's == is a traced comparison, never a Python bool.
            unit = isinstance(strides[0], int) and strides[0] == 1
            strides.insert(0, size if unit else strides[0] * size)
        result = ir.Type.memref([ir.DYNAMIC if d is None else d for d in shape], lang.ir_type(dtype))
        view = lang.emit("memref.reinterpret_cast", [pointer, *[v for v in sizes if isinstance(v, lang.Scalar)],
                                                     *[v for v in strides if isinstance(v, lang.Scalar)]],
                         [result], attributes={
                             "operandSegmentSizes": ir.Attribute.dense_i32_array(
                                 [1, 0, sum(isinstance(v, lang.Scalar) for v in sizes),
                                  sum(isinstance(v, lang.Scalar) for v in strides)]),
                             "static_offsets": ir.Attribute.dense_i64_array([0]),
                             "static_sizes": ir.Attribute.dense_i64_array(
                                 [ir.DYNAMIC if isinstance(v, lang.Scalar) else v for v in sizes]),
                             "static_strides": ir.Attribute.dense_i64_array(
                                 [ir.DYNAMIC if isinstance(v, lang.Scalar) else v for v in strides])})
        return lang.MemRef(view.result, dtype, shape, name, readonly)

    def extra_argument_types(self):
        """Types of the arguments every traced function takes after its own (none on the GPU)."""
        return []

    def bind_extra_arguments(self, trace, arguments):
        """Called once per traced function with its extra block arguments."""

    def extra_call_operands(self):
        """What a call of a device function passes for its extra arguments."""
        return []

    def index(self, op, axis):
        """thread_idx / block_idx / block_dim / grid_dim along `axis`, as index."""
        attr = ir.Attribute.parse(f"#gpu<dim {axis}>")
        return lang.Scalar(lang.emit(op, results=[ir.Type.index()], attributes={"dimension": attr}).result,
                           lang.index)

    def barrier(self):
        lang.emit("gpu.barrier")

    def printf(self, format, operands):
        lang.emit("gpu.printf", operands, attributes={"format": ir.Attribute.string(format)})

    def shuffle(self, mode, value, offset, width):
        """shfl.sync `mode` ("xor", "down", "up", "idx") of a 32/64-bit scalar;
        `offset` i32, `width` a Python int: the lanes of a segment, written
        into the clamp operand as CUDA does, ((32 - width) << 8) | (up ? 0 : 31)."""
        clamp = lang.constant(((32 - width) << 8) | (0 if mode == "up" else 31), lang.i32)
        kind = ir.Attribute.parse(f"#nvvm<shfl_kind {_SHUFFLE_KINDS[mode]}>")
        full = lang.constant(-1, lang.i32)
        if value.dtype.itemsize == 4:
            t = ir.Type.f32() if value.dtype == lang.f32 else ir.Type.integer(32)
            op = lang.emit("nvvm.shfl.sync", [full, value, offset, clamp], [t], attributes={"kind": kind})
            return lang.Scalar(op.result, value.dtype)
        # 64 bits: each half shuffled on its own.
        i32, i64 = ir.Type.integer(32), ir.Type.integer(64)
        bits = lang.emit("arith.bitcast", [value], [i64]).result if value.dtype == lang.f64 else value.value
        low = lang.emit("arith.trunci", [bits], [i32]).result
        shift = lang.constant(32, lang.i64)
        high = lang.emit("arith.trunci", [lang.emit("arith.shrui", [bits, shift], [i64]).result], [i32]).result
        low, high = (lang.emit("nvvm.shfl.sync", [full, half, offset, clamp], [i32], attributes={"kind": kind}).result
                     for half in (low, high))
        low = lang.emit("arith.extui", [low], [i64]).result
        high = lang.emit("arith.shli", [lang.emit("arith.extui", [high], [i64]).result, shift], [i64]).result
        bits = lang.emit("arith.ori", [low, high], [i64]).result
        if value.dtype == lang.f64:
            bits = lang.emit("arith.bitcast", [bits], [ir.Type.f64()]).result
        return lang.Scalar(bits, value.dtype)

    def vote(self, kind, pred):
        """vote.sync `kind` ("ballot", "any", "all") over the full warp: a u32 of
        the lanes' predicates for a ballot, else a bool."""
        result = ir.Type.integer(32) if kind == "ballot" else ir.Type.integer(1)
        op = lang.emit("nvvm.vote.sync", [lang.constant(-1, lang.i32), pred], [result],
                       attributes={"kind": ir.Attribute.parse(f"#nvvm<vote_sync_kind {kind}>")})
        return lang.Scalar(op.result, lang.u32 if kind == "ballot" else lang.bool_)

    def warp_reduce(self, op, value):
        """The warp's reduction as one instruction, where there is one: PTX
        redux.sync on 32-bit integers (sm_80 and newer); None for the library's
        butterfly of shuffles."""
        if value.dtype not in (lang.i32, lang.u32):
            return None
        lang.require("mg.warp.reduce of 32-bit integers (redux.sync)", sm=80)
        kind = {"max": "umax", "min": "umin"}.get(op, op) if value.dtype == lang.u32 else op
        result = lang.emit("nvvm.redux.sync", [value, lang.constant(-1, lang.i32)], [ir.Type.integer(32)],
                           attributes={"kind": ir.Attribute.parse(f"#nvvm<redux_kind {kind}>")})
        return lang.Scalar(result.result, value.dtype)

    def global_pointer(self, pointer):
        """(pointer, address space) of a generic pointer into global memory: the
        global window (PTX cvta.to.global), so that loads, stores and atomics
        through it are ld.global, st.global and atom.global."""
        cast = lang.emit("llvm.addrspacecast", [pointer], [ir.Type.parse("!llvm.ptr<1>")])
        return cast.result, 1

    def sync_scope(self, scope):
        """The LLVM sync scope of an atomic's `scope` ("cta", "gpu", "sys"): the
        NVPTX back end's names, written as PTX's .cta, .gpu and .sys."""
        return {"cta": "block", "gpu": "device", "sys": ""}[scope]

    def atomic_rmw(self, operation, pointer, value, order, scope, space):
        """The atomic read-modify-write `operation` (an LLVM AtomicBinOp name)
        of `value` at `pointer` (in LLVM address space `space`); its old value.

        LLVM 22's NVPTX back end writes every atomicrmw as a relaxed `atom`,
        whatever its ordering and scope, so an ordered or narrower one is
        PTX's `atom.<order>.<scope>` itself; float max/min (no PTX atom) and
        8/16-bit integers become a compare-and-swap loop, which LLVM orders."""
        dtype = value.dtype
        registers = _PTX_REGISTERS.get(dtype.name)
        if (order, scope) == ("relaxed", "gpu") or registers is None or operation in ("fmax", "fmin"):
            return llvm_atomicrmw(operation, pointer, value, order, self.sync_scope(scope))
        bits = dtype.itemsize * 8
        instruction = "add.s32" if operation == "add" and dtype == lang.i32 else _PTX_ATOM[operation] + str(bits)
        asm = f"atom.{order}.{scope}{_PTX_SPACES[space]}.{instruction} $0, [$1], $2;"
        op = lang.emit("llvm.inline_asm", [pointer, value], [value.value.type], attributes={
            "asm_string": ir.Attribute.string(asm),
            "constraints": ir.Attribute.string(f"={registers},l,{registers},~{{memory}}"),
            "has_side_effects": ir.Attribute.unit()})
        return lang.Scalar(op.result, dtype)

    def fence(self, scope):
        """A sequentially consistent fence among the threads of `scope` (CUDA's
        __threadfence_block, __threadfence, __threadfence_system): PTX membar.cta,
        membar.gl and membar.sys, as nvcc writes them."""
        lang.emit("nvvm.memory.barrier", attributes={"scope": ir.Attribute.parse(f"#nvvm.mem_scope<{scope}>")})

    def grid_sync(self):
        """mg.grid.sync(): the library's barrier (language/grid.py) over a
        counter of the module's own, a zero-initialized u32 global whose
        symbol tells the launch to go cooperative."""
        from ..language.grid import COUNTER, counter_barrier
        state = lang.module_state()
        space = "#gpu.address_space<global>"
        counter_type = ir.Type.parse(f"memref<1xi32, {space}>")
        if COUNTER not in state:
            state[COUNTER] = True
            with lang.gpu_module_scope():
                ir.Operation.create("memref.global", location=lang.location(), attributes={
                    "sym_name": ir.Attribute.string(COUNTER),
                    "type": ir.Attribute.type_attr(counter_type),
                    "initial_value": ir.Attribute.parse("dense<0> : tensor<1xi32>"),
                    "alignment": ir.Attribute.integer(4)})
        value = lang.emit("memref.get_global", results=[counter_type],
                          attributes={"name": ir.Attribute.symbol_ref(COUNTER)}).result
        counter_barrier(lang.MemRef(value, lang.u32, (1,), "the grid barrier's counter"))

    def hinted_load(self, memref, indices, length, cache):
        """memref[indices] (a Scalar; `length` elements as a Vector) read with
        the PTX of the cache hint: an `ld.global.<hint>` of the element's (or
        vector's) bits, as CUDA's __ldg and __ldcs are written."""
        _require_hint(LOAD_HINTS[cache])
        pointer, _ = lang.element_pointer(memref, indices)
        dtype, count = memref.dtype, length or 1
        word_bits, words = _words(dtype, count)
        register = _REGISTERS[word_bits]
        word = ir.Type.integer(word_bits)
        shape = f".v{words}" if words > 1 else ""
        outputs = "{" + ", ".join(f"${k}" for k in range(words)) + "}" if words > 1 else "$0"
        result = ir.Type.parse(f"!llvm.struct<({', '.join([str(word)] * words)})>") if words > 1 else word
        op = lang.emit("llvm.inline_asm", [pointer], [result], attributes={
            "asm_string": ir.Attribute.string(f"{LOAD_HINTS[cache]}{shape}.b{word_bits} {outputs}, [${words}];"),
            "constraints": ir.Attribute.string(",".join([f"={register}"] * words + ["l"])),
            "has_side_effects": ir.Attribute.unit()})
        if words == 1 and length is None:
            bits = op.result
            if lang.is_float(dtype):
                bits = lang.emit("arith.bitcast", [bits], [lang.ir_type(dtype)]).result
            return lang.Scalar(bits, dtype)
        parts = [op.result] if words == 1 else [
            lang.emit("llvm.extractvalue", [op.result], [word],
                      attributes={"position": ir.Attribute.dense_i64_array([k])}).result for k in range(words)]
        packed = lang.emit("vector.from_elements", parts, [ir.Type.vector([words], word)]).result
        vector = lang.emit("vector.bitcast", [packed], [ir.Type.vector([count], lang.ir_type(dtype))]).result
        return Vector(vector, dtype, count)

    def hinted_store(self, memref, indices, value, cache):
        """memref[indices] = value (a Scalar or Vector), written with the PTX
        of the cache hint: `st.global.<hint>` of its bits (CUDA's __stcs)."""
        _require_hint(STORE_HINTS[cache])
        pointer, _ = lang.element_pointer(memref, indices)
        dtype = memref.dtype
        count = value.length if isinstance(value, Vector) else 1
        word_bits, words = _words(dtype, count)
        word = ir.Type.integer(word_bits)
        if isinstance(value, Vector):
            packed = lang.emit("vector.bitcast", [value.value], [ir.Type.vector([words], word)]).result
            parts = [lang.emit("vector.extract", [packed], [word], attributes={
                "static_position": ir.Attribute.dense_i64_array([k])}).result for k in range(words)]
        else:
            parts = [lang.emit("arith.bitcast", [value], [word]).result if lang.is_float(dtype) else value.value]
        shape = f".v{words}" if words > 1 else ""
        inputs = "{" + ", ".join(f"${k + 1}" for k in range(words)) + "}" if words > 1 else "$1"
        lang.emit("llvm.inline_asm", [pointer, *parts], [], attributes={
            "asm_string": ir.Attribute.string(f"{STORE_HINTS[cache]}{shape}.b{word_bits} [$0], {inputs};"),
            "constraints": ir.Attribute.string(",".join(["l"] + [_REGISTERS[word_bits]] * words + ["~{memory}"])),
            "has_side_effects": ir.Attribute.unit()})

    def reciprocal_approx(self, x):
        """1 / x of an f32, approximate: PTX rcp.approx.ftz.f32."""
        return lang.Scalar(lang.emit("nvvm.rcp.approx.ftz.f", [x], [x.value.type]).result, x.dtype)

    def exp2_approx(self, x):
        """2 ** x of an f32, approximate: PTX ex2.approx.ftz.f32 (NVVM has no
        operation for it; without side effects, the compiler may move or share it)."""
        return lang.Scalar(lang.emit("llvm.inline_asm", [x], [x.value.type], attributes={
            "asm_string": ir.Attribute.string("ex2.approx.ftz.f32 $0, $1;"),
            "constraints": ir.Attribute.string("=f,f")}).result, x.dtype)

    def lane_id(self):
        return lang.Scalar(lang.emit("gpu.lane_id", results=[ir.Type.index()]).result, lang.index)

    def shared_memory_space(self):
        """The memory-space suffix of a shared-memory memref type."""
        return ", #gpu.address_space<workgroup>"

    def static_shared(self, state, shape, dtype, type_text, nbytes):
        """(key, value): the first call for a call site defines the array and
        returns a key; `value(key)` is the memref of that array."""
        name = lang.unique_symbol("__shared")
        with lang.gpu_module_scope():
            ir.Operation.create("memref.global", location=lang.location(), attributes={
                "sym_name": ir.Attribute.string(name),
                "sym_visibility": ir.Attribute.string("private"),
                "type": ir.Attribute.type_attr(ir.Type.parse(type_text)),
                "alignment": ir.Attribute.integer(16)})
        return name

    def static_shared_value(self, key, type_text):
        return lang.emit("memref.get_global", results=[ir.Type.parse(type_text)],
                         attributes={"name": ir.Attribute.symbol_ref(key)}).result

    def dynamic_shared_bytes(self, state):
        """The launch's dynamic shared memory as (memref<?xi8>, its size in bytes as index)."""
        name = state.get("dynamic_shared")
        i8_array = f"memref<0xi8{self.shared_memory_space()}>"
        if name is None:
            name = lang.unique_symbol("__mg_dynamic_shared")
            with lang.gpu_module_scope():
                # No initial value and public: an external declaration, which PTX
                # spells `.extern .shared .b8 name[]`, the dynamic shared memory.
                ir.Operation.create("memref.global", location=lang.location(), attributes={
                    "sym_name": ir.Attribute.string(name),
                    "type": ir.Attribute.type_attr(ir.Type.parse(i8_array)),
                    "alignment": ir.Attribute.integer(16)})
            state["dynamic_shared"] = name
        raw = lang.emit("memref.get_global", results=[ir.Type.parse(i8_array)],
                        attributes={"name": ir.Attribute.symbol_ref(name)}).result
        size = lang.emit("nvvm.read.ptx.sreg.dynamic.smem.size", results=[ir.Type.integer(32)])
        nbytes = lang.cast(lang.Scalar(size.result, lang.u32), lang.index)
        as_bytes = lang.emit("memref.reinterpret_cast", [raw, nbytes],
                             [ir.Type.parse(f"memref<?xi8{self.shared_memory_space()}>")],
                             attributes={
                                 "operandSegmentSizes": ir.Attribute.dense_i32_array([1, 0, 1, 0]),
                                 "static_offsets": ir.Attribute.dense_i64_array([0]),
                                 "static_sizes": ir.Attribute.dense_i64_array([ir.DYNAMIC]),
                                 "static_strides": ir.Attribute.dense_i64_array([1])}).result
        return as_bytes, nbytes

    def vector_alignment(self, dtype, nbytes):
        """The alignment a vector access of `nbytes` may assume (the GPU faults on less)."""
        return nbytes

    def require_gpu(self, what):
        """Before an operation only the GPU has (thread-block clusters): nothing here."""

    def check_access(self, memref, indices, kind, length=1):
        """Before an access of `memref` at `indices`: nothing on the GPU."""

    def loop_iteration(self, trips):
        """At the top of a loop's body (`trips`: its trip count where the trace
        knows it, else None): nothing on the GPU."""

    def check_division(self, a, b):
        """Before the integer division a // b or a % b: the divisor to divide
        by. `b` on the GPU, where dividing by zero (or INT_MIN by -1) gives an
        unspecified value."""
        return b

    def finish(self, module, state):
        """Called once the kernel's module is traced: what it requires of the
        PTX version and chip (core.require) goes on the module, for the compiler."""
        for key in ("min_ptx", "min_sm"):
            if key in state:
                value, what = state[key]
                module.operation.set_attribute(f"mg.{key}", ir.Attribute.dictionary({
                    "version": ir.Attribute.integer(value, ir.Type.integer(32)),
                    "for": ir.Attribute.string(what)}))

    # -- the tensor-core operations of sm_80 (mg.mma) ----------------------
    def mma_sync(self, kind, a, b, c):
        """nvvm.mma.sync of the atom `kind` ("f16", "bf16", "tf32") on this
        lane's fragments (Scalars in register order); D's 4 f32 values.
        nvvm.mma.sync rather than nvgpu.mma.sync: MLIR 22's nvgpu op cannot
        deduce the PTX types of bf16 operands. Inputs go as the op wants
        them: f16 pairs as vector<2xf16>, bf16 pairs and tf32 values as i32."""
        from ..language.mma import registers
        if kind == "tf32":
            a_regs, b_regs = registers(a, lang.f32), registers(b, lang.f32)
        else:
            # Pairs as 2-vectors (bf16's then bitcast to i32): PTX moves the two
            # halves into one register (`mov.b32 %r, {%h, %h}`), which ptxas
            # elides where they came out of one register (an ldmatrix's, or one
            # carried through a loop), where shifts and ors would be computed.
            element = ir.Type.f16() if kind == "f16" else ir.Type.bf16()
            pair = ir.Type.vector([2], element)

            def packed(x, i):
                vector = lang.emit("vector.from_elements", [x[i], x[i + 1]], [pair]).result
                if kind == "f16":
                    return vector
                word = lang.emit("vector.bitcast", [vector], [ir.Type.vector([1], ir.Type.integer(32))]).result
                return lang.emit("vector.extract", [word], [ir.Type.integer(32)], {
                    "static_position": ir.Attribute.dense_i64_array([0])}).result
            a_regs, b_regs = ([packed(x, i) for i in range(0, len(x), 2)] for x in (a, b))
        k = 8 if kind == "tf32" else 16
        attributes = {
            "shape": ir.Attribute.parse(f"#nvvm.shape<m = 16, n = 8, k = {k}>"),
            "layoutA": ir.Attribute.parse("#nvvm.mma_layout<row>"),
            "layoutB": ir.Attribute.parse("#nvvm.mma_layout<col>"),
            "multiplicandAPtxType": ir.Attribute.parse(f"#nvvm.mma_type<{kind}>"),
            "multiplicandBPtxType": ir.Attribute.parse(f"#nvvm.mma_type<{kind}>"),
            "operandSegmentSizes": ir.Attribute.dense_i32_array([len(a_regs), len(b_regs), len(c)]),
        }
        result = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")
        d = lang.emit("nvvm.mma.sync", [*a_regs, *b_regs, *c], [result], attributes).result
        return [lang.Scalar(lang.emit("llvm.extractvalue", [d], [ir.Type.f32()], {
            "position": ir.Attribute.dense_i64_array([i])}).result, lang.f32) for i in range(4)]

    def ldmatrix(self, memref, indices, count, transpose):
        """nvgpu.ldmatrix: this lane's 2 * count elements, register by register."""
        element = lang.ir_type(memref.dtype)
        vector = ir.Type.vector([count, 2], element)
        loaded = lang.emit("nvgpu.ldmatrix", [memref.value, *indices], [vector], {
            "numTiles": ir.Attribute.integer(count, ir.Type.integer(32)),
            "transpose": ir.Attribute.bool(transpose)}).result
        return [lang.Scalar(lang.emit("vector.extract", [loaded], [element], {
            "static_position": ir.Attribute.dense_i64_array([j, p])}).result, memref.dtype)
            for j in range(count) for p in range(2)]

    def async_copy(self, dst, dst_indices, src, src_indices, elements, valid):
        """nvgpu.device_async_copy (cp.async; .cg, bypassing L1, for 16 bytes);
        `valid` false: a source size of 0, which zero-fills."""
        operands = [dst.value, *dst_indices, src.value, *src_indices]
        attributes = {"dstElements": ir.Attribute.integer(elements, ir.Type.index())}
        if valid is not None:
            operands.append(lang.select(valid, lang.constant(elements, lang.index),
                                        lang.constant(0, lang.index)))
        if elements * dst.dtype.itemsize == 16:
            attributes["bypassL1"] = ir.Attribute.unit()
        attributes["operandSegmentSizes"] = ir.Attribute.dense_i32_array(
            [1, len(dst_indices), 1, len(src_indices), 1 if valid is not None else 0])
        lang.emit("nvgpu.device_async_copy", operands, [ir.Type.parse("!nvgpu.device.async.token")],
                  attributes)

    def async_commit(self):
        # nvvm's op, not nvgpu's: nvgpu's groups are tokens, which a traced
        # loop's iterations could not pass to one another.
        lang.emit("nvvm.cp.async.commit.group")

    def async_wait(self, n):
        lang.emit("nvvm.cp.async.wait.group", attributes={"n": ir.Attribute.integer(n, ir.Type.integer(32))})

    # -- Hopper (sm_90): mbarriers, named barriers, TMA, wgmma ---------------
    # Shared memory is named by u32 addresses (mg.shared.address), counts and
    # coordinates are i32 Scalars.
    def mbarrier_init(self, address, count):
        """mbarrier.init: the barrier at `address` expects `count` arrivals a phase."""
        lang.emit("nvvm.mbarrier.init", [shared_pointer(address), count])

    def mbarrier_arrive(self, address, nbytes=None):
        """mbarrier.arrive, or with `nbytes` mbarrier.arrive.expect_tx (the bytes, then the arrival)."""
        if nbytes is None:
            lang.emit("nvvm.mbarrier.arrive", [shared_pointer(address)], [ir.Type.integer(64)])
            return
        lang.emit("nvvm.mbarrier.arrive.expect_tx", [shared_pointer(address), nbytes],
                  [ir.Type.integer(64)], attributes={"relaxed": ir.Attribute.parse("false"),
                                                     "scope": ir.Attribute.parse("#nvvm.mem_scope<cta>")})

    def mbarrier_wait(self, address, parity):
        """Until the phase of parity `parity` completes: mbarrier.try_wait.parity in a loop."""
        lang.emit("nvvm.mbarrier.try_wait.parity", [shared_pointer(address), parity,
                                                    lang.constant(10_000_000, lang.i32)])

    def mbarrier_fence_init(self):
        """fence.mbarrier_init: initialised barriers visible to the cluster and the copy engine."""
        lang.emit("nvvm.fence.mbarrier.init")

    def named_barrier(self, barrier_id, threads, wait):
        """bar.sync (wait) or bar.arrive of named barrier `barrier_id` counting `threads`."""
        if wait:
            lang.emit("nvvm.barrier", [barrier_id, threads],
                      attributes={"operandSegmentSizes": ir.Attribute.dense_i32_array([1, 1, 0])})
        else:
            lang.emit("nvvm.barrier.arrive", [barrier_id, threads])

    def set_max_registers(self, count, increase):
        """setmaxnreg.inc/dec of `count` (a Python int)."""
        action = "increase" if increase else "decrease"
        lang.emit("nvvm.setmaxregister", attributes={"action": ir.Attribute.parse(f"#nvvm<action {action}>"),
                                                     "regCount": ir.Attribute.integer(count, ir.Type.integer(32))})

    def tma_load(self, tensor_map, destination, coords, barrier, mask):
        """cp.async.bulk.tensor of the box at `coords` (i32, innermost first) of
        the map (its parameter's pointer) to shared `destination`, completing
        on the mbarrier at `barrier`; `mask` [i16] multicasts over the cluster."""
        cluster = lang.emit("llvm.addrspacecast", [shared_pointer(destination)],
                            [ir.Type.parse("!llvm.ptr<7>")]).result
        lang.emit("nvvm.cp.async.bulk.tensor.shared.cluster.global",
                  [cluster, tensor_map, *coords, shared_pointer(barrier), *mask], attributes={
                      "isCTAOnly": ir.Attribute.parse("false"),
                      "mode": ir.Attribute.parse("#nvvm.tma_load_mode<tile>"),
                      "operandSegmentSizes": ir.Attribute.dense_i32_array([1, 1, len(coords), 1, 0, len(mask), 0, 0])})

    def tma_store(self, tensor_map, source, coords, add=False):
        """cp.async.bulk.tensor of shared `source` to the box at `coords` of the map;
        with `add`, cp.reduce.async.bulk.tensor .add of it to what the box holds."""
        if add:
            lang.emit("nvvm.cp.async.bulk.tensor.reduce", [tensor_map, shared_pointer(source), *coords], attributes={
                "redKind": ir.Attribute.parse("#nvvm.tma_redux_kind<add>"),
                "mode": ir.Attribute.parse("#nvvm.tma_store_mode<tile>"),
                "operandSegmentSizes": ir.Attribute.dense_i32_array([1, 1, len(coords), 0])})
            return
        lang.emit("nvvm.cp.async.bulk.tensor.global.shared.cta",
                  [tensor_map, shared_pointer(source), *coords], attributes={
                      "mode": ir.Attribute.parse("#nvvm.tma_store_mode<tile>"),
                      "operandSegmentSizes": ir.Attribute.dense_i32_array([1, 1, len(coords), 0, 0])})

    def tma_commit(self):
        lang.emit("nvvm.cp.async.bulk.commit.group")

    def tma_wait(self, pending, read):
        attributes = {"group": ir.Attribute.integer(pending, ir.Type.integer(32))}
        if read:
            attributes["read"] = ir.Attribute.unit()
        lang.emit("nvvm.cp.async.bulk.wait_group", attributes=attributes)

    def fence_proxy_async(self):
        """fence.proxy.async.shared::cta."""
        lang.emit("nvvm.fence.proxy", attributes={"kind": ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                                                  "space": ir.Attribute.parse("#nvvm.shared_space<cta>")})

    def wgmma_mma(self, values, a, b, n, k, type_a, type_b, b_major):
        """wgmma.mma_async m64nNk`k`, f32 += `type_a` x `type_b` (wgmma's type
        names: f16, bf16), of the u64 descriptors `a` (K-major) and `b`
        (`b_major`) on this thread's accumulators `values` (N/2 f32
        Scalars); the new ones."""
        packed, struct = _f32_struct(values)
        op = lang.emit("nvvm.wgmma.mma_async", [packed, a, b], [struct], attributes={
            "shape": ir.Attribute.parse(f"#nvvm.shape<m = 64, n = {n}, k = {k}>"),
            "typeA": ir.Attribute.parse(f"#nvvm.wgmma_type<{type_a}>"),
            "typeB": ir.Attribute.parse(f"#nvvm.wgmma_type<{type_b}>"),
            "typeD": ir.Attribute.parse("#nvvm.wgmma_type<f32>"),
            "scaleA": ir.Attribute.parse("#nvvm.wgmma_scale_in<one>"),
            "scaleB": ir.Attribute.parse("#nvvm.wgmma_scale_in<one>"),
            "scaleD": ir.Attribute.parse("#nvvm.wgmma_scale_out<one>"),
            "layoutA": ir.Attribute.parse("#nvvm.mma_layout<row>"),
            # K-major B is the "col" (untransposed) operand of the PTX instruction.
            "layoutB": ir.Attribute.parse(f"#nvvm.mma_layout<{'col' if b_major == 'K' else 'row'}>")})
        return _f32_unpacked(op.result, len(values))

    def wgmma_mma_registers(self, values, words, b, n, type_ab, b_major):
        """wgmma.mma_async m64nNk16 (m64nNk32 for the 8-bit e4m3 and e5m2),
        f32 += `type_ab` x `type_ab`, of A in this thread's 4 i32 registers
        `words` and the u64 descriptor `b`, on its accumulators `values`; the
        new ones. Inline PTX: MLIR 22's nvvm.wgmma.mma_async takes A by
        descriptor only."""
        count = len(values)
        struct = ir.Type.parse(f"!llvm.struct<({', '.join(['f32'] * count)})>")
        # Operands: the accumulators out ($0..), the same in (tied to them), A's words, B's descriptor.
        accumulators = ", ".join(f"${i}" for i in range(count))
        registers = ", ".join(f"${2 * count + i}" for i in range(4))
        # 8-bit operands are K-major only: their form has no transpose immediate.
        k, transpose = (32, "") if type_ab in ("e4m3", "e5m2") else (16, f", {1 if b_major == 'MN' else 0}")
        asm = ("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{type_ab}.{type_ab} {{{accumulators}}}, "
               f"{{{registers}}}, ${2 * count + 4}, p, 1, 1{transpose};\n}}")
        constraints = ",".join(["=f"] * count + [str(i) for i in range(count)] + ["r"] * 4 + ["l"])
        op = lang.emit("llvm.inline_asm", [*values, *words, b], [struct],
                       attributes={"asm_string": ir.Attribute.string(asm),
                                   "constraints": ir.Attribute.string(constraints),
                                   "has_side_effects": ir.Attribute.unit()})
        return _f32_unpacked(op.result, count)

    def float8_word(self, values, type_name):
        """Four f32 values rounded to 8-bit floats (`type_name`: e4m3 or e5m2;
        to nearest, saturating to the largest finite value) as the bytes of
        one i32 word, the first value in the low byte: two cvt.rn.satfinite
        of pairs, whose first operand goes to the high byte."""
        asm = ("{\n.reg .b16 low, high;\n"
               f"cvt.rn.satfinite.{type_name}x2.f32 low, $2, $1;\n"
               f"cvt.rn.satfinite.{type_name}x2.f32 high, $4, $3;\n"
               "mov.b32 $0, {low, high};\n}")
        op = lang.emit("llvm.inline_asm", list(values), [ir.Type.integer(32)],
                       attributes={"asm_string": ir.Attribute.string(asm),
                                   "constraints": ir.Attribute.string("=r,f,f,f,f")})
        return lang.Scalar(op.result, lang.i32)

    def wgmma_fence(self):
        lang.emit("nvvm.wgmma.fence.aligned")

    def wgmma_commit(self):
        lang.emit("nvvm.wgmma.commit.group.sync.aligned")

    def wgmma_wait(self, pending, values):
        """wgmma.wait_group `pending`; given the accumulator `values`, returns
        them as the wait's results (see mg.wgmma.wait_group), else None."""
        if values is None:
            lang.emit("nvvm.wgmma.wait.group.sync.aligned",
                      attributes={"group": ir.Attribute.integer(pending, ir.Type.integer(64))})
            return None
        struct = ir.Type.parse(f"!llvm.struct<({', '.join(['f32'] * len(values))})>")
        # Each value in and out of the same register ("=f" tied to its input "N").
        constraints = ",".join(["=f"] * len(values) + [str(i) for i in range(len(values))])
        op = lang.emit("llvm.inline_asm", values, [struct], attributes={
            "asm_string": ir.Attribute.string(f"wgmma.wait_group.sync.aligned {pending};"),
            "constraints": ir.Attribute.string(constraints),
            "has_side_effects": ir.Attribute.unit()})
        return _f32_unpacked(op.result, len(values))
