"""The PEP 695 spelling of a generic kernel, `def k[M, K, N, dtype](...)`.

The kernel's source is a string written to a module file, so that this file
still imports on Python 3.11, where these tests are skipped; on 3.12 and
later it must specialize exactly like the mg.generics form.
"""
import importlib.util
import re
import sys

import pytest

import mlirgpu as mg

SOURCE = '''\
import mlirgpu as mg
from mlirgpu import thread_idx, block_idx, block_dim

M, K, N, dtype = mg.generics("M K N dtype")


@mg.kernel
def sgemm_pep695[M, K, N, dtype](A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype],
                                 C: mg.memref[M, N, dtype]):
    one = mg.constant(1.0, dtype)
    r = block_dim.x * block_idx.x + thread_idx.x
    c = block_dim.y * block_idx.y + thread_idx.y
    acc = mg.constant(0.0, dtype)
    for k in range(K):
        acc += A[r, k] * B[k, c]
    if r < M:
        C[r, c] = acc + one


@mg.kernel(generics=(M, K, N, dtype))
def sgemm_generics(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype]):
    one = mg.constant(1.0, dtype)
    r = block_dim.x * block_idx.x + thread_idx.x
    c = block_dim.y * block_idx.y + thread_idx.y
    acc = mg.constant(0.0, dtype)
    for k in range(K):
        acc += A[r, k] * B[k, c]
    if r < M:
        C[r, c] = acc + one


@mg.kernel
def reordered[dtype, N](X: mg.memref[N, dtype]):
    X[0] = mg.constant(2.0, dtype)
'''

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="PEP 695 type parameters need Python 3.12")


def load(tmp_path):
    """The module made of SOURCE, from a real file (the tracer reads kernels' source)."""
    path = tmp_path / "pep695_kernels.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("pep695_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path)


def without_locations(text, path):
    """IR text with the kernel names and line numbers taken out, to compare two kernels."""
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))
    text = re.sub(r'loc\("[^"]*":\d+:\d+\)', "loc()", text)
    text = re.sub(r"#loc\d*", "#loc", text)
    return text.replace("@sgemm_pep695", "@K").replace("@sgemm_generics", "@K")


def test_pep695_kernel_specializes_like_the_generics_form(tmp_path):
    module, path = load(tmp_path)
    assert module.sgemm_pep695.generics == ["M", "K", "N", "dtype"]
    pep, classic = module.sgemm_pep695[256, 128, 64, mg.f32], module.sgemm_generics[256, 128, 64, mg.f32]
    assert pep.values == classic.values == {"M": 256, "K": 128, "N": 64, "dtype": mg.f32}
    text = pep.ir()
    assert "memref<256x128xf32>" in text and "memref<128x64xf32>" in text and "memref<256x64xf32>" in text
    assert "arith.constant 128 : index" in text and "arith.cmpi slt" in text and "arith.constant 256 : index" in text
    assert f'loc("{path}":' in text
    assert without_locations(text, path) == without_locations(classic.ir(), path)
    assert "f32" not in module.sgemm_pep695[16, 16, 16, mg.f64].ir()


def test_pep695_type_parameter_order_is_the_getitem_order(tmp_path):
    module, _ = load(tmp_path)
    assert module.reordered.generics == ["dtype", "N"]
    text = module.reordered[mg.f64, 8].ir()
    assert "memref<8xf64>" in text and "arith.constant 2.000000e+00 : f64" in text


def test_pep695_kernel_binds_generics_from_arrays(tmp_path):
    import numpy as np
    module, _ = load(tmp_path)
    A, B, C = np.zeros((4, 3), np.float32), np.zeros((3, 5), np.float32), np.zeros((4, 5), np.float32)
    assert module.sgemm_pep695.bind((A, B, C)) == {"M": 4, "K": 3, "N": 5, "dtype": mg.f32}
    with pytest.raises(mg.LaunchError, match=r"from A\.shape\[1\].*from B\.shape\[0\]"):
        module.sgemm_pep695.bind((A, np.zeros((4, 5), np.float32), C))
