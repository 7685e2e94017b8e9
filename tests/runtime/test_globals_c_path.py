"""Kernels that read globals launch from C: each dispatcher entry carries
guards (the globals, closure cells and code objects the check in Python
reads, a list's items or a small array's bytes), a hit launches only while
they hold, and a change misses into the check in Python, which recompiles or
raises as it always did. Here the guards a kernel gets, a Dispatcher that
launches a Python callable under them, and a kernel launched on the fake
CUDA driver (which copies its parameters out)."""
import json

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import _mlirgpu
from support.checks import run_isolated, toolkit_without_ptxas

UNBOUND = _mlirgpu.Dispatcher.UNBOUND
SCALE = 2.0
TABLE = np.array([1.0, 2.0], np.float32)
OFFSETS = [0.0]
SETTINGS = {"scale": 2.0}


@mg.func
def times_scale(v):
    return v * SCALE


@mg.kernel
def reads_globals(x: mg.memref[4, mg.f32]):
    i = mg.thread_idx.x
    for _ in range(1):
        x[i] = times_scale(TABLE[0] + OFFSETS[0]) + np.float32(0.0)


@pytest.fixture
def restore_globals():
    global SCALE, TABLE, OFFSETS
    saved = SCALE, TABLE, TABLE.copy(), OFFSETS, list(OFFSETS)
    yield
    SCALE, TABLE, OFFSETS = saved[0], saved[1], saved[3]
    TABLE[:], OFFSETS[:] = saved[2], saved[4]


def guards_of(kernel):
    traced = kernel.traced_globals
    traced.check(kernel.forget_traces)
    return traced.guards()


def test_guards_name_every_read_with_its_witness():
    guards = guards_of(reads_globals)
    names = globals()
    by_key = {key: (namespace, value, witness) for namespace, key, value, witness in guards if key is not None}
    assert by_key["SCALE"] == (names, SCALE, None)
    assert by_key["np"] == (names, np, None) and by_key["mg"] == (names, mg, None)
    assert by_key["range"] == (names, UNBOUND, None)   # a builtin: it reads apart once a global shadows it
    namespace, value, witness = by_key["TABLE"]
    assert value is TABLE and witness is not TABLE and witness.dtype is TABLE.dtype
    np.testing.assert_array_equal(witness, TABLE)
    assert by_key["OFFSETS"][1] is OFFSETS and by_key["OFFSETS"][2] == tuple(OFFSETS)
    codes = [(namespace, value) for namespace, key, value, _ in guards if key is None]
    assert (reads_globals.function, reads_globals.function.__code__) in codes
    assert (times_scale.function, times_scale.function.__code__) in codes


def test_a_closure_cell_is_guarded_in_its_cell():
    factor = 2.0

    @mg.kernel
    def closes_over(x: mg.memref[4, mg.f32]):
        x[mg.thread_idx.x] = factor

    cells = [(namespace, value) for namespace, key, value, _ in guards_of(closes_over)
             if isinstance(namespace, type(closes_over.function.__closure__[0]))]
    assert cells == [(closes_over.function.__closure__[0], factor)]


BIG = np.zeros(2048, np.float32)
STRIDED = np.zeros(8, np.float32)[::2]
NESTED = [[1.0]]


@mg.kernel
def reads_settings(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = SETTINGS["scale"]


@mg.kernel
def reads_big(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = BIG[0]


@mg.kernel
def reads_strided(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = STRIDED[0]


@mg.kernel
def reads_nested(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = NESTED[0][0]


@pytest.mark.parametrize("kernel", [reads_settings, reads_big, reads_strided, reads_nested])
def test_values_without_a_cheap_witness_keep_the_check_in_python(kernel):
    # A dict, an array of more than 4 KiB or not C-contiguous, a list of lists.
    assert guards_of(kernel) is None


def test_a_hit_under_the_guards_means_the_check_in_python_finds_no_change(restore_globals):
    """Whatever changes, a Dispatcher registered with a kernel's guards hits
    only where TracedGlobals.changed() is empty, and misses where it is not."""
    global SCALE, TABLE, OFFSETS
    traced = reads_globals.traced_globals
    dispatcher = _mlirgpu.Dispatcher(lambda args, kwargs: "missed", "reads_globals")

    def register():
        traced.check(reads_globals.forget_traces)
        dispatcher.register((1,), lambda *args, **kwargs: "hit", guards_of(reads_globals))

    def shadow_range():
        globals()["range"] = range

    def unshadow_range():
        del globals()["range"]

    changes = [lambda: globals().update(SCALE=float("3.0")), lambda: TABLE.__setitem__(0, 5.0),
               lambda: OFFSETS.__setitem__(0, 1.0), lambda: OFFSETS.append(2.0),
               lambda: globals().update(TABLE=TABLE.copy()), lambda: globals().update(OFFSETS=list(OFFSETS)),
               lambda: globals().pop("SCALE"), shadow_range, unshadow_range,
               lambda: globals().update(SCALE=2.0)]
    register()
    assert dispatcher(1, grid=1, block=1) == "hit"
    for change in changes:
        change()
        changed = traced.changed()
        assert dispatcher(1, grid=1, block=1) == ("missed" if changed else "hit"), changed
        if "SCALE" in globals():
            register()   # what a miss does once it has recompiled
            assert dispatcher(1, grid=1, block=1) == "hit"


@mg.kernel
def adds_globals(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = SCALE + TABLE[0] + OFFSETS[0]


def test_device_array_launches_compute_with_each_new_value(backend, restore_globals):
    """On a GPU from C (one dispatcher entry at the end), on the CPU backend through Python."""
    global SCALE
    x = mg.to_device(np.zeros(4, np.float32))

    def launch():
        adds_globals(x, grid=1, block=4)
        return x.get().tolist()

    assert launch() == launch() == [3.0] * 4
    SCALE = 5.0
    assert launch() == launch() == [6.0] * 4
    TABLE[0] = 10.0
    assert launch() == launch() == [15.0] * 4
    OFFSETS[0] = 100.0
    assert launch() == launch() == [115.0] * 4
    assert len(adds_globals) == (1 if backend == "cuda" else 0)


# ---------------------------------------------------------------------------
# a kernel on the fake CUDA driver

FAKE_DRIVER_KERNEL = '''
import os, json
os.environ["MLIRGPU_LIBCUDA"] = {libcuda!r}
os.environ["MLIRGPU_CACHE_DIR"] = {cache!r}
os.environ["CUDA_HOME"] = {toolkit!r}   # no ptxas: kernels load as PTX, which the fake driver reads
import numpy as np
import mlirgpu as mg

SHIFT = 3
TABLE = np.array([1, 2], np.uint32)
OFFSETS = [0]

@mg.func
def shifted(v):
    return v + SHIFT

# The fake driver runs a kernel named record_params by copying its n parameters after the first two out.
@mg.kernel{decorator}
def record_params(out: mg.memref[8, mg.u64], n: mg.u32):
    out[0] = mg.cast(shifted(n) + TABLE[0] + OFFSETS[0], mg.u64)

misses = []
record_params._miss = lambda args, kwargs, original=record_params._miss: (misses.append(1), original(args, kwargs))
buf = mg.zeros(8, mg.u64)

def launches(count=3):
    """The misses among `count` launches."""
    before = len(misses)
    for _ in range(count):
        record_params(buf, 0, grid=1, block=1)
    return len(misses) - before

out = {{}}
'''


@pytest.fixture
def fake_kernel(fake_libcuda, tmp_path):
    def run(body, decorator=""):
        code = FAKE_DRIVER_KERNEL.format(libcuda=fake_libcuda, cache=str(tmp_path / "cache"),
                                         toolkit=toolkit_without_ptxas(str(tmp_path)), decorator=decorator)
        proc = run_isolated(code + body + "\nprint(json.dumps(out))\n")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return run


def test_a_kernel_reading_globals_hits_its_c_dispatcher_until_one_changes(fake_kernel):
    out = fake_kernel('''
out["first"] = [launches(5), len(record_params)]
def value_in_ir(value):
    return f"arith.constant {value} : i32" in record_params[()].ir()
SHIFT = 4
out["rebound"] = [launches(), len(record_params), value_in_ir(4)]
TABLE[0] = 7
out["array"] = [launches(), record_params.traced_globals.prints["TABLE"] != None, value_in_ir(7)]
OFFSETS[0] = 9
out["list"] = [launches(), value_in_ir(9)]
OFFSETS[0] = 9   # the same int object again: no change
out["unchanged"] = launches()
import types
mg_module = mg
globals()["mg"] = types.ModuleType("mlirgpu")   # a module rebound: the check in Python lets it be
out["module"] = launches()
globals()["mg"] = mg_module
host = np.zeros(8, np.uint64)
for _ in range(2):
    record_params(host, 0, grid=1, block=1)
out["numpy_args"] = len(misses)
''')
    assert out["first"] == [1, 1]                 # one miss compiles and registers; the rest launch from C
    assert out["rebound"] == [1, 1, True]         # a global of an @mg.func helper: traced again, then C
    assert out["array"] == [1, True, True]
    assert out["list"] == [1, True]
    assert out["unchanged"] == 0
    assert out["module"] == 1                     # a miss that finds no change registers the new guards
    assert out["numpy_args"] == 1 + 1 + 1 + 1 + 0 + 1 + 2   # NumPy arguments always take the Python path


def test_on_global_change_error_raises_from_a_launch_that_left_c(fake_kernel):
    out = fake_kernel('''
out["first"] = launches()
def error_of():
    try:
        record_params(buf, 0, grid=1, block=1)
    except mg.CompileError as error:
        return str(error)
SHIFT = 4
out["rebound"] = error_of()
SHIFT = 3
out["restored"] = launches()
del SHIFT
out["deleted"] = error_of()
class Unequal:
    compared = 0
    def __eq__(self, other):
        Unequal.compared += 1
        raise RuntimeError("compared")
    __hash__ = object.__hash__
SHIFT = Unequal()
out["unequal"] = [error_of(), Unequal.compared]
SHIFT = 3
out["misses"] = [launches(), len(misses)]
''', decorator='(on_global_change="error")')
    assert out["first"] == 1
    assert "record_params" in out["rebound"] and "global 'shifted.SHIFT'" in out["rebound"]
    assert out["restored"] == 0                   # the value it was compiled with: C hits again
    assert "global 'shifted.SHIFT'" in out["deleted"]
    assert "global 'shifted.SHIFT'" in out["unequal"][0] and out["unequal"][1] == 0
    assert out["misses"] == [0, 4]


def test_a_closure_cell_and_a_specialization_launch_from_c(fake_kernel):
    out = fake_kernel('''
def make():
    shift = 3
    @mg.kernel
    def record_params(out: mg.memref[8, mg.u64], n: mg.u32):
        out[0] = mg.cast(n + shift, mg.u64)
    def rebind(value):
        nonlocal shift
        shift = value
    return record_params, rebind
kernel, rebind = make()
spec = kernel[()]
spec_misses = []
spec._miss = lambda args, kwargs, original=spec._miss: (spec_misses.append(1), original(args, kwargs))
for _ in range(4):
    spec(buf, 0, grid=1, block=1)
out["spec"] = [len(spec_misses), len(spec)]
rebind(5)
for _ in range(4):
    spec(buf, 0, grid=1, block=1)
out["rebound"] = [len(spec_misses), len(spec), "arith.constant 5 : i32" in spec.ir()]
''')
    assert out["spec"] == [1, 1]
    assert out["rebound"] == [2, 1, True]
