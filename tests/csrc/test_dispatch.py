"""mlirgpu.Dispatcher without a GPU: argument signatures, hits and misses,
the table, references and leaks. Targets here are Python callables, which a
Dispatcher calls on a hit like it launches a Function; the Function path runs
against the fake CUDA driver of tests/support/fake_cuda (built by the fake_libcuda
fixture) in a fresh interpreter. Real torch and CuPy: test_dispatch_gpu.py."""
import functools
import gc
import json
import os
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

import mlirgpu._mlirgpu as C
from support.checks import run_isolated



class HostCAI:
    """A __cuda_array_interface__ over host memory: asarray makes a view without touching it."""

    def __init__(self, shape=(4,), typestr="<f4", strides=None, ptr=4096):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


class BadCAI:
    @property
    def __cuda_array_interface__(self):
        return {"shape": (4,), "typestr": "<f4"}   # no data: a ValueError from the slow path


class Recorder:
    """A miss that registers `target` for the call's arguments (unless host
    arrays are among them) and says it missed."""

    def __init__(self, target=None):
        self.calls = []
        self.target = target
        self.dispatcher = None

    def __call__(self, args, kwargs):
        self.calls.append((args, kwargs))
        if self.target is not None and not any(isinstance(a, np.ndarray) for a in args):
            self.dispatcher.register(args, self.target)
        return ("missed", len(args))


def make(target=None, name="k"):
    miss = Recorder(target)
    d = C.Dispatcher(miss, name)
    miss.dispatcher = d
    return d, miss


def hit_target(*args, **kwargs):
    return ("hit", len(args), tuple(sorted(kwargs)))


# ---------------------------------------------------------------------------
# signatures

def test_signature_of_python_scalars():
    d, _ = make()
    assert d.signature((1, 2.5, True, False)) == (("python", int), ("python", float),
                                                  ("python", bool), ("python", bool))


@pytest.mark.parametrize("value, dtype", [
    (np.float32(1), C.f32), (np.float64(1), C.f64), (np.float16(1), C.f16), (np.int8(1), C.i8),
    (np.int16(1), C.i16), (np.int32(1), C.i32), (np.int64(1), C.i64), (np.uint8(1), C.u8),
    (np.uint16(1), C.u16), (np.uint32(1), C.u32), (np.uint64(1), C.u64), (np.bool_(True), C.bool_)])
def test_signature_of_numpy_scalars(value, dtype):
    d, _ = make()
    assert d.signature((value,)) == (("numpy", dtype),)


def test_numpy_float64_is_not_a_python_float():
    d, _ = make()
    assert d.signature((np.float64(1),)) != d.signature((1.0,))


def test_signature_of_int_and_float_subclasses():
    import enum

    class Level(enum.IntEnum):
        LOW = 1

    class MyFloat(float):
        pass

    d, _ = make()
    assert d.signature((Level.LOW, MyFloat(2))) == (("python", int), ("python", float))


def test_signature_of_host_arrays():
    d, _ = make()
    a = np.zeros((3, 4), np.float32)
    assert d.signature((a,)) == (("host", C.f32, (3, 4), None),)
    assert d.signature((a[:, ::2],)) == (("host", C.f32, (3, 2), (16, 8)),)
    assert d.signature((np.zeros(2, np.complex64),)) == (("host", None, (), None),)


def test_signature_of_cai_arrays():
    d, _ = make()
    (kind, dtype, shape, strides, device), = d.signature((HostCAI((2, 3), "<i4"),))
    assert (kind, dtype, shape, strides) == ("array", C.i32, (2, 3), None)
    assert isinstance(device, int) and device >= 0
    assert d.signature((HostCAI((2, 3), "<i4", strides=(4, 8)),))[0][3] == (4, 8)
    # explicit C-contiguous strides are the same signature as none
    assert d.signature((HostCAI((2, 3), "<i4", strides=(12, 4)),)) == d.signature((HostCAI((2, 3), "<i4"),))


def test_signature_of_things_the_fast_path_cannot_read():
    d, _ = make()
    sig = d.signature((object(), "text", BadCAI(), None, np.complex64(1)))
    assert sig == (("other", object), ("other", str), ("other", BadCAI), ("other", type(None)),
                   ("other", np.complex64))


def test_signature_rejects_bad_args():
    d, _ = make()
    with pytest.raises(TypeError):
        d.signature(iter([1]))
    with pytest.raises(ValueError, match="at most 64"):
        d.signature((1,) * 65)
    assert d.signature([1, 2.0]) == d.signature((1, 2.0))


# ---------------------------------------------------------------------------
# hits and misses

def test_miss_then_hits():
    d, miss = make(hit_target)
    args = (HostCAI(), 3, 2.0)
    assert d(*args, grid=1, block=32) == ("missed", 3)
    assert len(miss.calls) == 1 and len(d) == 1
    for _ in range(5):
        assert d(*args, grid=1, block=32) == ("hit", 3, ("block", "grid"))
    assert d(HostCAI(ptr=8192), 7, -1.5, grid=2, block=64, shared_mem=0, stream=None) == \
        ("hit", 3, ("block", "grid", "shared_mem", "stream"))
    assert d(HostCAI(), 3, 2.0, grid=2, block=64, cluster=(2, 1, 1))[0] == "hit"
    assert len(miss.calls) == 1


def test_miss_gets_args_tuple_and_kwargs_dict():
    d, miss = make()
    stream = object()
    a = HostCAI()
    d(a, 1, grid=(1, 2), block=3, stream=stream)
    args, kwargs = miss.calls[0]
    assert type(args) is tuple and args[0] is a and args[1] == 1
    assert kwargs == {"grid": (1, 2), "block": 3, "stream": stream}
    d()
    assert miss.calls[1] == ((), {})


@pytest.mark.parametrize("other", [
    (HostCAI((5,)), 3, 2.0),                # shape
    (HostCAI((4,), "<f8"), 3, 2.0),         # dtype
    (HostCAI((4, 1)), 3, 2.0),              # rank
    (HostCAI((2, 2), strides=(4, 8)), 3, 2.0),
    (HostCAI(), 3.0, 2.0),                  # int -> float
    (HostCAI(), True, 2.0),                 # int -> bool
    (HostCAI(), np.int32(3), 2.0),          # int -> NumPy scalar
    (HostCAI(), np.int64(3), 2.0),
    (HostCAI(), 3),                         # count
    (HostCAI(), 3, 2.0, 1),
    (np.zeros(4, np.float32), 3, 2.0),      # a host array of the same dtype and shape
])
def test_different_signatures_miss_again(other):
    d, miss = make(hit_target)
    d(HostCAI(), 3, 2.0, grid=1, block=1)
    assert d(HostCAI(), 3, 2.0, grid=1, block=1)[0] == "hit"
    assert d.signature(other) != d.signature((HostCAI(), 3, 2.0))
    assert d(*other, grid=1, block=1)[0] == "missed"
    assert len(miss.calls) == 2


def test_host_arrays_always_miss():
    d, miss = make()
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="argument 1 is a host array"):
        d.register((HostCAI(), a), hit_target)
    for _ in range(3):
        assert d(HostCAI(), a, grid=1, block=1) == ("missed", 2)
    assert len(miss.calls) == 3 and len(d) == 0


def test_unreadable_arguments_always_miss():
    d, miss = make()
    with pytest.raises(ValueError, match=r"argument 0 \(object\) has no signature"):
        d.register((object(),), hit_target)
    with pytest.raises(ValueError, match="argument 1"):
        d.register((1, BadCAI()), hit_target)
    d.register((1,), hit_target)
    assert d(BadCAI(), grid=1, block=1) == ("missed", 1)
    assert d(1, grid=1, block=1)[0] == "hit"


def test_unknown_keywords_miss():
    d, miss = make(hit_target)
    d(1, grid=1, block=1)
    assert d(1, grid=1, block=1)[0] == "hit"
    assert d(1, grid=1, block=1, blocks=2) == ("missed", 1)
    assert miss.calls[-1][1] == {"grid": 1, "block": 1, "blocks": 2}


def test_more_than_64_arguments_miss():
    d, miss = make()
    assert d(*([1] * 65), grid=1, block=1) == ("missed", 65)
    with pytest.raises(ValueError, match="at most 64"):
        d.register((1,) * 65, hit_target)
    d.register((1,) * 64, hit_target)
    assert d(*([1] * 64), grid=1, block=1)[0] == "hit"


def test_errors_propagate_from_miss_and_target():
    def miss(args, kwargs):
        raise C.LaunchError("argument 0: nope")

    d = C.Dispatcher(miss, "k")
    with pytest.raises(C.LaunchError, match="nope"):
        d(1, grid=1, block=1)

    def target(*args, **kwargs):
        raise ZeroDivisionError

    d.register((1,), target)
    with pytest.raises(ZeroDivisionError):
        d(1, grid=1, block=1)


def test_constructor_and_register_check_their_arguments():
    with pytest.raises(TypeError):
        C.Dispatcher(42, "k")
    with pytest.raises(TypeError):
        C.Dispatcher(hit_target, 3)
    d, _ = make()
    with pytest.raises(TypeError):
        d.register((1,), "not callable")
    with pytest.raises(TypeError):
        d.register(1, hit_target)
    with pytest.raises(TypeError):
        d.register((1,))


# ---------------------------------------------------------------------------
# the table

def test_register_clear_len_and_replace():
    d, miss = make()
    assert len(d) == 0 and "0 signatures" in repr(d) and "'k'" in repr(d)
    d.register((1,), hit_target)
    d.register((1.0,), hit_target)
    d.register((2,), lambda *a, **k: "replaced")   # same signature as (1,)
    assert len(d) == 2
    assert d(5, grid=1, block=1) == "replaced"
    d.clear()
    assert len(d) == 0
    assert d(5, grid=1, block=1) == ("missed", 1)
    d.register((1,), hit_target)
    assert d(5, grid=1, block=1)[0] == "hit"


def test_hits_tick_last_used_of_the_owner_or_the_dispatcher():
    d, miss = make()
    owner, _ = make(name="owner")
    assert d.last_used == owner.last_used == 0
    d.register((1,), hit_target)
    d.register((1.0,), hit_target, None, owner)
    d(1, grid=1, block=1)
    mine = d.last_used
    assert mine > 0 and owner.last_used == 0
    d(1.0, grid=1, block=1)
    assert owner.last_used > mine and d.last_used == mine
    d("missed", grid=1, block=1)                       # a miss ticks nothing
    assert d.last_used == mine
    owner.touch()
    assert owner.last_used > mine
    d.register((1.0,), hit_target)                     # replaced: the owner goes with the old entry
    d(1.0, grid=1, block=1)
    assert d.last_used > owner.last_used


def test_owners_are_kept_alive_while_registered_and_cycles_through_them_are_collected():
    d, owner = make()[0], make(name="owner")[0]
    owner.dispatcher = d                               # owner -> d -> entry -> owner
    d.register((1,), hit_target, None, owner)
    ref, d_ref = weakref.ref(owner), weakref.ref(d)
    del owner
    gc.collect()
    assert ref() is not None
    del d
    gc.collect()
    assert ref() is None and d_ref() is None


def test_table_grows_past_its_initial_size():
    d, miss = make()
    targets = {}
    for n in range(1, 1001):
        targets[n] = functools.partial(lambda n, *a, **k: n, n)
        d.register((HostCAI((n,)), np.int32(0)), targets[n])
    assert len(d) == 1000
    for n in range(1, 1001):
        assert d(HostCAI((n,)), np.int32(5), grid=1, block=1) == n
    assert d(HostCAI((1001,)), np.int32(5), grid=1, block=1) == ("missed", 2)
    assert len(miss.calls) == 1


def test_many_argument_kinds_in_one_signature():
    d, miss = make(hit_target)
    args = (HostCAI((2, 3, 4, 5, 6, 7, 8, 9)), HostCAI((3,), "|b1"), 1, 2.0, False, np.float16(1)) * 10
    d(*args, grid=1, block=1)
    assert d(*args, grid=1, block=1)[0] == "hit"
    assert len(d.signature(args)) == 60


def test_targets_are_kept_alive_while_registered():
    d, _ = make()

    def target(*args, **kwargs):
        return "hit"

    ref = weakref.ref(target)
    d.register((1,), target)
    del target
    gc.collect()
    assert ref() is not None and d(1, grid=1, block=1) == "hit"
    d.clear()
    gc.collect()
    assert ref() is None


def test_cycles_through_miss_are_collected():
    class Holder:
        pass

    holder = Holder()

    def miss(args, kwargs):
        holder.dispatcher.register(args, target)

    def target(*args, **kwargs):
        return holder

    holder.dispatcher = C.Dispatcher(miss, "cyclic")
    holder.dispatcher(1, grid=1, block=1)
    ref = weakref.ref(holder.dispatcher)
    target_ref = weakref.ref(target)
    del holder, miss, target
    gc.collect()
    assert ref() is None and target_ref() is None


def test_attributes_subclasses_and_wraps():
    def kernel(a):
        """The kernel's doc."""

    d, _ = make(name="kernel")
    functools.update_wrapper(d, kernel)
    assert d.__doc__ == "The kernel's doc." and d.__wrapped__ is kernel and d.name == "kernel"

    class Kernel(C.Dispatcher):
        pass

    k = Kernel(lambda args, kwargs: "missed", "sub")
    k.register((1,), hit_target)
    assert k(1, grid=1, block=1)[0] == "hit" and k(2.0, grid=1, block=1) == "missed"


def test_hits_do_not_leak():
    d, miss = make(hit_target)
    a, scalars = HostCAI(), (1, 2.0, np.float32(3), True)
    d(a, *scalars, grid=(1,), block=(32,))

    def loop(n):
        for _ in range(n):
            d(a, *scalars, grid=(1,), block=(32,))

    loop(1000)
    gc.collect()
    refs = (sys.getrefcount(a), sys.getrefcount(hit_target), sys.getrefcount(d))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop(10000)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 10000, grown
    assert (sys.getrefcount(a), sys.getrefcount(hit_target), sys.getrefcount(d)) == refs
    assert len(miss.calls) == 1


def test_misses_and_registrations_do_not_leak():
    def loop(n):
        for i in range(n):
            d, miss = make(hit_target)
            d(HostCAI((i % 7 + 1,)), 1, grid=1, block=1)
            d(HostCAI((i % 7 + 1,)), 1, grid=1, block=1)
            miss.target = None
            d(np.zeros(3), grid=1, block=1)
            d.signature((HostCAI(), object(), 1.0))
            try:
                d.register((object(),), hit_target)
            except ValueError:
                pass
            d.clear()

    loop(200)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop(2000)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 20000, grown


# ---------------------------------------------------------------------------
# guards: the globals, cells and code a kernel's trace read, checked before a hit

UNBOUND = C.Dispatcher.UNBOUND


def closure_cell(value):
    def inner():
        return value
    return inner.__closure__[0]


def test_guards_hold_while_globals_cells_and_code_are_unchanged():
    d, miss = make()
    names, cell = {"SCALE": 2.0, "mg": np}, closure_cell(3)

    def kernel():
        pass

    d.register((1,), hit_target, ((kernel, None, kernel.__code__, None), (names, "SCALE", names["SCALE"], None),
                                  (names, "range", UNBOUND, None), (cell, None, 3, None)))
    assert d(1, grid=1, block=1)[0] == "hit"
    original = names["SCALE"], kernel.__code__
    # An equal float that is another object misses too: identity decides, as in the check in Python.
    changes = [(lambda: names.__setitem__("SCALE", float("2.0")), lambda: names.__setitem__("SCALE", original[0])),
               (lambda: names.pop("SCALE"), lambda: names.__setitem__("SCALE", original[0])),
               (lambda: names.__setitem__("range", range), lambda: names.pop("range")),
               (lambda: setattr(cell, "cell_contents", 4), lambda: setattr(cell, "cell_contents", 3)),
               (lambda: delattr(cell, "cell_contents"), lambda: setattr(cell, "cell_contents", 3)),
               (lambda: setattr(kernel, "__code__", (lambda: None).__code__),
                lambda: setattr(kernel, "__code__", original[1]))]
    for change, undo in changes:
        change()
        assert d(1, grid=1, block=1) == ("missed", 1)
        undo()
        assert d(1, grid=1, block=1)[0] == "hit"
    assert len(miss.calls) == len(changes) and len(d) == 1


def test_an_unbound_cell_and_a_new_registration_replace_the_guards():
    d, miss = make()
    cell = closure_cell(0)
    del cell.cell_contents
    d.register((1,), hit_target, ((cell, None, UNBOUND, None),))
    assert d(1, grid=1, block=1)[0] == "hit"
    cell.cell_contents = 1
    assert d(1, grid=1, block=1) == ("missed", 1)
    d.register((1,), hit_target, ((cell, None, 1, None),))   # what a miss that found no change does
    assert d(1, grid=1, block=1)[0] == "hit" and len(d) == 1
    d.register((1,), hit_target)   # no guards: always a hit
    cell.cell_contents = 2
    assert d(1, grid=1, block=1)[0] == "hit"


def test_list_witnesses_compare_the_items():
    d, miss = make()
    names = {"OFFSETS": [0.0, 1.5, "x"]}
    offsets = names["OFFSETS"]
    d.register((1,), hit_target, ((names, "OFFSETS", offsets, tuple(offsets)),))
    assert d(1, grid=1, block=1)[0] == "hit"
    first = offsets[0]
    for change in (lambda: offsets.__setitem__(0, 100.0), lambda: offsets.append(2.0), lambda: offsets.pop(),
                   lambda: offsets.clear()):
        saved = list(offsets)
        change()
        assert d(1, grid=1, block=1) == ("missed", 1)
        offsets[:] = saved
    offsets[0] = first
    assert d(1, grid=1, block=1)[0] == "hit"
    names["OFFSETS"] = list(offsets)   # equal, but another list
    assert d(1, grid=1, block=1) == ("missed", 1)


def test_array_witnesses_compare_dtype_shape_and_bytes():
    d, miss = make()
    table = np.arange(4, dtype=np.float32)
    names = {"TABLE": table}
    d.register((1,), hit_target, ((names, "TABLE", table, table.copy()),))
    assert d(1, grid=1, block=1)[0] == "hit"
    table[3] = 10.0
    assert d(1, grid=1, block=1) == ("missed", 1)
    table[3] = 3.0
    assert d(1, grid=1, block=1)[0] == "hit"
    table.shape = (2, 2)
    assert d(1, grid=1, block=1) == ("missed", 1)
    table.shape = (4,)
    table.dtype = np.int32   # the same bytes read as another dtype
    assert d(1, grid=1, block=1) == ("missed", 1)
    table.dtype = np.float32
    assert d(1, grid=1, block=1)[0] == "hit"
    assert len(miss.calls) == 3


def test_register_checks_its_guards():
    d, _ = make()
    names, cell = {"X": 1}, closure_cell(1)

    def kernel():
        pass

    bad = [[(names, "X", 1, None)],                          # a list, not a tuple
           ((names, "X", 1),),                                # three items
           ([names, "X", 1, None],),
           (({"X": 1}.items(), "X", 1, None),),               # no namespace
           (({1: 1}, 1, 1, None),),                           # a dict's key is a str
           ((cell, "X", 1, None),),                           # a cell's key is None
           ((kernel, None, 1, None),),                        # a function's value is its code
           ((kernel, None, kernel.__code__, ()),),
           ((names, "X", [1], [1]),),                         # a list's witness is a tuple
           ((names, "X", np.zeros(4), (0.0,) * 4),),          # an array's, an array
           ((names, "X", np.zeros(4), np.zeros(8)[::2]),),    # a C-contiguous one
           ((names, "X", 1, (1,)),)]                          # an int has none
    for guards in bad:
        with pytest.raises(TypeError):
            d.register((1,), hit_target, guards)
    assert len(d) == 0
    with pytest.raises(TypeError, match="2 to 4 arguments"):
        d.register((1,), hit_target, (), None, None)
    with pytest.raises(TypeError, match="owner must be a Dispatcher, not int"):
        d.register((1,), hit_target, None, 1)
    d.register((1,), hit_target, None)
    assert d(1, grid=1, block=1)[0] == "hit"


class Colliding:
    """A globals key that hashes like "X": a lookup of "X" runs its __eq__,
    which runs `on_eq` once the dict is made."""

    on_eq = None

    def __hash__(self):
        return hash("X")

    def __eq__(self, other):
        return self.on_eq() if self.on_eq else False


def colliding_globals(on_eq):
    key = Colliding()
    names = {key: 0, "X": 1}
    key.on_eq = on_eq
    return names


def test_a_lookup_that_raises_misses_and_one_that_clears_the_table_still_launches():
    def raising():
        raise ValueError("from __eq__")

    d, miss = make()
    names = colliding_globals(raising)
    d.register((1,), hit_target, ((names, "X", 1, None),))
    assert d(1, grid=1, block=1) == ("missed", 1)   # miss meets the error again, as the check in Python does

    def interrupting():
        raise KeyboardInterrupt

    names = colliding_globals(interrupting)
    d.register((1,), hit_target, ((names, "X", 1, None),))
    with pytest.raises(KeyboardInterrupt):
        d(1, grid=1, block=1)

    def clearing():
        d.clear()
        return False

    def target(*args, **kwargs):
        return "hit"

    names = colliding_globals(clearing)
    target_ref = weakref.ref(target)
    d.register((1,), target, ((names, "X", 1, None), (names, "Y", UNBOUND, None)))
    del target
    assert d(1, grid=1, block=1) == "hit" and len(d) == 0   # the hit held what the table let go
    gc.collect()
    assert target_ref() is None


def test_guards_are_kept_alive_and_cycles_through_them_are_collected():
    class Value:
        pass

    d, _ = make()
    names = {"V": Value()}
    ref = weakref.ref(names["V"])
    d.register((1,), hit_target, ((names, "V", names["V"], None),))
    names.clear()
    gc.collect()
    assert ref() is not None and d(1, grid=1, block=1) == ("missed", 1)
    d.clear()
    gc.collect()
    assert ref() is None
    cyclic = {"d": C.Dispatcher(lambda args, kwargs: None, "cyclic")}
    cyclic["d"].register((1,), hit_target, ((cyclic, "d", cyclic["d"], None),))
    dispatcher_ref = weakref.ref(cyclic["d"])
    del cyclic
    gc.collect()
    assert dispatcher_ref() is None


def test_guarded_hits_and_registrations_do_not_leak():
    d = C.Dispatcher(lambda args, kwargs: "missed", "k")
    table, offsets = np.arange(8, dtype=np.float32), [0.0, 1.0]
    names, cell = {"TABLE": table, "OFFSETS": offsets, "SCALE": 2.0}, closure_cell(3)
    guards = ((names, "TABLE", table, table.copy()), (names, "OFFSETS", offsets, tuple(offsets)),
              (names, "SCALE", names["SCALE"], None), (names, "range", UNBOUND, None), (cell, None, 3, None))

    def loop(n):
        for i in range(n):
            d.register((1,), hit_target, guards)
            d(1, grid=1, block=1)
            offsets[0] = float(i % 2)   # a miss every other call
            d(1, grid=1, block=1)
            offsets[0] = 0.0

    loop(1000)
    gc.collect()
    refs = [sys.getrefcount(x) for x in (table, offsets, names, cell, hit_target, guards)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop(10000)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 10000, grown
    assert refs == [sys.getrefcount(x) for x in (table, offsets, names, cell, hit_target, guards)]


# ---------------------------------------------------------------------------
# torch-like objects (the reader is chosen by type name; real torch: test_dispatch_gpu.py)

FAKE_TORCH = '''
import numpy as np

class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize
    def __repr__(self):
        return "torch." + self.name

float32, float16, bfloat16, int64, complex64, float8_e4m3fn = (dtype("float32", 4), dtype("float16", 2),
    dtype("bfloat16", 2), dtype("int64", 8), dtype("complex64", 8), dtype("float8_e4m3fn", 1))

class Size(tuple):
    pass

class Tensor:
    """torch.Tensor's reading surface: is_cuda, is_cpu, data_ptr(), dtype, shape, stride(), get_device()."""
    reads = 0
    def __init__(self, ptr, shape, stride, dt=float32, device=0, cai=False):
        self.ptr, self.shape, self.strides, self.dtype, self.device, self.cai = ptr, Size(shape), stride, dt, device, cai
    @property
    def is_cuda(self):
        return self.device >= 0
    @property
    def is_cpu(self):
        return self.device == -1
    def data_ptr(self):
        Tensor.reads += 1
        return self.ptr
    def stride(self):
        return self.strides
    def is_contiguous(self):
        expected, strides = 1, []
        for size in reversed(self.shape):
            strides.insert(0, expected)
            expected *= size
        return all(a == b for a, b, n in zip(self.strides, strides, self.shape) if n != 1)
    def get_device(self):
        return self.device
    @property
    def __cuda_array_interface__(self):
        if not self.cai:
            raise AttributeError("no CAI on this fake")
        return {"shape": tuple(self.shape), "typestr": "<f4", "data": (self.ptr, False), "version": 2}

Tensor.__module__ = "torch"

class Parameter(Tensor):
    pass
'''


def run_json(code):
    """Runs `code` in a fresh interpreter (the torch type is remembered once
    seen); its last line of output is JSON."""
    proc = run_isolated(code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_torch_like_tensors_are_read_by_attribute():
    out = run_json(FAKE_TORCH + '''
import json
import mlirgpu._mlirgpu as C
d = C.Dispatcher(lambda a, k: None, "k")
sig = lambda *a: [list(map(str, s)) for s in d.signature(a)]
out = {
    "cuda": sig(Tensor(4096, (2, 3), (3, 1))),
    "strided": sig(Tensor(4096, (3, 2), (1, 3), float16, device=2)),
    "param": sig(Parameter(4096, (5,), (1,), bfloat16)),
    "fp8": sig(Tensor(4096, (4, 8), (8, 1), float8_e4m3fn)),
    "cpu": sig(Tensor(4096, (4,), (1,), int64, device=-1)),
    "meta": sig(Tensor(4096, (4,), (1,), device=-2)),
    "complex": sig(Tensor(4096, (4,), (1,), complex64)),
    "complex_cai": sig(Tensor(4096, (4,), (1,), complex64, cai=True)),
}
print(json.dumps(out))
''')
    assert out["cuda"] == [["array", "mlirgpu.f32", "(2, 3)", "None", "0"]]
    assert out["strided"] == [["array", "mlirgpu.f16", "(3, 2)", "(2, 6)", "2"]]
    assert out["param"] == [["array", "mlirgpu.bf16", "(5,)", "None", "0"]]
    assert out["fp8"] == [["array", "mlirgpu.f8e4m3", "(4, 8)", "None", "0"]]
    assert out["cpu"] == [["host", "mlirgpu.i64", "(4,)", "None"]]
    # neither CUDA nor CPU, or a dtype mlirgpu lacks: the slow path, which refuses them
    assert out["meta"] == [["other", "<class 'torch.Tensor'>"]]
    assert out["complex"] == [["other", "<class 'torch.Tensor'>"]]
    # the slow path sees the CAI dict (which here claims f32)
    assert out["complex_cai"][0][:3] == ["array", "mlirgpu.f32", "(4,)"]


def test_asarray_without_synchronizing_views_a_torch_tensor_as_a_launch_reads_it():
    """For the ops, which launch on torch's current stream: no CAI dict built in
    Python (this fake has none), the view's geometry is the tensor's, and the
    view keeps the tensor alive."""
    out = run_json(FAKE_TORCH + '''
import json, sys
import mlirgpu._mlirgpu as C
t = Tensor(4096, (3, 2), (1, 3), bfloat16, device=0)
view = C.asarray(t, synchronize=False)
refs = sys.getrefcount(t)
del view
out = {"ptr": C.asarray(t, synchronize=False).ptr, "shape": list(C.asarray(t, synchronize=False).shape),
       "strides": list(C.asarray(t, synchronize=False).strides), "dtype": str(C.asarray(t, synchronize=False).dtype),
       "owned": refs - sys.getrefcount(t)}
try:
    C.asarray(Tensor(4096, (4,), (1,), device=-2), synchronize=False)    # meta: the protocols, which it lacks
except Exception as error:
    out["meta"] = type(error).__name__
print(json.dumps(out))
''')
    assert out == {"ptr": 4096, "shape": [3, 2], "strides": [2, 6], "dtype": "mlirgpu.bf16", "owned": 1,
                   "meta": "TypeError"}


# ---------------------------------------------------------------------------
# the Function path, on a fake driver

@pytest.fixture
def fake_driver(monkeypatch, fake_libcuda):
    monkeypatch.setenv("MLIRGPU_LIBCUDA", fake_libcuda)

# record_params(out, n, p0, p1, ...): the fake driver copies the n 8-byte
# parameters after the first two into out[0:n]: the launch's packed arguments.
FAKE_DRIVER_PRELUDE = FAKE_TORCH + '''
import gc, json, sys, tracemalloc
import numpy as np
import mlirgpu._mlirgpu as C
module = C.load_module(".visible .entry record_params(\\n")
record = module.get_function("record_params")
typed = module.get_function("record_params", params=["ptr", C.u32, "ptr", "ptr", "ptr", C.f32])
out = {}
def registering(function):
    """A Dispatcher over `function` that registers each miss, and the list
    of the misses' argument counts."""
    misses = []
    def miss(args, kwargs):
        misses.append(len(args))
        d.register(args, function)
        return function(*args, **kwargs)
    d = C.Dispatcher(miss, "record_params")
    return d, misses
'''


# torch.utils.dlpack as torch has it, exporting each fake tensor's backing
# DeviceArray (a real DLPack capsule); `exports` counts the calls.
FAKE_TORCH_DLPACK = FAKE_TORCH + '''
import sys, types
torch = types.ModuleType("torch")
torch.utils = types.ModuleType("torch.utils")
torch.utils.dlpack = types.ModuleType("torch.utils.dlpack")
sys.modules.update({"torch": torch, "torch.utils": torch.utils, "torch.utils.dlpack": torch.utils.dlpack})
exports = [0]
def to_dlpack(tensor):
    exports[0] += 1
    return tensor.backing.__dlpack__()
torch.utils.dlpack.to_dlpack = to_dlpack

def backed(array, dt=None, device=0):
    """A fake tensor over a DeviceArray: the attributes agree with its DLPack export."""
    t = Tensor(int(array.ptr), array.shape, tuple(s // array.itemsize for s in array.strides),
               dt or float32, device)
    t.backing = array
    return t
'''


# A DLPack exchange table (__dlpack_c_exchange_api__, as recent torch
# releases give torch.Tensor) for the fake tensors, made with ctypes: its
# dltensor_from_py_object_no_sync fills a DLTensor from a fake tensor's
# attributes (without counting them as reads); `exchanges` counts its calls.
FAKE_TORCH_EXCHANGE = FAKE_TORCH_DLPACK + '''
import ctypes
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
FILL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
class API(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p),
                ("managed_tensor_allocator", ctypes.c_void_p), ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p), ("dltensor_from_py_object_no_sync", FILL),
                ("current_work_stream", ctypes.c_void_p)]
DL_CODES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "int64": (0, 64), "complex64": (5, 64),
            "float8_e4m3fn": (10, 8)}
exchanges = [0]
def fill(tensor, out):
    if getattr(tensor, "refuse", False):
        return -1
    exchanges[0] += 1
    t = out.contents
    t.data, t.ndim, t.byte_offset = tensor.ptr, len(tensor.shape), 0
    t.device = DLDevice(2, tensor.device) if tensor.device >= 0 else DLDevice(1, 0)
    t.dtype = DLDataType(*DL_CODES[tensor.dtype.name], 1)
    tensor.dl_arrays = ((ctypes.c_int64 * 8)(*tensor.shape), (ctypes.c_int64 * 8)(*tensor.strides))
    t.shape = ctypes.cast(tensor.dl_arrays[0], ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(tensor.dl_arrays[1], ctypes.POINTER(ctypes.c_int64))
    return 0
NAME = b"dlpack_exchange_api"
capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
def exchange_table(major, function=fill):
    api = API(major, 3, None, None, None, None, FILL(function), None)
    tables.append(api)   # the table outlives its capsule, as a producer's static one does
    return capsule_new(ctypes.addressof(api), NAME, None)
tables = []
Tensor.__dlpack_c_exchange_api__ = exchange_table(1)
'''


@pytest.mark.usefixtures("fake_driver")
def test_torch_tensors_are_read_in_one_call_through_the_dlpack_exchange_table():
    """Where torch.Tensor has a DLPack exchange table, one C call reads a
    tensor, for a signature and for a Function's pointer alike: no attribute,
    no to_dlpack. A table of another major version, and a call that fails,
    leave the tensor to the other readers."""
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_TORCH_EXCHANGE + '''
sig = lambda *a: [list(map(str, s)) for s in C.Dispatcher(lambda a, k: None, "k").signature(a)]
reads = Tensor.reads
out["plain"] = sig(Tensor(4096, (4, 6), (6, 1)))
out["strided"] = sig(Tensor(4096, (6, 4), (1, 6), float16, device=1))
out["fp8_host"] = sig(Tensor(4096, (8,), (1,), float8_e4m3fn, device=-1))
buf, a = C.zeros(8, C.u64), C.empty(16)
record(buf, np.uint32(1), Tensor(int(a.ptr) + 8, (14,), (1,)), C.empty(1), C.empty(1), grid=1, block=1)
out["function_pointer"] = int(buf.get()[0]) == a.ptr + 8
out["exchanges"], out["attribute_reads"], out["exports"] = exchanges[0], Tensor.reads - reads, exports[0]
class Newer(Tensor):
    __dlpack_c_exchange_api__ = exchange_table(2)
transposed = C.empty((2, 3)).T
newer = Newer(int(transposed.ptr), transposed.shape, (1, 3))
newer.backing = transposed
reads = Tensor.reads
out["newer_major"] = sig(newer)[0][:4]
refused = backed(C.empty(5))
refused.refuse = True
out["refused"] = sig(refused)[0][:4]
out["exchanges_after"], out["exports_after"] = exchanges[0], exports[0]
out["attribute_reads_after"] = Tensor.reads - reads
print(json.dumps(out))
''')
    assert out["plain"] == [["array", "mlirgpu.f32", "(4, 6)", "None", "0"]]
    assert out["strided"] == [["array", "mlirgpu.f16", "(6, 4)", "(2, 12)", "1"]]
    assert out["fp8_host"] == [["host", "mlirgpu.f8e4m3", "(8,)", "None"]]
    assert out["function_pointer"]
    assert out["exchanges"] == 4 and out["attribute_reads"] == 0 and out["exports"] == 0
    # a table of another major version: to_dlpack; a failed call: the attributes
    assert out["newer_major"] == ["array", "mlirgpu.f32", "(3, 2)", "(4, 12)"]
    assert out["refused"] == ["array", "mlirgpu.f32", "(5,)", "None"]
    assert out["exchanges_after"] == 4 and out["exports_after"] == 1 and out["attribute_reads_after"] == 1


@pytest.mark.usefixtures("fake_driver")
def test_torch_tensors_are_read_through_dlpack_for_a_signature():
    """With torch.utils.dlpack imported, a tensor's signature comes from one
    to_dlpack call and its dtype, not from five attributes; pointer, shape,
    strides and device are the export's, and the capsule is freed."""
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_TORCH_DLPACK + '''
class Overriding(Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
sig = lambda *a: [list(map(str, s)) for s in C.Dispatcher(lambda a, k: None, "k").signature(a)]
base = C.empty((4, 6))
t = backed(base)
reads = Tensor.reads
out["plain"] = sig(t)
out["strided"] = sig(backed(base[:, ::2]))
out["transposed"] = sig(backed(base.T))
out["exports"], out["data_ptr_reads"] = exports[0], Tensor.reads - reads
# a tensor whose type overrides torch functions is read through its attributes
out["overriding"] = sig(Overriding(int(base.ptr), (4, 6), (6, 1)))
out["exports_after_override"] = exports[0]
# what to_dlpack refuses, the attributes read
def refuse(tensor):
    raise RuntimeError("cannot export")
torch.utils.dlpack.to_dlpack = refuse
out["refused"] = sig(backed(base))
torch.utils.dlpack.to_dlpack = to_dlpack
# the launch packs the exported pointer, of a view that starts inside its base
d, misses = registering(record)
buf = C.zeros(8, C.u64)
view = base[1:]
d(buf, np.uint32(1), backed(view), grid=1, block=1)
d(buf, np.uint32(1), backed(view), grid=1, block=1)
out["pointer"] = int(buf.get()[0]) == view.ptr and view.ptr == base.ptr + 24
out["misses"] = len(misses)
import weakref
alive = weakref.ref(view)
del view
gc.collect()
out["freed"] = alive() is None
print(json.dumps(out))
''')
    assert out["plain"] == [["array", "mlirgpu.f32", "(4, 6)", "None", "0"]]
    assert out["strided"] == [["array", "mlirgpu.f32", "(4, 3)", "(24, 8)", "0"]]
    assert out["transposed"] == [["array", "mlirgpu.f32", "(6, 4)", "(4, 24)", "0"]]
    assert out["exports"] == 3 and out["data_ptr_reads"] == 0
    assert out["overriding"] == [["array", "mlirgpu.f32", "(4, 6)", "None", "0"]]
    assert out["exports_after_override"] == 3
    assert out["refused"] == [["array", "mlirgpu.f32", "(4, 6)", "None", "0"]]
    assert out["pointer"] and out["misses"] == 1
    assert out["freed"]   # each export's capsule released its DeviceArray


def test_torch_dtypes_come_from_the_tensor_not_its_dlpack_code():
    """A torch release that exports float8 under another DLPack code still
    launches as float8: the dtype is the tensor's; a size that disagrees
    with the export sends the tensor to its attributes."""
    out = run_json(FAKE_TORCH_DLPACK + '''
import json
import mlirgpu._mlirgpu as C
sig = lambda *a: [list(map(str, s)) for s in C.Dispatcher(lambda a, k: None, "k").signature(a)]
as_u8 = C.empty(8, C.u8, host=True)
out = {"fp8": sig(backed(as_u8, float8_e4m3fn, device=-1))}
reads = Tensor.reads
out["mismatch"] = sig(backed(as_u8, float16, device=-1))
out["mismatch_read_attributes"] = Tensor.reads - reads
print(json.dumps(out))
''')
    assert out["fp8"] == [["host", "mlirgpu.f8e4m3", "(8,)", "None"]]
    assert out["mismatch"] == [["host", "mlirgpu.f16", "(8,)", "None"]]
    assert out["mismatch_read_attributes"] == 1


@pytest.mark.usefixtures("fake_driver")
def test_function_hits_launch_with_the_pointers_read():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
d, misses = registering(record)
buf = C.zeros(8, C.u64)
a, b, c = C.empty(16), C.empty(16), C.empty(16)
tensor = Tensor(int(c.ptr), (16,), (1,))
d(buf, np.uint32(3), a, b, c, grid=1, block=1)
d(buf, np.uint32(3), c, a, b, grid=1, block=1)
out["rotated"] = [int(x) for x in buf.get()[:3]] == [c.ptr, a.ptr, b.ptr]
reads = Tensor.reads
d(buf, np.uint32(3), b, tensor, a, grid=(1,), block=(1,), stream=C.Stream())
out["torch_like"] = [int(x) for x in buf.get()[:3]] == [b.ptr, c.ptr, a.ptr]
out["data_ptr_reads"] = Tensor.reads - reads
cai = type("CAI", (), {"__cuda_array_interface__": b.__cuda_array_interface__})()
d(buf, np.uint32(3), cai, cai, cai, grid=1, block=1)
out["cai"] = [int(x) for x in buf.get()[:3]] == [b.ptr] * 3
out["misses"] = misses
out["len"] = len(d)
try:
    d(buf, np.uint32(3), a, b, c, grid=0, block=1)
except C.LaunchError as e:
    out["grid_error"] = str(e)
try:
    d(buf, np.uint32(3), a, b, c, grid=1, block=2048)
except C.CudaError as e:
    out["driver_error"] = e.name
print(json.dumps(out))
''')
    assert out["rotated"] and out["torch_like"] and out["cai"]
    assert out["data_ptr_reads"] == 1
    assert out["misses"] == [5] and out["len"] == 1
    assert "grid[0] = 0" in out["grid_error"] and "record_params" in out["grid_error"]
    assert out["driver_error"] == "CUDA_ERROR_INVALID_VALUE"


@pytest.mark.usefixtures("fake_driver")
def test_a_hit_reads_each_argument_once():
    """The signature and the packing share one reading of an argument, even
    where the launch keywords run user code (an __index__, a foreign stream)."""
    out = run_json(FAKE_DRIVER_PRELUDE + '''
d, misses = registering(record)
buf, a = C.zeros(8, C.u64), C.empty(16)
class Counting:
    reads = 0
    @property
    def __cuda_array_interface__(self):
        Counting.reads += 1
        return a.__cuda_array_interface__
class ForeignStream:
    def __cuda_stream__(self):
        return (0, 0)
x = Counting()
d(buf, np.uint32(1), x, grid=1, block=1)
reads = []
for keywords in ({"grid": 1, "block": 1}, {"grid": np.int64(1), "block": (np.int32(1),)},
                 {"grid": 1, "block": 1, "stream": C.Stream()}, {"grid": 1, "block": 1, "stream": ForeignStream()}):
    before = Counting.reads
    d(buf, np.uint32(1), x, **keywords)
    reads.append(Counting.reads - before)
out["reads"] = reads
out["packed"] = int(buf.get()[0]) == a.ptr
out["misses"] = misses
print(json.dumps(out))
''')
    assert out["reads"] == [1, 1, 1, 1]
    assert out["packed"] and out["misses"] == [3]


@pytest.mark.usefixtures("fake_driver")
def test_copy_from_copies_device_to_device():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
src = C.to_device(np.arange(6, dtype=np.float32))
dst = C.zeros(6)
stream = C.Stream()
dst.copy_from(src, stream=stream)
out["copied"] = dst.get().tolist()
out["cai_stream"] = [dst.__cuda_array_interface__["stream"] == stream.handle,
                     src.__cuda_array_interface__["stream"] == stream.handle]
try:
    dst.copy_from(C.zeros(6, host=True))
except ValueError as e:
    out["mixed"] = str(e)
print(json.dumps(out))
''')
    assert out["copied"] == [0, 1, 2, 3, 4, 5]
    assert out["cai_stream"] == [True, True]   # both arrays now order after the copy's stream
    assert "host memory" in out["mixed"]


@pytest.mark.usefixtures("fake_driver")
def test_host_device_arrays_never_reach_a_cuda_launch():
    """The CPU backend's DeviceArrays hold host addresses: a CUDA launch
    refuses them, and the dispatcher never serves them from its table."""
    out = run_json(FAKE_DRIVER_PRELUDE + '''
d, misses = registering(record)
buf = C.zeros(8, C.u64)
host = C.zeros(16, host=True)
try:
    record(buf, np.uint32(1), host, grid=1, block=1)
except C.LaunchError as e:
    out["function"] = str(e)
try:
    d(buf, np.uint32(1), host, grid=1, block=1)
except (C.LaunchError, ValueError) as e:
    out["dispatcher"] = str(e)
out["misses"] = misses
print(json.dumps(out))
''')
    assert "argument 2 is a host array" in out["function"]
    assert "argument 2 is a host array" in out["dispatcher"]
    assert out["misses"] == [3]


@pytest.mark.usefixtures("fake_driver")
def test_function_hits_pack_scalars_by_the_function_signature():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
d = C.Dispatcher(lambda args, kwargs: (d.register(args, typed), typed(*args, **kwargs)), "typed")
buf = C.zeros(8, C.u64)
a = C.empty(4)
d(buf, 4, a, a, a, 1.5, grid=1, block=1)
d(buf, 4, a, a, a, 2.5, grid=1, block=1)
got = buf.get()
out["scalar"] = float(np.frombuffer(got[3].tobytes()[:4], np.float32)[0])
out["pointers"] = [int(x) for x in got[:3]] == [a.ptr] * 3
try:
    d(buf, 4, a, a, a, 2, grid=1, block=1)   # an int where the signature has f32: packed as 2.0
    out["int_for_f32"] = float(np.frombuffer(buf.get()[3].tobytes()[:4], np.float32)[0])
except C.LaunchError as e:
    out["int_for_f32"] = str(e)
try:
    d.register((buf, 4, a), typed)
except ValueError as e:
    out["count"] = str(e)
print(json.dumps(out))
''')
    assert out["scalar"] == 2.5 and out["pointers"]
    assert out["int_for_f32"] == 2.0
    assert "6 parameters, args has 3" in out["count"]


@pytest.mark.usefixtures("fake_driver")
def test_function_pointer_parameters_take_library_arrays_and_refuse_scalars():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
buf, a = C.zeros(8, C.u64), C.empty(4)
t = Tensor(123456, (4,), (1,))
for launch in ("first", "known"):     # the type is classified by the first launch, then known
    typed(buf, 3, t, a, t, 1.0, grid=1, block=1)
    out[launch] = [int(x) for x in buf.get()[:3]]
for name, scalar in (("numpy", np.float32(1)), ("int", 7), ("float", 2.5)):
    try:
        typed(buf, 3, a, scalar, a, 1.0, grid=1, block=1)
        out[name] = "launched"
    except C.LaunchError as e:
        out[name] = str(e)
record(buf, np.uint32(2), t, np.int64(99), grid=1, block=1)   # no signature: a NumPy scalar by its dtype
out["untyped"] = [int(x) for x in buf.get()[:2]]
print(json.dumps(out))
''')
    assert out["first"] == out["known"] == [123456, out["first"][1], 123456]
    for name, type_name in (("numpy", "numpy.float32"), ("int", "int"), ("float", "float")):
        assert f"argument 3 is a pointer: expected a device array, got {type_name}" in out[name]
    assert out["untyped"] == [123456, 99]


@pytest.mark.usefixtures("fake_driver")
def test_function_tensor_map_parameters_take_only_tensor_maps():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
import mlirgpu as mg
mg.set_backend("cpu")
host_map = mg.tensor_map(np.zeros((64, 64), np.float16), box=(8, 8), swizzle="none")
mapped = module.get_function("record_params", params=["ptr", C.u32, "tensormap"])
buf, a = C.zeros(8, C.u64), C.empty(4)
for name, function, args in (("array_for_map", mapped, (buf, 1, a)),
                             ("map_for_pointer", typed, (buf, 3, host_map, a, a, 1.0)),
                             ("host_map", mapped, (buf, 1, host_map)),
                             ("host_map_untyped", record, (buf, np.uint32(1), host_map))):
    try:
        function(*args, grid=1, block=1)
        out[name] = "launched"
    except C.LaunchError as e:
        out[name] = str(e)
print(json.dumps(out))
''')
    assert "argument 2 is a tensor map: expected an mlirgpu.TensorMap, got mlirgpu.DeviceArray" in out["array_for_map"]
    assert "argument 2 is not a tensor map parameter, got an mlirgpu.TensorMap" in out["map_for_pointer"]
    for name in ("host_map", "host_map_untyped"):
        assert "argument 2 is a tensor map made for the CPU backend" in out[name]


@pytest.mark.usefixtures("fake_driver")
def test_arrays_whose_cai_gives_raw_bytes_are_read_through_dlpack():
    """torch exports bfloat16 with the typestr "<V2" (raw bytes): its
    __dlpack__ names the dtype."""
    out = run_json(FAKE_DRIVER_PRELUDE + '''
backing = C.empty(4, C.bf16)
class Untyped:
    def __init__(self, dlpack=True):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<V2", "data": (backing.ptr, False), "version": 3}
        if dlpack:
            self.__dlpack__, self.__dlpack_device__ = backing.__dlpack__, backing.__dlpack_device__
view = C.asarray(Untyped())
out["asarray"] = [str(view.dtype), view.ptr == backing.ptr, view.shape]
d = C.Dispatcher(lambda a, k: None, "k")
out["signature"] = str(d.signature((Untyped(),))[0][1])
buf = C.zeros(8, C.u64)
record(buf, np.uint32(1), Untyped(), grid=1, block=1)
out["launched"] = int(buf.get()[0]) == backing.ptr
try:
    C.asarray(Untyped(dlpack=False))
except TypeError as e:
    out["no_dlpack"] = str(e)
print(json.dumps(out))
''')
    assert out["asarray"] == ["mlirgpu.bf16", True, [4]]
    assert out["signature"] == "mlirgpu.bf16"
    assert out["launched"]
    assert "typestr '<V2' is not an mlirgpu dtype" in out["no_dlpack"]


@pytest.mark.usefixtures("fake_driver")
def test_function_launch_reads_torch_like_tensors_without_cai():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
buf = C.zeros(8, C.u64)
t = Tensor(123456, (4,), (1,), complex64)        # no CAI, a dtype mlirgpu lacks: only the pointer matters
record(buf, np.uint32(2), t, Parameter(654321, (2,), (1,)), grid=1, block=1)
out["pointers"] = [int(x) for x in buf.get()[:2]]
for name, arg in (("cpu", Tensor(4096, (4,), (1,), device=-1)), ("numpy", np.zeros(4)),
                  ("meta", Tensor(4096, (4,), (1,), device=-2)), ("object", object())):
    try:
        record(buf, np.uint32(1), arg, grid=1, block=1)
        out[name] = "launched"
    except C.LaunchError as e:
        out[name] = "LaunchError: " + str(e)
    except TypeError as e:
        out[name] = "TypeError: " + str(e)
print(json.dumps(out))
''')
    assert out["pointers"] == [123456, 654321]
    assert out["cpu"].startswith("LaunchError") and "argument 2 is a host array" in out["cpu"]
    assert out["numpy"].startswith("LaunchError") and "host array" in out["numpy"]
    assert out["meta"].startswith("LaunchError") and "cannot pass" in out["meta"]
    assert out["object"].startswith("LaunchError") and "cannot pass object" in out["object"]


@pytest.mark.usefixtures("fake_driver")
def test_function_hits_do_not_leak_and_keep_the_function():
    out = run_json(FAKE_DRIVER_PRELUDE + '''
d = C.Dispatcher(lambda args, kwargs: None, "k")
buf, a = C.zeros(8, C.u64), C.empty(16)
t = Tensor(int(a.ptr), (16,), (1,))
args = (buf, np.uint32(3), a, t, a)
before_register = sys.getrefcount(record)
d.register(args, record)
out["ref_added"] = sys.getrefcount(record) - before_register
def loop(n):
    for _ in range(n):
        d(*args, grid=(1,), block=(1,))
loop(1000); gc.collect()
refs = [sys.getrefcount(x) for x in (record, buf, a, t)]
tracemalloc.start(); before = tracemalloc.get_traced_memory()[0]
loop(10000); gc.collect()
out["grown"] = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
out["refs_stable"] = refs == [sys.getrefcount(x) for x in (record, buf, a, t)]
out["launched"] = [int(x) for x in buf.get()[:3]] == [a.ptr] * 3
d.clear()
out["ref_released"] = sys.getrefcount(record) == before_register
print(json.dumps(out))
''')
    assert out["ref_added"] == 1 and out["ref_released"]
    assert out["refs_stable"] and out["launched"]
    assert out["grown"] < 10000, out["grown"]


# ---------------------------------------------------------------------------
# CuPy-like arrays (the reader is chosen by type name and module; real CuPy:
# test_dispatch_gpu.py). The fake modules hold what the reader looks up:
# cupy.cuda.get_current_stream() and cupy._util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION.

FAKE_CUPY = '''
import sys, types
import numpy as np

cupy = types.ModuleType("cupy")
cupy.cuda = types.ModuleType("cupy.cuda")
cupy._util = types.ModuleType("cupy._util")
cupy._util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION = 3
sys.modules.update({"cupy": cupy, "cupy.cuda": cupy.cuda, "cupy._util": cupy._util})

class Stream:
    def __init__(self, ptr):
        self.ptr = ptr
current = [Stream(0)]
stream_reads = [0]
def get_current_stream():
    stream_reads[0] += 1
    return current[0]
cupy.cuda.get_current_stream = get_current_stream

class MemoryPointer:
    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id

class ndarray:
    """cupy.ndarray's reading surface; its CAI claims a different shape, so
    a signature tells which way the array was read."""
    cai_reads = 0
    def __init__(self, ptr, shape, dtype=np.float32, strides=None, device=0):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        contiguous = [self.dtype.itemsize]
        for n in reversed(self.shape[1:]):
            contiguous.insert(0, contiguous[0] * n)
        self.strides = tuple(strides or contiguous[:len(self.shape)])
        self._c_contiguous = strides is None
        self.data = MemoryPointer(ptr, device)
    @property
    def ndim(self):
        return len(self.shape)
    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]
    @property
    def __cuda_array_interface__(self):
        ndarray.cai_reads += 1
        return {"shape": (99,), "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3,
                "stream": current[0].ptr or 1}

ndarray.__module__ = "cupy._core.core"
'''


def test_cupy_like_arrays_are_read_by_attribute_until_their_type_changes():
    out = run_json(FAKE_CUPY + '''
import json
import mlirgpu._mlirgpu as C
d = C.Dispatcher(lambda a, k: None, "k")
sig = lambda *a: [list(map(str, s)) for s in d.signature(a)]
out = {
    "contiguous": sig(ndarray(4096, (2, 3))),
    "strided": sig(ndarray(4096, (3, 2), np.float16, strides=(2, 6), device=1)),
    "complex": sig(ndarray(4096, (4,), np.complex64)),
}
out["cai_reads"] = ndarray.cai_reads
three = [ndarray(4096, (4,)) for _ in range(3)]
before = stream_reads[0]
sig(*three)
out["stream_reads_for_three"] = stream_reads[0] - before
# Changing the type (here its module) invalidates what was learnt about it.
ndarray.__module__ = "elsewhere"
out["moved"] = sig(ndarray(4096, (2, 3)))
out["cai_reads_after"] = ndarray.cai_reads
ndarray.__module__ = "cupy"
out["back"] = sig(ndarray(4096, (2, 3)))
print(json.dumps(out))
''')
    assert out["contiguous"] == [["array", "mlirgpu.f32", "(2, 3)", "None", "0"]]
    assert out["strided"] == [["array", "mlirgpu.f16", "(3, 2)", "(2, 6)", "1"]]
    # a dtype mlirgpu lacks: the protocol, whose error the miss reports (the fake's CAI says c8)
    assert out["complex"] == [["other", "<class 'cupy._core.core.ndarray'>"]]
    assert out["cai_reads"] == 1
    assert out["stream_reads_for_three"] == 1
    assert out["moved"][0][:3] == ["array", "mlirgpu.f32", "(99,)"] and out["cai_reads_after"] == 2
    assert out["back"] == [["array", "mlirgpu.f32", "(2, 3)", "None", "0"]]


def test_a_type_that_gains_or_loses_the_protocol_is_read_again():
    class Plain:
        pass

    d = C.Dispatcher(lambda a, k: None, "k")
    assert d.signature([Plain()])[0][0] == "other"
    Plain.__cuda_array_interface__ = property(lambda self: HostCAI((3,)).__cuda_array_interface__)
    assert d.signature([Plain()])[0][:3] == ("array", C.f32, (3,))
    del Plain.__cuda_array_interface__
    assert d.signature([Plain()])[0][0] == "other"


def test_cupy_like_arrays_are_read_through_their_types_attributes():
    """Attributes held in slots (C-level descriptors, as CuPy's are) are read
    through the descriptor found once per type, and a class that changes is
    looked up again; a 1-D array's shape comes from len(), with no tuple."""
    out = run_json(FAKE_CUPY + '''
import json
import mlirgpu._mlirgpu as C
class Slotted(ndarray):
    __slots__ = ("dtype", "_c_contiguous", "data", "strides", "_shape")
    shape_reads = 0
    def __init__(self, ptr, shape, dtype=np.float32):
        self.dtype, self._shape, self._c_contiguous = np.dtype(dtype), tuple(shape), True
        self.data = MemoryPointer(ptr, 0)
    @property
    def shape(self):
        Slotted.shape_reads += 1
        return self._shape
    @property
    def ndim(self):
        return len(self._shape)
    def __len__(self):
        return self._shape[0]
Slotted.__module__ = "cupy._core.core"
sig = lambda *a: [list(map(str, s)) for s in C.Dispatcher(lambda a, k: None, "k").signature(a)]
out = {"one_d": sig(Slotted(4096, (12,)))}
out["one_d_shape_reads"] = Slotted.shape_reads
out["two_d"] = sig(Slotted(4096, (3, 4)))
out["two_d_shape_reads"] = Slotted.shape_reads
later = Slotted(4096, (12,))
Slotted.dtype = property(lambda self: np.dtype(np.float16))   # the class changes: read anew
out["changed"] = sig(later)
print(json.dumps(out))
''')
    assert out["one_d"] == [["array", "mlirgpu.f32", "(12,)", "None", "0"]]
    assert out["one_d_shape_reads"] == 0
    assert out["two_d"] == [["array", "mlirgpu.f32", "(3, 4)", "None", "0"]]
    assert out["two_d_shape_reads"] == 1
    assert out["changed"] == [["array", "mlirgpu.f16", "(12,)", "None", "0"]]


@pytest.mark.usefixtures("fake_driver")
def test_cupy_like_memory_pointers_are_read_through_the_type_cupy_exports():
    """A `data` of the type CuPy exports as cupy.cuda.MemoryPointer is read
    through that type's descriptors, found along with the array type's; a
    change to that type is seen at the next launch, and a `data` of any
    other type is looked up."""
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_CUPY + '''
class Pointer:
    __slots__ = ("ptr", "device_id")
    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id
cupy.cuda.MemoryPointer = Pointer
buf, a, b, c = C.zeros(8, C.u64), C.empty(4), C.empty(4), C.empty(4)
def arrays(pointer_type):
    made = [ndarray(int(x.ptr), (4,)) for x in (a, b, c)]
    for x in made:
        x.data = pointer_type(x.data.ptr, 0)
    return made
d, _ = registering(record)
def launched(*arrays):
    d(buf, np.uint32(3), *arrays, grid=1, block=1)
    return [int(x) for x in buf.get()[:3]]
out["slotted"] = launched(*arrays(Pointer))
out["other"] = launched(*arrays(MemoryPointer))
kept = arrays(Pointer)
Pointer.ptr = property(lambda self: int(c.ptr))   # the type changes: read anew
out["changed"] = launched(*kept)
print(json.dumps(out))
''')
    pointers = out["slotted"]
    assert len(set(pointers)) == 3 and out["other"] == pointers
    assert out["changed"] == [pointers[2]] * 3


def cupy_stream_prelude(fake_libcuda):
    """Code that gives the CuPy stream tests waits() (the stream-ordering
    calls the fake driver saw since the last call), three CuPy-like arrays,
    a dispatcher `d` over `record`, and a `producer` stream."""
    return f'''
import ctypes
fake = ctypes.CDLL({fake_libcuda!r})
fake.fake_log.restype = ctypes.c_char_p
def waits():
    lines = fake.fake_log().decode().splitlines()
    fake.fake_log_clear()
    return [line.split()[0] for line in lines if line.split()[0] in ("cuEventRecord", "cuStreamWaitEvent")]
buf, a, b, c = C.zeros(8, C.u64), C.empty(4), C.empty(4), C.empty(4)
arrays = [ndarray(int(x.ptr), (4,)) for x in (a, b, c)]
d, _ = registering(record)
producer = C.Stream()
'''


@pytest.mark.usefixtures("fake_driver")
def test_cupy_like_arrays_order_the_launch_after_cupys_current_stream(fake_libcuda):
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_CUPY + cupy_stream_prelude(fake_libcuda) + '''
for path, launch in (("function", record), ("dispatcher", d)):
    current[0] = Stream(0)       # CuPy's null stream is the legacy default stream: the launch's own
    waits(); launch(buf, np.uint32(3), *arrays, grid=1, block=1)
    out[path + "_null"] = waits()
    current[0] = Stream(producer.handle)
    launch(buf, np.uint32(3), *arrays, grid=1, block=1)
    out[path + "_producer"] = waits()
    out[path + "_pointers"] = [int(x) for x in buf.get()[:3]] == [a.ptr, b.ptr, c.ptr]
    cupy._util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION = 2   # CuPy exports no stream then
    waits(); launch(buf, np.uint32(3), *arrays, grid=1, block=1)
    out[path + "_version2"] = waits()
    cupy._util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION = 3
out["cai_reads"] = ndarray.cai_reads
print(json.dumps(out))
''')
    for path in ("function", "dispatcher"):
        assert out[path + "_null"] == [] and out[path + "_version2"] == []
        # one wait for three arrays: they all name CuPy's current stream
        assert out[path + "_producer"] == ["cuEventRecord", "cuStreamWaitEvent"]
        assert out[path + "_pointers"]
    assert out["cai_reads"] == 0


@pytest.mark.usefixtures("fake_driver")
def test_cluster_launches_hit_and_launch_clusters(fake_libcuda):
    out = run_json(FAKE_DRIVER_PRELUDE + f'''
import ctypes
fake = ctypes.CDLL({fake_libcuda!r})
fake.fake_log.restype = ctypes.c_char_p
d, misses = registering(record)
buf = C.zeros(8, C.u64)
fake.fake_log_clear()
for _ in range(3):
    d(buf, np.uint32(0), grid=4, block=32, cluster=(2, 1, 1))
out["launches"] = [line for line in fake.fake_log().decode().splitlines() if line.startswith("cuLaunchKernel")]
out["misses"] = len(misses)
print(json.dumps(out))
''')
    assert out["misses"] == 1
    assert [line for line in out["launches"] if "cluster=2,1,1" in line] == ["cuLaunchKernelEx cluster=2,1,1"] * 3


@pytest.mark.usefixtures("fake_driver")
@pytest.mark.parametrize("devices, exports_get_stream_ptr", [(1, True), (1, False), (2, True)])
def test_cupy_like_arrays_read_the_current_stream_through_cupys_c_functions(fake_libcuda, monkeypatch, devices,
                                                                             exports_get_stream_ptr):
    """Where CuPy's stream module exports its C functions (Cython's
    __pyx_capi__), the current stream's pointer comes from them, not from a
    Stream object: with one GPU, from get_stream_ptr(0) where CuPy has it
    (device 0 is then the current one), else from get_current_stream_ptr;
    a null stream is the per-thread default stream where CuPy was told to
    use that one."""
    monkeypatch.setenv("FAKE_CUDA_DEVICES", str(devices))
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_CUPY + cupy_stream_prelude(fake_libcuda) + f'''
import types
ptds, c_calls, device_calls = [0], [0], []
def current_ptr():
    c_calls[0] += 1
    return current[0].ptr
def device_ptr(device):
    device_calls.append(device)
    return current[0].ptr
CURRENT, PTDS = ctypes.CFUNCTYPE(ctypes.c_ssize_t)(current_ptr), ctypes.CFUNCTYPE(ctypes.c_int)(lambda: ptds[0])
OF_DEVICE = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int)(device_ptr)
capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
capsule = lambda function, signature: capsule_new(ctypes.cast(function, ctypes.c_void_p).value, signature, None)
backends = types.ModuleType("cupy_backends.cuda.stream")
backends.__pyx_capi__ = {{"get_current_stream_ptr": capsule(CURRENT, b"intptr_t (void)"),
                          "is_ptds_enabled": capsule(PTDS, b"int (void)")}}
if {exports_get_stream_ptr}:
    backends.__pyx_capi__["get_stream_ptr"] = capsule(OF_DEVICE, b"intptr_t (int)")
sys.modules["cupy_backends.cuda.stream"] = backends
before = stream_reads[0]
for path, launch in (("function", record), ("dispatcher", d)):
    current[0] = Stream(0)
    waits(); launch(buf, np.uint32(3), *arrays, grid=1, block=1)
    out[path + "_null"] = waits()
    current[0] = Stream(producer.handle)
    launch(buf, np.uint32(3), *arrays, grid=1, block=1)
    out[path + "_producer"] = waits()
    current[0], ptds[0] = Stream(0), 1
    launch(buf, np.uint32(3), *arrays, grid=1, block=1)
    out[path + "_per_thread"] = waits()
    ptds[0] = 0
out["c_calls"], out["device_calls"], out["stream_object_reads"] = c_calls[0], device_calls, stream_reads[0] - before
print(json.dumps(out))
''')
    for path in ("function", "dispatcher"):
        assert out[path + "_null"] == []
        assert out[path + "_producer"] == ["cuEventRecord", "cuStreamWaitEvent"]
        assert out[path + "_per_thread"] == ["cuEventRecord", "cuStreamWaitEvent"]
    assert out["stream_object_reads"] == 0
    if devices == 1 and exports_get_stream_ptr:
        assert out["c_calls"] == 0 and len(out["device_calls"]) >= 6 and set(out["device_calls"]) == {0}
    else:
        assert out["c_calls"] >= 6 and out["device_calls"] == []


# ---------------------------------------------------------------------------
# JAX-like arrays (the reader is chosen by type name and module; real JAX:
# test_dispatch_gpu.py)

FAKE_JAX = '''
import numpy as np

# not on the class: changing a type makes it be classified again; "deleted_reads" counts what real JAX
# crashes or raises on when the array was deleted
counts = {"cai": 0, "waits": 0, "pointers": 0, "deleted_reads": 0}

class ShapedArray:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

class ArrayImpl:
    """jax.Array's reading surface; its CAI claims a different shape, so a
    signature tells which way the array was read."""
    exported_readonly = True
    def __init__(self, ptr, shape, dtype=np.float32, ready=True, device=(2, 0)):
        self.ptr, self.aval, self.ready = ptr, ShapedArray(tuple(shape), np.dtype(dtype)), ready
        self.device, self.deleted = device, False
    def is_deleted(self):
        return self.deleted
    def delete(self):
        self.deleted = True
    def is_ready(self):
        counts["deleted_reads"] += self.deleted
        return self.ready
    def block_until_ready(self):
        counts["waits"] += 1
        self.ready = True
        return self
    def __dlpack_device__(self):
        return self.device
    def unsafe_buffer_pointer(self):
        counts["deleted_reads"] += self.deleted
        counts["pointers"] += 1
        return self.ptr
    @property
    def __cuda_array_interface__(self):
        counts["deleted_reads"] += self.deleted
        counts["cai"] += 1
        return {"shape": (99,), "typestr": self.aval.dtype.str, "data": (self.ptr, self.exported_readonly),
                "version": 2}

ArrayImpl.__module__ = "jaxlib.xla_extension"
'''


def test_jax_like_arrays_are_read_by_attribute_once_ready():
    out = run_json(FAKE_JAX + '''
import json
import mlirgpu._mlirgpu as C
d = C.Dispatcher(lambda a, k: None, "k")
sig = lambda *a: [list(map(str, s)) for s in d.signature(a)]
out = {"ready": sig(ArrayImpl(4096, (2, 3)))}
out["waits_when_ready"] = counts["waits"]
out["cai_reads_first"] = counts["cai"]      # once per type: whether JAX exports read-only
out["pending"] = sig(ArrayImpl(4096, (5,), np.int32, ready=False))
out["waits_when_pending"] = counts["waits"]
out["complex"] = sig(ArrayImpl(4096, (4,), np.complex64))
out["cai_reads"] = counts["cai"]
print(json.dumps(out))
''')
    assert out["ready"] == [["array", "mlirgpu.f32", "(2, 3)", "None", "0"]] and out["waits_when_ready"] == 0
    assert out["cai_reads_first"] == 1
    assert out["pending"] == [["array", "mlirgpu.i32", "(5,)", "None", "0"]] and out["waits_when_pending"] == 1
    # a dtype mlirgpu lacks: the protocol, the second CAI read
    assert out["complex"] == [["other", "<class 'jaxlib.xla_extension.ArrayImpl'>"]] and out["cai_reads"] == 2


def test_a_jax_like_array_seen_before_costs_one_question():
    out = run_json(FAKE_JAX + '''
import json
import mlirgpu as mg
import mlirgpu._mlirgpu as C
d = C.Dispatcher(lambda a, k: None, "k")
sig = lambda *a: [list(map(str, s)) for s in d.signature(a)]
x, y = ArrayImpl(4096, (2, 3)), ArrayImpl(8192, (7,), np.int32)
out = {"first": sig(x, y), "pointers_first": counts["pointers"]}
out["again"] = sig(x, y, x)
out["pointers_again"] = counts["pointers"]
# An object at the address of one that died is read anew.
del x
z = ArrayImpl(4096, (5,))
out["successor"] = sig(z)
out["pointers_successor"] = counts["pointers"]
# On the host: the protocol (the fake's claims shape (99,)).
out["host"] = sig(ArrayImpl(4096, (3,), device=(1, 0)))
y.delete()
out["deleted_sig"] = sig(y)
for view in (lambda: C.asarray(y), lambda: C.asarray(y, host=True)):
    try:
        view()
    except ValueError as e:
        out["deleted_view"] = str(e)
out["deleted_reads"] = counts["deleted_reads"]
print(json.dumps(out))
''')
    assert out["first"] == [["array", "mlirgpu.f32", "(2, 3)", "None", "0"], ["array", "mlirgpu.i32", "(7,)", "None", "0"]]
    assert out["pointers_first"] == 2
    assert out["again"] == out["first"] + out["first"][:1] and out["pointers_again"] == 2
    assert out["successor"] == [["array", "mlirgpu.f32", "(5,)", "None", "0"]] and out["pointers_successor"] == 3
    assert out["host"][0][:3] == ["array", "mlirgpu.f32", "(99,)"]
    assert out["deleted_sig"][0][0] == "other"
    assert "deleted" in out["deleted_view"] and out["deleted_reads"] == 0


@pytest.mark.usefixtures("fake_driver")
def test_a_deleted_jax_like_array_is_refused_before_jax_is_asked():
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_JAX + '''
import mlirgpu as mg
buf, a = C.zeros(8, C.u64), C.empty(4)
x = ArrayImpl(int(a.ptr), (4,))
reads_only = module.get_function("record_params", params=["ptr", C.u32, "ptr"], stores=[0])
reads_only(buf, np.uint32(1), x, grid=1, block=1)
x.delete()
try:
    reads_only(buf, np.uint32(1), x, grid=1, block=1)
except ValueError as e:
    out["function"] = str(e)

@mg.kernel
def first(X: mg.memref[4, mg.f32], Y: mg.memref[4, mg.f32]):
    Y[0] = X[0]
try:
    first(x, mg.empty(4), grid=1, block=1)
except mg.LaunchError as e:
    out["kernel"] = str(e)
out["deleted_reads"] = counts["deleted_reads"]
print(json.dumps(out))
''')
    assert "JAX array was deleted" in out["function"]
    assert "parameter 'X'" in out["kernel"] and "JAX array was deleted" in out["kernel"]
    assert out["deleted_reads"] == 0


@pytest.mark.usefixtures("fake_driver")
def test_jax_like_arrays_are_read_only_to_kernels():
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_JAX + '''
buf, a = C.zeros(8, C.u64), C.empty(4)
x = ArrayImpl(int(a.ptr), (4,))
reads_only = module.get_function("record_params", params=["ptr", C.u32, "ptr"], stores=[0])
reads_only(buf, np.uint32(1), x, grid=1, block=1)
out["pointer"] = int(buf.get()[0]) == a.ptr
try:
    record(buf, np.uint32(1), x, grid=1, block=1)     # no stores=: it may store to any array
except C.LaunchError as e:
    out["stored"] = str(e)
ArrayImpl.exported_readonly = False     # a JAX that exports writable arrays (the type changed: learnt again)
buf = C.zeros(8, C.u64)
record(buf, np.uint32(1), x, grid=1, block=1)
out["writable"] = int(buf.get()[0]) == a.ptr
print(json.dumps(out))
''')
    assert out["pointer"] and out["writable"]
    assert "read-only" in out["stored"]


@pytest.mark.usefixtures("fake_driver")
def test_cupy_and_jax_like_hits_do_not_leak():
    out = run_json(FAKE_DRIVER_PRELUDE + FAKE_CUPY + FAKE_JAX + '''
buf, a = C.zeros(8, C.u64), C.empty(16)
c, j = ndarray(int(a.ptr), (16,)), ArrayImpl(int(a.ptr), (16,))
current[0] = Stream(C.Stream().handle)      # every call waits for CuPy's stream
reads_only = module.get_function("record_params", params=["ptr", C.u32, "ptr", "ptr", "ptr"], stores=[0])
d, _ = registering(reads_only)
args = (buf, np.uint32(3), c, j, c)
def loop(n):
    for _ in range(n):
        d(*args, grid=(1,), block=(1,))
        reads_only(*args, grid=(1,), block=(1,))
loop(1000); gc.collect()
watched = (reads_only, buf, a, c, j, current[0], get_current_stream)
refs = [sys.getrefcount(x) for x in watched]
tracemalloc.start(); before = tracemalloc.get_traced_memory()[0]
loop(10000); gc.collect()
out["grown"] = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
out["refs_stable"] = refs == [sys.getrefcount(x) for x in watched]
out["launched"] = [int(x) for x in buf.get()[:3]] == [a.ptr] * 3
out["len"] = len(d)
print(json.dumps(out))
''')
    assert out["refs_stable"] and out["launched"] and out["len"] == 1
    assert out["grown"] < 10000, out["grown"]
