"""Every way of launching a kernel takes the C dispatcher after its first
call: `kernel[...]` specializations too. On the CPU backend the checks are
the same; on the fake CUDA driver (a kernel that copies its parameters out)
a specialization's second call, with another size of a dynamic extent, is a
hit of its own dispatcher that passes the new pointer and extent."""
import json

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import run_isolated, toolkit_without_ptxas
from mlirgpu import thread_idx

N, T = mg.generics("N T")


@mg.kernel(generics=(N, T))
def shifted(X: mg.memref[None, mg.f32], Y: mg.memref[N, mg.f32]):
    i = thread_idx.x
    if i < X.shape[0]:
        X[i] = Y[i % N] + mg.cast(T, mg.f32)


def test_specialization_calls_check_and_launch(backend):
    spec = shifted[8, 3]
    Y = np.arange(8, dtype=np.float32)
    for n in (5, 12):
        X = np.zeros(n, np.float32)
        spec(X, Y, grid=1, block=16)
        np.testing.assert_array_equal(X, Y[np.arange(n) % 8] + 3)
    with pytest.raises(mg.LaunchError, match=r"N=9 \(specialized for 8\)"):
        spec(X, np.zeros(9, np.float32), grid=1, block=16)
    with pytest.raises(TypeError, match="unknown launch keyword 'blocks'"):
        spec(X, Y, grid=1, blocks=16)


def test_specialization_is_a_dispatcher_that_ignores_dynamic_extents():
    spec = shifted[8, 3]
    assert isinstance(spec, mg._mlirgpu.Dispatcher)
    assert spec.signature((np.zeros(5, np.float32), np.zeros(8, np.float32)))[0][2] == (None,)


def test_specialization_hits_its_dispatcher(fake_libcuda):
    code = f'''
import os, json
os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
import numpy as np
import mlirgpu as mg
from mlirgpu import thread_idx
N = mg.generics("N")

@mg.kernel(generics=(N,))
def record_params(out: mg.memref[8, mg.u64], n: mg.u32, X: mg.memref[None, mg.f32], Y: mg.memref[N, mg.f32]):
    out[0] = mg.cast(n, mg.u64)

spec = record_params[4]
# The fake driver runs the kernel named record_params: it copies the n parameters after the first two out.
module = mg._mlirgpu.load_module(".visible .entry record_params(\\\\n")
spec._functions[mg.cuda.current_device(), False] = module.get_function("record_params", params=spec.function_params())
misses = []
original = spec._miss
spec_miss = lambda args, kwargs: (misses.append(1), original(args, kwargs))
spec._miss = spec_miss
buf, Y = mg.zeros(8, mg.u64), mg.zeros(4, mg.f32)
seen = []
for n in (5, 300):
    X = mg.zeros(n, mg.f32)
    spec(buf, 3, X, Y, grid=1, block=1)
    seen.append([int(v) for v in buf.get()[:3]] == [X.ptr, n, Y.ptr])
print(json.dumps([seen, len(misses), len(spec)]))
'''
    proc = run_isolated(code)
    assert proc.returncode == 0, proc.stderr
    seen, misses, entries = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == [True, True] and misses == 1 and entries == 1


def test_launches_from_c_keep_their_specialization_resident(fake_libcuda, tmp_path):
    """With room for two specializations, one launched from C since another
    was specialized outlives it: eviction goes by the last use, C hits included."""
    code = f"""
import os, json
os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
os.environ["MLIRGPU_CACHE_DIR"] = {str(tmp_path / "cache")!r}
os.environ["CUDA_HOME"] = {toolkit_without_ptxas(str(tmp_path))!r}
import mlirgpu as mg
from mlirgpu.runtime import kernel
N = mg.generics("N")

# The fake driver runs the kernel named record_params: it copies the n (here 0) parameters after the first two out.
@mg.kernel(generics=(N,))
def record_params(out: mg.memref[8, mg.u64], n: mg.u32, X: mg.memref[N, mg.f32]):
    out[0] = mg.cast(n, mg.u64)

kernel.SPECIALIZATION_CACHE_SIZE = 2
misses = []
record_params._miss = lambda args, kwargs, original=record_params._miss: (misses.append(1), original(args, kwargs))
buf = mg.zeros(8, mg.u64)
X = {{n: mg.zeros(n, mg.f32) for n in (4, 8, 16)}}
for n in (4, 8, 4, 4, 4, 16):
    record_params(buf, 0, X[n], grid=1, block=1)
print(json.dumps([len(misses), sorted(key[0] for key in record_params._specializations)]))
"""
    proc = run_isolated(code)
    assert proc.returncode == 0, proc.stderr
    misses, resident = json.loads(proc.stdout.strip().splitlines()[-1])
    assert misses == 3 and resident == [4, 16]


def test_tensor_maps_and_scalars_take_the_dispatchers_fast_path(fake_libcuda):
    """A kernel taking tensor maps, arrays and scalars misses once, then hits
    its C dispatcher with the maps' bytes and the scalars packed; so does its
    specialization called directly."""
    code = f'''
import os, json
os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
import struct
import mlirgpu as mg
N = mg.generics("N")

@mg.kernel(generics=(N,))
def record_params(out: mg.memref[8, mg.u64], n: mg.u32, a_map: mg.TensorMap, X: mg.memref[N, mg.f32],
                  scale: mg.f32, b_map: mg.TensorMap):
    out[0] = mg.cast(n, mg.u64)

spec = record_params[64]
# The fake driver runs the kernel named record_params: it copies the n parameters after the first two out
# (a tensor map's first 8 bytes hold its address).
module = mg._mlirgpu.load_module(".visible .entry record_params(\\\\n")
spec._functions[mg.cuda.current_device(), False] = module.get_function("record_params", params=spec.function_params())
misses = []
for dispatcher in (record_params, spec):
    dispatcher._miss = lambda args, kwargs, original=dispatcher._miss: (misses.append(1), original(args, kwargs))
A, B = mg.zeros((64, 64), mg.f16), mg.zeros((128, 64), mg.f16)
a_map, b_map = mg.tensor_map(A, box=(64, 64)), mg.tensor_map(B, box=(64, 64))
buf, X = mg.zeros(8, mg.u64), mg.zeros(64, mg.f32)
seen = []
for call in (record_params, record_params, spec, spec):
    for scale in (2.5, 0.5):
        call(buf, 4, a_map, X, scale, b_map, grid=1, block=1)
        bits = struct.unpack("<I", struct.pack("<f", scale))[0]
        seen.append([int(v) for v in buf.get()[:4]] == [A.ptr, X.ptr, bits, B.ptr])
print(json.dumps([seen, len(misses), len(record_params), len(spec)]))
'''
    proc = run_isolated(code)
    assert proc.returncode == 0, proc.stderr
    seen, misses, kernel_entries, spec_entries = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == [True] * 8 and misses == 2 and kernel_entries == spec_entries == 1
