"""The naive SGEMM, built through mlirgpu.ir and lowered to PTX
and cubin (run on the GPU when there is one), then the same kernel written
with @mg.kernel, run on the current backend (mg.backend(): the GPU, else the
CPU) and checked against NumPy.

    python examples/sgemm_naive.py [M K N]         # MLIRGPU_BACKEND=cpu forces the CPU

Each thread computes one element of C = A @ B (plus one):

    r = block_dim.x * block_id.x + thread_id.x
    c = block_dim.y * block_id.y + thread_id.y
    C[r, c] = sum_k A[r, k] * B[k, c] + 1

M and N are multiples of 16 (the block is 16 x 16).
"""
import re
import sys
import time

import numpy as np

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, ir, thread_idx

M_, K_, N_, dtype_ = mg.generics("M K N dtype")


@mg.kernel(generics=(M_, K_, N_, dtype_))
def sgemm_naive(A: mg.memref[M_, K_, dtype_], B: mg.memref[K_, N_, dtype_],
                C: mg.memref[M_, N_, dtype_]):
    """One thread computes C[r, c], with the loop-carried value written explicitly."""
    one = mg.constant(1.0, dtype_)
    tmp = mg.constant(0.0, dtype_)
    r = block_dim.x * block_idx.x + thread_idx.x
    c = block_dim.y * block_idx.y + thread_idx.y
    for k, tmp in mg.range_(K_, iter_args=[tmp]):   # the explicit loop-carried form
        tmp += A[r, k] * B[k, c]
        tmp = yield tmp
    C[r, c] = tmp + one


def _user_location():
    """The line of _build that asked for the operation."""
    frame = sys._getframe(1)
    while frame.f_code.co_name != "_build":
        frame = frame.f_back
    return ir.Location.file(frame.f_code.co_filename, frame.f_lineno, 0)


def _op(name, operands=(), results=(), attributes=None, regions=0):
    """An operation at the current insertion point, located at the user's line."""
    return ir.Operation.create(name, operands=operands, results=results, attributes=attributes,
                               regions=regions, location=_user_location())


def _index(value):
    index = ir.Type.index()
    return _op("arith.constant", results=[index],
               attributes={"value": ir.Attribute.integer(value, index)}).result


def _dim(kind, axis):
    """gpu.thread_id / gpu.block_id / gpu.block_dim along axis 'x', 'y' or 'z'."""
    dim = ir.Attribute.parse(f"#gpu<dim {axis}>")
    return _op(f"gpu.{kind}", results=[ir.Type.index()], attributes={"dimension": dim}).result


def _binary(name, lhs, rhs):
    return _op(name, operands=[lhs, rhs], results=[lhs.type]).result


def build_naive_sgemm(M, K, N, *, context=None, kernel_name="sgemm_naive", module_name="kernels"):
    """A verified module holding gpu.module @<module_name> with
    gpu.func @<kernel_name>(A: memref<MxKxf32>, B: memref<KxNxf32>, C: memref<MxNxf32>)."""
    module = ir.Module.create(context=context)
    with module.context:
        return _build(module, M, K, N, kernel_name, module_name)


def _build(module, M, K, N, kernel_name, module_name):
    f32 = ir.Type.f32()
    a_type, b_type, c_type = (ir.Type.memref(shape, f32) for shape in ([M, K], [K, N], [M, N]))
    module.operation.set_attribute("gpu.container_module", ir.Attribute.unit())
    with ir.InsertionPoint(module.body):
        gpu_module = _op("gpu.module", attributes={"sym_name": ir.Attribute.string(module_name)}, regions=1)
    with ir.InsertionPoint(gpu_module.regions[0].append_block()):
        kernel = _op("gpu.func", regions=1, attributes={
            "sym_name": ir.Attribute.string(kernel_name),
            "function_type": ir.Attribute.type_attr(ir.Type.function([a_type, b_type, c_type], [])),
            "gpu.kernel": ir.Attribute.unit(),
        })
    body = kernel.regions[0].append_block([a_type, b_type, c_type])
    A, B, C = body.arguments
    with ir.InsertionPoint(body):
        one = _op("arith.constant", results=[f32], attributes={"value": ir.Attribute.float(1.0, f32)}).result
        zero = _op("arith.constant", results=[f32], attributes={"value": ir.Attribute.float(0.0, f32)}).result
        r = _binary("arith.addi", _binary("arith.muli", _dim("block_dim", "x"), _dim("block_id", "x")),
                    _dim("thread_id", "x"))
        c = _binary("arith.addi", _binary("arith.muli", _dim("block_dim", "y"), _dim("block_id", "y")),
                    _dim("thread_id", "y"))
        loop = _op("scf.for", operands=[_index(0), _index(K), _index(1), zero], results=[f32], regions=1)
        loop_body = loop.regions[0].append_block([ir.Type.index(), f32])
        k, acc = loop_body.arguments
        with ir.InsertionPoint(loop_body):
            a = _op("memref.load", operands=[A, r, k], results=[f32]).result
            b = _op("memref.load", operands=[B, k, c], results=[f32]).result
            acc = _binary("arith.addf", acc, _binary("arith.mulf", a, b))
            _op("scf.yield", operands=[acc])
        _op("memref.store", operands=[_binary("arith.addf", loop.result, one), C, r, c])
        _op("gpu.return")
    module.verify()
    return module


def main(M=256, K=128, N=256):
    module = build_naive_sgemm(M, K, N)
    start = time.perf_counter()
    compilation = mg.Compilation(module, chip=mg.cuda.Device(0).chip if mg.cuda.is_available() else "sm_90a")
    ptx = compilation.ptx
    elapsed = time.perf_counter() - start
    loads = len(re.findall(r"\bld\.global", ptx))
    entry = re.search(r"\.entry (\w+)", ptx).group(1)
    print(f"naive SGEMM {M}x{K} @ {K}x{N}: PTX for {compilation.target.chip} in {elapsed * 1e3:.0f} ms, "
          f"{len(ptx.splitlines())} lines, {loads} global loads, "
          f"entry {entry}")
    rng = np.random.default_rng(0)
    A = rng.random((M, K), dtype=np.float32)
    B = rng.random((K, N), dtype=np.float32)
    expected = A.astype(np.float64) @ B.astype(np.float64) + 1.0
    errors = []
    dA, dB = mg.to_device(A), mg.to_device(B)
    if mg.backend() == "cuda":
        function = mg.cuda.load_module(compilation.cubin).get_function("sgemm_naive")
        dC = mg.empty((M, N), mg.f32)
        function(dA, dB, dC, grid=(M // 16, N // 16), block=(16, 16))
        errors.append(_relative_error(dC.get(), expected))
        print(f"IR-built kernel ran on {mg.cuda.Device().name}: relative error against NumPy (float64) "
              f"{errors[-1]:.2e}")
    where = mg.cuda.Device().name if mg.backend() == "cuda" else "the host"
    dC = mg.empty((M, N), mg.f32)
    start = time.perf_counter()
    sgemm_naive(dA, dB, dC, grid=(M // 16, N // 16), block=(16, 16))   # compiled on the first call
    C = dC.get()
    elapsed = time.perf_counter() - start
    errors.append(_relative_error(C, expected))
    print(f"@mg.kernel sgemm_naive ran on the {mg.backend()} backend ({where}) in {elapsed * 1e3:.0f} ms, "
          f"compile included: relative error against NumPy (float64) {errors[-1]:.2e}")
    return 0 if max(errors) < 1e-5 else 1


def _relative_error(got, expected):
    return np.linalg.norm(got - expected) / np.linalg.norm(expected)


if __name__ == "__main__":
    sys.exit(main(*map(int, sys.argv[1:4])))
