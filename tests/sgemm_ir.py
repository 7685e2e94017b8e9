"""The naive SGEMM kernel built operation by operation through mlirgpu.ir.

    module attributes {gpu.container_module} {
      gpu.module @kernels {
        gpu.func @sgemm_naive(%A: memref<MxKxf32>, %B: memref<KxNxf32>, %C: memref<MxNxf32>) kernel {
          r = block_dim.x * block_id.x + thread_id.x
          c = block_dim.y * block_id.y + thread_id.y
          acc = scf.for k = 0 to K iter_args(acc = 0.0) { acc + A[r, k] * B[k, c] }
          C[r, c] = acc
          gpu.return
        }
      }
    }

Nothing here is parsed from text: every operation comes from
ir.Operation.create, so the builder exercises the IR layer the kernel DSL
stands on. Each operation is located at the line of this file that made it.
"""
import sys

from mlirgpu import ir

__all__ = ["build_sgemm_module"]


def _here():
    """The line of this file that asked for an operation."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__ and frame.f_code.co_name.startswith("_"):
        frame = frame.f_back
    return ir.Location.file(__file__, frame.f_lineno, 0)


def _op(name, operands=(), results=(), attributes=None, regions=0):
    return ir.Operation.create(name, operands=operands, results=results, attributes=attributes,
                               regions=regions, location=_here())


def _index_constant(value):
    index = ir.Type.index()
    return _op("arith.constant", results=[index],
               attributes={"value": ir.Attribute.integer(value, index)}).result


def _gpu_dim(kind, axis):
    """gpu.thread_id / gpu.block_id / gpu.block_dim along 'x', 'y' or 'z'."""
    return _op(f"gpu.{kind}", results=[ir.Type.index()],
               attributes={"dimension": ir.Attribute.parse(f"#gpu<dim {axis}>")}).result


def _binary(name, lhs, rhs):
    return _op(name, operands=[lhs, rhs], results=[lhs.type]).result


def build_sgemm_module(M, K, N, *, context=None, kernel_name="sgemm_naive", module_name="kernels"):
    """A verified module holding gpu.module @module_name with the kernel
    gpu.func @kernel_name(A: memref<MxKxf32>, B: memref<KxNxf32>, C: memref<MxNxf32>)
    computing C = A @ B, one thread per element of C (launch it with
    grid=(M/bx, N/by), block=(bx, by))."""
    context = context or ir.Context.current()
    with context:
        f32, index = ir.Type.f32(), ir.Type.index()
        a_type, b_type, c_type = (ir.Type.memref(shape, f32) for shape in ([M, K], [K, N], [M, N]))
        module = ir.Module.create(location=_here())
        module.operation.set_attribute("gpu.container_module", ir.Attribute.unit())
        with ir.InsertionPoint(module.body):
            gpu_module = _op("gpu.module", attributes={"sym_name": ir.Attribute.string(module_name)},
                             regions=1)
        with ir.InsertionPoint(gpu_module.regions[0].append_block()):
            kernel = _op("gpu.func", regions=1, attributes={
                "sym_name": ir.Attribute.string(kernel_name),
                "function_type": ir.Attribute.type_attr(ir.Type.function([a_type, b_type, c_type], [])),
                "gpu.kernel": ir.Attribute.unit(),
            })
        body = kernel.regions[0].append_block([a_type, b_type, c_type])
        A, B, C = body.arguments
        with ir.InsertionPoint(body):
            zero = _op("arith.constant", results=[f32],
                       attributes={"value": ir.Attribute.float(0.0, f32)}).result
            row = _binary("arith.addi", _binary("arith.muli", _gpu_dim("block_dim", "x"),
                                                _gpu_dim("block_id", "x")), _gpu_dim("thread_id", "x"))
            col = _binary("arith.addi", _binary("arith.muli", _gpu_dim("block_dim", "y"),
                                                _gpu_dim("block_id", "y")), _gpu_dim("thread_id", "y"))
            loop = _op("scf.for", operands=[_index_constant(0), _index_constant(K), _index_constant(1), zero],
                       results=[f32], regions=1)
            loop_body = loop.regions[0].append_block([index, f32])
            k, acc = loop_body.arguments
            with ir.InsertionPoint(loop_body):
                a = _op("memref.load", operands=[A, row, k], results=[f32]).result
                b = _op("memref.load", operands=[B, k, col], results=[f32]).result
                _op("scf.yield", operands=[_binary("arith.addf", acc, _binary("arith.mulf", a, b))])
            _op("memref.store", operands=[loop.result, C, row, col])
            _op("gpu.return")
        module.verify()
    return module
