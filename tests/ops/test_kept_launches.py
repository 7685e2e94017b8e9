"""The ops' kept launches without a GPU: after a first call with arrays of
a signature (dtypes, shapes, devices), later calls of mlirgpu.ops.matmul,
grouped_matmul, scaled_matmul, scaled_grouped_matmul and decoding
attention launch from C (mlirgpu.LaunchPlans run by a Dispatcher), the
tensor maps encoded anew only where an array moved. Checked against the
fake driver of tests/support/fake_cuda (it reports an sm_90 GPU, so every
choice of gemm.choose is reachable), in a fresh interpreter per test. On a
GPU: the ops' own test files and benchmarks/matmul_host.py."""
import textwrap

import pytest

from support.checks import run_on_fake

PRELUDE = '''
import mlirgpu.ops
from mlirgpu.ops import gemm

def log(*prefixes):
    """The driver calls since the last log() whose names start with one of `prefixes`."""
    lines = _fake.fake_log().decode().splitlines()
    _fake.fake_log_clear()
    return [line for line in lines if line.startswith(prefixes)]

misses = []
slow_path = gemm._launch
gemm._launch = lambda *args: misses.append(1) or slow_path(*args)

def arrays(m, k, n, dtype=mg.f16):
    return mg.zeros((m, k), dtype), mg.zeros((k, n), dtype), mg.zeros((m, n), dtype)
'''


@pytest.fixture
def fake(fake_libcuda, tmp_path):
    """fake(body): runs `body` after PRELUDE on the fake driver (run_on_fake); returns its `out`."""
    return lambda body: run_on_fake(fake_libcuda, tmp_path, PRELUDE + textwrap.dedent(body))


def test_hopper_gemm_launches_from_c_and_encodes_maps_only_for_moved_arrays(fake):
    out = fake('''
    a, b, c = arrays(256, 4096, 4096)
    out["kernel"] = gemm.choose(256, 4096, 4096, "sm_90a", 132).kernel
    mlirgpu.ops.matmul(a, b, out=c)
    out["first"] = [len(misses), len(gemm._KEPT)]
    encoded = log("cuTensorMapEncodeTiled")
    out["first_maps"] = [line for line in encoded if "address=%d " % a.ptr in line]
    out["returns"] = [mlirgpu.ops.matmul(a, b, out=c) is c for _ in range(3)]
    out["again"] = [len(misses), log("cuTensorMapEncodeTiled", "cuLaunchKernel")]
    a2, _, c2 = arrays(256, 4096, 4096)
    mlirgpu.ops.matmul(a2, b, out=c2)
    calls = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["moved"] = [len(misses), [line.replace("address=%d " % a2.ptr, "address=A ") for line in calls]]
    out["first_maps"] = [line.replace("address=%d " % a.ptr, "address=A ") for line in out["first_maps"]]
    mlirgpu.ops.matmul(a2, b, out=c2)
    out["back"] = [len(misses), log("cuTensorMapEncodeTiled")]
    ''')
    assert out["kernel"] == "wgmma"
    assert out["first"] == [1, 1]
    assert out["returns"] == [True] * 3
    # Calls like the first: no miss, a launch each, no map encoded.
    assert out["again"][0] == 1
    assert [line.split(" stream=")[0] for line in out["again"][1]] == ["cuLaunchKernel function=hopper_gemm"] * 3
    # A moved: its map encoded at its new address, as the first call encoded it at the old one; B's and C's
    # not, nor A's in C's place (the register epilogue reads no map of C).
    misses, calls = out["moved"]
    assert misses == 1
    assert [line for line in calls if line.startswith("cuTensorMapEncodeTiled")] == out["first_maps"]
    assert len(out["first_maps"]) == 1
    assert len([line for line in calls if line.startswith("cuLaunchKernel")]) == 1
    assert out["back"] == [1, []]


def test_mma_sync_gemm_launches_from_c_until_the_backend_changes(fake):
    out = fake('''
    a, b, c = arrays(64, 64, 64)
    out["kernel"] = gemm.choose(64, 64, 64, "sm_90a", 132).kernel
    mlirgpu.ops.matmul(a, b, out=c)
    log()
    out["returns"] = mlirgpu.ops.matmul(a, b, out=c) is c
    out["hit"] = [len(misses), [line.split(" stream=")[0] for line in log("cuLaunchKernel")]]
    # Another shape, dtype or a read-only output: a signature of its own, through the slow path.
    a16, b16, c16 = arrays(64, 64, 64, mg.bf16)
    mlirgpu.ops.matmul(a16, b16, out=c16)
    a72, b72, c72 = arrays(64, 64, 72)
    mlirgpu.ops.matmul(a72, b72, out=c72)
    out["others"] = [len(misses), len(gemm._KEPT)]
    mg.set_backend("cpu")
    mg.set_backend("cuda")
    mlirgpu.ops.matmul(a, b, out=c)
    out["new_backend"] = len(misses)
    mlirgpu.ops.matmul(a, b, out=c)
    out["after"] = len(misses)
    ''')
    assert out["kernel"] == "mma.sync"
    assert out["returns"] and out["hit"] == [1, ["cuLaunchKernel function=ampere_gemm"]]
    assert out["others"] == [3, 3]
    # A backend made anew fails the kept launches' guard: one miss, which keeps them again.
    assert out["new_backend"] == 4 and out["after"] == 4


def test_launch_plan_reads_its_stream_per_call_and_misses_off_its_stream_or_in_a_capture(fake):
    out = fake('''
    N = mg.generics("N")

    @mg.kernel
    def add_scalar(X: mg.memref[N, mg.f32], v: mg.f32, n: mg.u32):
        X[mg.thread_idx.x] = X[mg.thread_idx.x] + v

    x = mg.zeros(8)
    s, other = mg.Stream(), mg.Stream()
    add_scalar(x, 1.0, 8, grid=1, block=8)
    function = add_scalar[8].function_for([x])
    seen = []
    table = C.Dispatcher(lambda args, kwargs: seen.append(len(args)), "t")
    current = [s.handle]
    # abs is a builtin: abs(-h) is h, the stream a call reads.
    plan = C.LaunchPlan(function, (("arg", 0), ("value", 2.0), ("value", 8)), grid=1, block=8,
                        stream=(abs, -s.handle), stream_only=s.handle, capture=False, result=0)
    table.register((x,), plan)
    log()
    out["hit"] = [table(x) is x, seen[:], [line.replace(str(s.handle), "s") for line in log("cuLaunchKernel")]]
    off = C.LaunchPlan(function, (("arg", 0), ("value", 2.0), ("value", 8)), grid=1, block=8,
                       stream=(abs, -s.handle), stream_only=other.handle)
    table.register((x,), off)
    out["off"] = [table(x), seen[:], log("cuLaunchKernel")]
    table.register((x,), plan)
    with mg.graph(stream=s) as g:
        out["capture"] = [table(x), seen[:]]
    rest = (("value", 2.0), ("value", 8))
    for bad in [(("map", 0, 3),) + rest, (("arg", 99),) + rest, (("nothing", 0),) + rest, (("arg", 0),)]:
        try:
            C.LaunchPlan(function, bad, grid=1, block=8)
        except (TypeError, ValueError) as error:
            out.setdefault("errors", []).append(type(error).__name__ + ": " + str(error))
    try:
        C.LaunchPlan(function, (("arg", 0), ("value", 2.0), ("value", 8)), grid=1, block=8, stream=(lambda h: h, 1))
    except TypeError as error:
        out["python_getter"] = str(error)

    class PythonLock:
        def acquire(self, blocking=True):
            return True

        def release(self):
            pass

    for lock in (PythonLock(), object()):
        try:
            C.LaunchPlan(function, (("arg", 0), ("value", 2.0), ("value", 8)), grid=1, block=8, lock=lock)
        except TypeError as error:
            out.setdefault("python_locks", []).append(str(error))
    # A chain under a lock, the second plan passing argument 1 as an array of 8 (a view of its 2 x 4).
    import threading
    lock = threading.Lock()
    second = C.LaunchPlan(function, (("view", 1, (8,)), ("value", 1.0), ("value", 8)), grid=2, block=8)
    chain = C.LaunchPlan(function, (("arg", 0), ("value", 2.0), ("value", 8)), grid=1, block=8, then=second,
                         lock=lock)
    y = mg.zeros((2, 4))
    table.register((x, y), chain)
    log()
    out["chain"] = [table(x, y), log("cuLaunchKernel"), lock.locked()]
    with lock:
        out["locked"] = [table(x, y), seen[-1], log("cuLaunchKernel")]
    ''')
    assert out["hit"] == [True, [], ["cuLaunchKernel function=add_scalar stream=s"]]
    assert out["off"] == [None, [1], []]
    assert out["capture"] == [None, [1, 1]]
    assert out["errors"] == [
        "TypeError: params[0]: a map entry's template is a TensorMap made for the GPU, not int",
        "ValueError: params[0] names argument 99, not one of 0 to 63",
        "TypeError: params[0] is (\"arg\", i), (\"map\", i, template), (\"view\", i, shape) or (\"value\", v), "
        "not ('nothing', 0)",
        "ValueError: params has 1 entries, the function takes 3 parameters"]
    assert "builtin function" in out["python_getter"]
    assert out["python_locks"] == [f"lock is a lock whose acquire() is builtin (a threading.Lock), not {name}"
                                   for name in ("PythonLock", "object")]
    assert out["chain"] == [None, ["cuLaunchKernel function=add_scalar stream=0"] * 2, False]
    assert out["locked"] == [None, 2, []]    # the lock held elsewhere: a miss, no launch


def test_decoding_attention_launches_both_kernels_from_c(fake):
    out = fake('''
    import sys
    attention = sys.modules["mlirgpu.ops.attention"]
    calls = []
    slow = attention.forward
    attention.forward = lambda *args, **kwargs: calls.append(1) or slow(*args, **kwargs)
    q = mg.zeros((8, 1, 32, 128), mg.bf16)
    k, v = (mg.zeros((8, 8192, 4, 128), mg.bf16) for _ in range(2))
    o = mg.empty((8, 1, 32, 128), mg.bf16)
    mlirgpu.ops.attention(q, k, v, out=o)
    log()
    out["again"] = [mlirgpu.ops.attention(q, k, v, out=o) is o, len(calls),
                    [line.split(" stream=")[0] for line in log("cuTensorMapEncodeTiled", "cuLaunchKernel")]]
    k2 = mg.zeros((8, 8192, 4, 128), mg.bf16)
    mlirgpu.ops.attention(q, k2, v, out=o)
    out["moved"] = [len(calls), [line.split(" address=")[0] for line in log("cuTensorMapEncodeTiled")]]
    mlirgpu.ops.attention(q, k2, v, out=o, scale=0.5)            # an option: the Python path
    mlirgpu.ops.attention(q, k2, v, out=o, causal=True)          # a table of its own
    mlirgpu.ops.attention(q, k2, v, out=o, causal=True)
    out["options"] = len(calls)
    # 64 sequences: the keys are not split, one kernel writes the output.
    q, k, v, o = (mg.zeros(shape, mg.bf16) for shape in [(64, 1, 32, 128)] + [(64, 8192, 4, 128)] * 2
                  + [(64, 1, 32, 128)])
    mlirgpu.ops.attention(q, k, v, out=o)
    log()
    out["one_split"] = [mlirgpu.ops.attention(q, k, v, out=o) is o, len(calls),
                        [line.split(" stream=")[0] for line in log("cuTensorMapEncodeTiled", "cuLaunchKernel")]]
    ''')
    assert out["again"] == [True, 1, ["cuLaunchKernel function=attention_decode_sm90",
                                      "cuLaunchKernel function=attention_combine"]]
    assert out["moved"] == [1, ["cuTensorMapEncodeTiled type=9 rank=4"]]
    assert out["options"] == 3
    assert out["one_split"] == [True, 4, ["cuLaunchKernel function=attention_decode_sm90"]]


GROUPED = '''
from mlirgpu.ops import grouped_gemm, scaled_gemm, scaled_grouped_gemm

def count_misses(module):
    """Counts the calls of module._launch, an op's Python path (its Dispatcher's misses)."""
    slow = module._launch
    module._launch = lambda *args, **kwargs: misses.append(module.__name__) or slow(*args, **kwargs)

def encodes(lines, **arrays):
    """The cuTensorMapEncodeTiled calls among `lines` at the addresses of `arrays`, named by their keys."""
    named = {"address=%d " % array.ptr: "address=%s " % name for name, array in arrays.items()}
    found = []
    for line in lines:
        for address, name in named.items():
            if line.startswith("cuTensorMapEncodeTiled") and address in line:
                found.append(line.replace(address, name))
    return found

def launches(lines):
    return [line.split(" stream=")[0] for line in lines if line.startswith("cuLaunchKernel")]

class ColumnMajor:
    """b (G, K, N) whose matrices are column-major, as torch's w.transpose(-2, -1) is, read through
    DLPack: its swapaxes(-2, -1) is w (G, N, K). Read on its own, it is w's memory in b's shape (the
    fake driver computes nothing: only the address and the signature count)."""
    def __init__(self, w):
        self.w, self.view = w, w.reshape(w.shape[0], w.shape[2], w.shape[1])
        self.shape, self.dtype, self.ptr = self.view.shape, w.dtype, w.ptr
    def swapaxes(self, i, j):
        return self.w
    def __dlpack__(self, **kwargs):
        return self.view.__dlpack__(**kwargs)
    def __dlpack_device__(self):
        return self.view.__dlpack_device__()

offsets = mg.to_device(np.array([64, 64, 200, 256], np.int32))
'''


def test_grouped_matmul_launches_from_c_and_encodes_maps_only_for_moved_arrays(fake):
    out = fake(GROUPED + textwrap.dedent('''
    count_misses(grouped_gemm)
    a, b, c = mg.zeros((256, 64), mg.f16), mg.zeros((4, 64, 128), mg.f16), mg.zeros((256, 128), mg.f16)
    mlirgpu.ops.grouped_matmul(a, b, offsets, out=c)
    first = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["first"] = [len(misses), len(grouped_gemm._KEPT), launches(first)]
    out["first_maps"] = encodes(first, A=a, B=b)
    out["returns"] = [mlirgpu.ops.grouped_matmul(a, b, offsets, out=c) is c for _ in range(3)]
    out["again"] = [len(misses), log("cuTensorMapEncodeTiled", "cuLaunchKernel")]
    a2, b2 = mg.zeros((256, 64), mg.f16), mg.zeros((4, 64, 128), mg.f16)
    mlirgpu.ops.grouped_matmul(a2, b, offsets, out=c)
    moved_a = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    mlirgpu.ops.grouped_matmul(a2, b2, mg.to_device(np.array([0, 0, 0, 256], np.int32)), out=c)
    moved_b = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["moved"] = [len(misses), encodes(moved_a, A=a2), launches(moved_a), encodes(moved_b, B=b2),
                    len([line for line in moved_b if line.startswith("cuTensorMapEncodeTiled")]), launches(moved_b)]
    # Host offsets are checked and copied on every call; another number of rows is another signature,
    # kept after its first call.
    host = np.array([64, 64, 200, 256], np.int32)
    before = len(misses)
    for _ in range(2):
        mlirgpu.ops.grouped_matmul(a, b, host, out=c)
    a128, c128 = mg.zeros((128, 64), mg.f16), mg.zeros((128, 128), mg.f16)
    for _ in range(2):
        mlirgpu.ops.grouped_matmul(a128, b, mg.to_device(np.array([0, 64, 64, 128], np.int32)), out=c128)
    out["others"] = [len(misses) - before, launches(log("cuLaunchKernel"))]
    # Nothing to multiply: no kernel, zeros where K is empty, on every call.
    a0, b0, c0 = mg.zeros((256, 0), mg.f16), mg.zeros((4, 0, 128), mg.f16), mg.to_device(np.ones((256, 128), np.float16))
    before = len(misses)
    out["empty"] = [mlirgpu.ops.grouped_matmul(a0, b0, offsets, out=c0) is c0 for _ in range(2)]
    out["empty"] += [len(misses) - before, float(np.abs(c0.get()).max()), launches(log("cuLaunchKernel"))]
    '''))
    assert out["first"] == [1, 1, ["cuLaunchKernel function=hopper_gemm"]]
    # The Python path makes A's map and B's.
    assert [line.split(" address=")[1].split(" ")[0] for line in out["first_maps"]] == ["A", "B"]
    assert out["returns"] == [True] * 3
    # Calls like the first: no miss, a launch each, no map encoded.
    assert out["again"][0] == 1
    assert [line.split(" stream=")[0] for line in out["again"][1]] == ["cuLaunchKernel function=hopper_gemm"] * 3
    # A moved: its map encoded at its new address as the Python path encoded it, nothing else; then B.
    misses, maps_a, launched_a, maps_b, encoded_b, launched_b = out["moved"]
    assert misses == 1
    assert maps_a == out["first_maps"][:1] and launched_a == ["cuLaunchKernel function=hopper_gemm"]
    assert maps_b == out["first_maps"][1:] and encoded_b == 1 and launched_b == ["cuLaunchKernel function=hopper_gemm"]
    assert out["others"] == [2 + 1, ["cuLaunchKernel function=hopper_gemm"] * 4]
    assert out["empty"] == [True, True, 2, 0.0, []]


def test_grouped_matmul_off_sm_90a_stays_on_its_python_path(fake):
    # The mma.sync kernel takes b as a (G * K, N) view, which a LaunchPlan cannot pass.
    out = fake(GROUPED + textwrap.dedent('''
    count_misses(grouped_gemm)
    gemm._device = lambda: ("sm_80", 108)
    a, b, c = mg.zeros((256, 64), mg.f16), mg.zeros((4, 64, 128), mg.f16), mg.zeros((256, 128), mg.f16)
    out["returns"] = [mlirgpu.ops.grouped_matmul(a, b, offsets, out=c) is c for _ in range(3)]
    out["calls"] = [len(misses), len(grouped_gemm._KEPT), launches(log("cuLaunchKernel"))]
    '''))
    assert out["returns"] == [True] * 3
    assert out["calls"] == [3, 0, ["cuLaunchKernel function=ampere_gemm"] * 3]


def test_scaled_grouped_matmul_launches_from_c_with_the_calls_scales(fake):
    out = fake(GROUPED + textwrap.dedent('''
    count_misses(grouped_gemm)
    a, c = mg.zeros((256, 64), mg.f8e4m3), mg.zeros((256, 128), mg.bf16)
    b = ColumnMajor(mg.zeros((4, 128, 64), mg.f8e4m3))
    scale_a, scale_b = mg.zeros((256,), mg.f32), mg.zeros((4, 128), mg.f32)
    mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out=c)
    first = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["first"] = [len(misses), len(scaled_grouped_gemm._KEPT), launches(first)]
    out["first_maps"] = encodes(first, A=a, B=b)
    out["returns"] = [mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out=c) is c
                      for _ in range(3)]
    out["again"] = [len(misses), log("cuTensorMapEncodeTiled", "cuLaunchKernel")]
    a2, scale_a2 = mg.zeros((256, 64), mg.f8e4m3), mg.zeros((256,), mg.f32)
    mlirgpu.ops.scaled_grouped_matmul(a2, b, scale_a2, scale_b, offsets, out=c)
    moved = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["moved"] = [len(misses), encodes(moved, A=a2), len([l for l in moved if "EncodeTiled" in l]), launches(moved)]
    # out_dtype says what out is: another is the Python path's LaunchError, as before.
    try:
        mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, mg.f16, out=c)
    except mg.LaunchError as error:
        out["wrong_out"] = [len(misses), str(error)]
    before = len(misses)
    mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, np.array([64, 64, 200, 256], np.int32), out=c)
    mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, np.array([64, 64, 200, 256], np.int32), out=c)
    out["host_offsets"] = len(misses) - before
    '''))
    assert out["first"] == [1, 1, ["cuLaunchKernel function=hopper_gemm"]]
    assert [line.split(" address=")[1].split(" ")[0] for line in out["first_maps"]] == ["A", "B"]
    assert out["returns"] == [True] * 3
    assert out["again"][0] == 1
    assert [line.split(" stream=")[0] for line in out["again"][1]] == ["cuLaunchKernel function=hopper_gemm"] * 3
    # a and scale_a moved: A's map encoded anew, as the Python path encoded it; scale_a passed as it is.
    assert out["moved"] == [1, out["first_maps"][:1], 1, ["cuLaunchKernel function=hopper_gemm"]]
    assert out["wrong_out"][0] == 2 and "out is a C-contiguous f16 array" in out["wrong_out"][1]
    assert out["host_offsets"] == 2


def test_scaled_matmul_launches_from_c_with_scales_that_are_python_numbers(fake):
    out = fake(GROUPED + textwrap.dedent('''
    count_misses(scaled_gemm)
    w = mg.zeros((256, 128), mg.f8e4m3)
    a, b, c = mg.zeros((128, 128), mg.f8e4m3), w.T, mg.zeros((128, 256), mg.bf16)
    mlirgpu.ops.scaled_matmul(a, b, 0.5, 2.0, out=c)
    first = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["first"] = [len(misses), len(scaled_gemm._KEPT), launches(first)]
    out["first_maps"] = encodes(first, A=a, B=b, C=c)
    out["returns"] = [mlirgpu.ops.scaled_matmul(a, b, 0.25 * i, 3.0, out=c) is c for i in range(3)]
    out["again"] = [len(misses), log("cuTensorMapEncodeTiled", "cuLaunchKernel")]
    a2 = mg.zeros((128, 128), mg.f8e4m3)
    mlirgpu.ops.scaled_matmul(a2, b, 1.0, 1.0, out=c)
    moved = log("cuTensorMapEncodeTiled", "cuLaunchKernel")
    out["moved"] = [len(misses), encodes(moved, A=a2), len([l for l in moved if "EncodeTiled" in l]), launches(moved)]
    # Scales given as arrays are read on the host: the Python path, every call.
    before = len(misses)
    for _ in range(2):
        mlirgpu.ops.scaled_matmul(a, b, mg.to_device(np.array([0.5], np.float32)), 2.0, out=c)
    out["array_scales"] = len(misses) - before
    try:
        mlirgpu.ops.scaled_matmul(a, b, 1.0, 1.0, mg.f32, out=c)
    except mg.LaunchError as error:
        out["wrong_out"] = str(error)
    '''))
    assert out["first"] == [1, 1, ["cuLaunchKernel function=hopper_gemm"]]
    assert sorted(line.split(" address=")[1].split(" ")[0] for line in out["first_maps"]) == ["A", "B", "C"]
    assert out["returns"] == [True] * 3
    assert out["again"][0] == 1
    assert [line.split(" stream=")[0] for line in out["again"][1]] == ["cuLaunchKernel function=hopper_gemm"] * 3
    maps_a = [line for line in out["first_maps"] if "address=A " in line]
    assert out["moved"] == [1, maps_a, 1, ["cuLaunchKernel function=hopper_gemm"]]
    assert out["array_scales"] == 2
    assert "out is a C-contiguous f32 array" in out["wrong_out"]
