"""What the kernel language's target-dependent operations become.

Most of the language (arithmetic, loads, stores, loops) is the same MLIR for
every target. A few operations are not: thread indices, barriers, printf,
shuffles, shared memory, the Hopper operations only a GPU has, and the checks a debugging target adds around
memory accesses. The trace asks its `Target` for those. This class is the
GPU's meaning, the gpu and nvvm dialects' own operations; a backend that runs
kernels elsewhere (the CPU backend, mlirgpu.compiler.cpu) subclasses it, and
the language never needs to know which one it is tracing for.
"""
from .. import ir
from . import core as lang

__all__ = ["Target"]


class Target:
    """The GPU: each hook emits the gpu or nvvm dialect operation."""

    #: The operation that ends a kernel's body.
    return_op = "gpu.return"

    def kernel_function(self, module, name, types, location, attributes):
        """The kernel's function in `module`, taking `types`; returns its entry
        block. On the GPU a gpu.func with the gpu.kernel attribute, in
        gpu.module @kernels of a gpu.container_module."""
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
        """gpu.shuffle `mode` ("xor", "down", "up", "idx") of a 32/64-bit scalar; `offset` and `width` i32."""
        op = lang.emit("gpu.shuffle", [value, offset, width], [value.value.type, ir.Type.integer(1)],
                       attributes={"mode": ir.Attribute.parse(f"#gpu<shuffle_mode {mode}>")})
        return lang.Scalar(op.results[0], value.dtype)

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
        """Before an operation only the GPU has (TMA, mbarriers, wgmma): nothing here."""

    def check_access(self, memref, indices, kind, length=1):
        """Before an access of `memref` at `indices`: nothing on the GPU."""

    def finish(self, module, state):
        """Called once the kernel's module is traced."""

    # -- the tensor-core operations of sm_80 (mg.mma) ----------------------
    def mma_sync(self, kind, a, b, c):
        """nvvm.mma.sync of the atom `kind` ("f16", "bf16", "tf32") on this
        lane's fragments (Scalars in register order); D's 4 f32 values.
        nvvm.mma.sync rather than nvgpu.mma.sync: MLIR 22's nvgpu op cannot
        deduce the PTX types of bf16 operands. Inputs go as the op wants
        them: f16 pairs as vector<2xf16>, bf16 pairs and tf32 values as i32."""
        from .mma import registers
        if kind == "f16":
            pair = ir.Type.vector([2], ir.Type.f16())
            a_regs, b_regs = ([lang.emit("vector.from_elements", [x[i], x[i + 1]], [pair]).result
                               for i in range(0, len(x), 2)] for x in (a, b))
        else:
            dtype = lang.f32 if kind == "tf32" else lang.bf16
            a_regs, b_regs = registers(a, dtype), registers(b, dtype)
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
