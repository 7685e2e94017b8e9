"""No crash, no leak, no hang: the C core against code that runs while it
works. Each test targets one mechanism: state read before user code runs
(argument properties, __index__, generators, sys.stdout.write) is not trusted
after it; CPU launches keep their own state and can be interrupted; read-only
memory stays read-only; IR never points across roots. Crash-prone cases run
in a fresh interpreter, so a regression fails the test instead of the run."""
import json
import os

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu._mlirgpu as C
from mlirgpu import ir, thread_idx, block_idx

from support.checks import assert_isolated, run_isolated


def run_json(code):
    proc = run_isolated(code)
    assert proc.returncode == 0, f"status {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def fake_driver(monkeypatch, fake_libcuda):
    monkeypatch.setenv("MLIRGPU_LIBCUDA", fake_libcuda)


# record_params(out, n, p0, ...): the fake driver copies the launch's packed
# parameters after the first two into out[0:n].
FAKE = '''
import json
import numpy as np
import mlirgpu._mlirgpu as C
module = C.load_module(".visible .entry record_params(\\n")
record = module.get_function("record_params")
out = {}
class CAI:
    """A foreign device array: its pointer is whatever `ptr` is now."""
    def __init__(self, ptr, readonly=False):
        self.ptr, self.readonly = ptr, readonly
    @property
    def __cuda_array_interface__(self):
        return {"shape": (16,), "typestr": "<f4", "data": (self.ptr, self.readonly), "version": 3}
'''


# ---------------------------------------------------------------------------
# 1. State read before Python code runs is not trusted after it

def test_dispatcher_table_cleared_by_argument_code():
    """The signature table is looked up after the arguments were read: their
    properties (here one that clears the table) may have changed it."""
    out = run_json('''
import json
import mlirgpu._mlirgpu as C
class Clearing:
    armed = False
    @property
    def __cuda_array_interface__(self):
        if Clearing.armed:
            d.clear()
        return {"shape": (4,), "typestr": "<f4", "data": (4096, False), "version": 3}
calls = []
d = C.Dispatcher(lambda args, kwargs: calls.append("miss"), "k")
x = Clearing()
d.register((x,), lambda *a, **k: calls.append("hit"))
d(x)
Clearing.armed = True
for _ in range(3):
    d(x)
print(json.dumps({"calls": calls, "len": len(d)}))
''')
    assert out == {"calls": ["hit", "miss", "miss", "miss"], "len": 0}


@pytest.mark.usefixtures("fake_driver")
def test_launch_reads_pointers_after_the_keywords_code():
    """A grid extent's __index__ runs after the dispatcher read the argument
    pointers; it moves the foreign array. The launch must pass the pointer
    as it is after that code, not the one read before."""
    out = run_json(FAKE + '''
buf = C.zeros(8, C.u64)
a, b = C.empty(16), C.empty(16)
x = CAI(int(a.ptr))
d = C.Dispatcher(lambda args, kwargs: (d.register(args, record), record(*args, **kwargs)), "k")
class Moving:
    def __index__(self):
        x.ptr = int(b.ptr)
        return 1
d(buf, np.uint32(1), x, grid=1, block=1)        # miss: registers
x.ptr = int(a.ptr)
d(buf, np.uint32(1), x, grid=(Moving(),), block=1)  # hit: the grid moves x
out["passed"] = int(buf.get()[0]) == int(b.ptr)
print(json.dumps(out))
''')
    assert out["passed"]


# ---------------------------------------------------------------------------
# 2. Lists read while user code changes them; generators that leave `with`

class Shrinking:
    """An extent whose __index__ empties the list it is in and fills it with junk."""
    def __init__(self, victim, value):
        self.victim, self.value = victim, value

    def __index__(self):
        self.victim.clear()
        self.victim.extend([object()] * 1000)
        return self.value


def test_empty_takes_its_shape_as_a_tuple_first():
    shape = [2, 3]
    shape.insert(0, Shrinking(shape, 4))
    a = C.empty(shape, host=True)
    assert a.shape == (4, 2, 3)


@mg.kernel
def store_thread(X: mg.memref[8, mg.i32]):
    X[thread_idx.x] = mg.cast(thread_idx.x + 10 * block_idx.x, mg.i32)


def test_cpu_launch_dims_taken_as_a_tuple_first():
    engine = mg.cpu.engine(store_thread.specialize({}))
    X = np.zeros(8, np.int32)
    block = [1, 1]
    block.insert(0, Shrinking(block, 8))
    grid = []
    grid.append(Shrinking(grid, 1))
    engine.launch([X], grid, block)
    assert X.tolist() == list(range(8))


@pytest.mark.usefixtures("fake_driver")
def test_cuda_launch_dims_taken_as_a_tuple_first():
    out = run_json(FAKE + '''
buf = C.zeros(8, C.u64)
class Shrinking:
    def __init__(self, victim): self.victim = victim
    def __index__(self):
        self.victim.clear(); self.victim.extend([object()] * 1000); return 1
grid = [1, 1]
grid.insert(0, Shrinking(grid))
record(buf, np.uint32(1), C.empty(4), grid=grid, block=[Shrinking(grid)])
out["ok"] = True
print(json.dumps(out))
''')
    assert out["ok"]


def test_ir_sequences_are_read_before_the_current_context():
    """A generator that leaves the only `with` holding a Context: what the C
    code looked up before iterating would be freed memory."""
    assert_isolated('''
        import gc
        from mlirgpu import ir
        def leaving(values):
            ir.Context.current().__exit__(None, None, None)
            gc.collect()
            yield from values
        for make in (lambda: ir.Attribute.dense_i64_array(leaving([1, 2])),
                     lambda: ir.Attribute.array(leaving([ir.Attribute.unit()])),
                     lambda: ir.Type.function(leaving([]), []),
                     lambda: ir.Attribute.strided_layout(0, leaving([1]))):
            ir.Context().__enter__()
            try:
                print(make())
            except ValueError as error:   # items of the Context left behind
                print(error)
        print("survived")
    ''', "survived")


# ---------------------------------------------------------------------------
# 3. CPU launches keep their own state

@mg.kernel
def talk(X: mg.memref[4, mg.i32]):
    t = thread_idx.x
    mg.syncthreads()
    X[t] = X[t] + 1
    mg.printf("%d\n", X[t])


def test_cpu_launches_from_two_threads_and_from_stdout_write():
    """Two threads launch printing kernels at once (each launch releases the
    GIL between blocks), and a sys.stdout whose write launches a kernel."""
    assert_isolated('''
        import sys, threading
        import numpy as np
        import mlirgpu as mg
        from test_safety import talk
        mg.set_backend("cpu")
        engine = mg.cpu.engine(talk.specialize({}))
        errors = []
        def work():
            try:
                for _ in range(20):
                    X = np.zeros(4, np.int32)
                    engine.launch([X], 8, 4)
                    assert X.tolist() == [8] * 4, X
            except BaseException as e:
                errors.append(repr(e))
        class Relaunching:
            def __init__(self, out): self.out, self.nested = out, 0
            def write(self, text):
                if self.nested < 5:
                    self.nested += 1
                    Y = np.zeros(4, np.int32)
                    engine.launch([Y], 2, 4)
                    assert Y.tolist() == [2] * 4
                return len(text)
            def flush(self): pass
        real = sys.stdout
        threads = [threading.Thread(target=work) for _ in range(2)]
        sys.stdout = Relaunching(real)
        for t in threads: t.start()
        for t in threads: t.join()
        nested = sys.stdout.nested
        sys.stdout = real
        print("errors", errors, "nested", nested)
    ''', "errors [] nested 5")


# ---------------------------------------------------------------------------
# 4. Block extents whose product overflows

@pytest.mark.parametrize("block", [(2**31 - 1, 2**31 - 1, 2**31 - 1), (2**21, 2**21, 2**21 + 1), (1025,),
                                   (2**31 - 1, 2**31 - 1)])
def test_block_product_overflow_is_a_launch_error(block):
    engine = mg.cpu.engine(store_thread.specialize({}))
    with pytest.raises(mg.LaunchError, match="at most 1024"):
        engine.launch([np.zeros(8, np.int32)], 1, block)


# ---------------------------------------------------------------------------
# 5. Read-only memory

def test_readonly_dlpack_stays_readonly_through_views_and_exports():
    host = np.arange(4, dtype=np.float32)
    host.flags.writeable = False
    view = C.asarray(host, host=True)
    assert view.readonly
    with pytest.raises(ValueError, match="read-only"):
        view.copy_from_host(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        view.copy_from(C.zeros(4, host=True))
    with pytest.raises(BufferError, match="versioned"):
        view.__dlpack__()
    again = C.asarray(view.__dlpack__(max_version=(1, 0)), host=True)
    assert again.readonly
    assert C.asarray(C.asarray(np.zeros(4, np.float32), host=True).__dlpack__(), host=True).readonly is False
    # Slices, transposes and reshapes of it are views of the same read-only memory.
    for derived in (view[1:3], view[::2], view.reshape(2, 2), view.reshape(2, 2).T):
        assert derived.readonly
        with pytest.raises(ValueError, match="read-only"):
            derived.fill(1.0) if derived.is_c_contiguous else derived.copy_from_host(np.zeros(derived.shape, np.float32))
    np.testing.assert_array_equal(host, [0, 1, 2, 3])


def test_readonly_cai_bit_is_kept():
    cai = type("RO", (), {"__cuda_array_interface__": {"shape": (4,), "typestr": "<f4",
                                                       "data": (4096, True), "version": 3}})()
    view = C.asarray(cai)
    assert view.readonly
    assert view.__cuda_array_interface__["data"][1] is True
    assert C.asarray(view).readonly
    bad = type("Bad", (), {"__cuda_array_interface__": {"shape": (4,), "typestr": "<f4",
                                                        "data": (4096, "no"), "version": 3}})()
    with pytest.raises(TypeError, match="read_only"):
        C.asarray(bad)


@mg.kernel
def copy_kernel(Y: mg.memref[4, mg.f32], X: mg.memref[4, mg.f32]):
    Y[thread_idx.x] = X[thread_idx.x]


def test_cpu_engine_refuses_a_readonly_array_for_a_stored_parameter():
    spec = copy_kernel.specialize({})
    lowered = mg.cpu.lowered_module(spec)
    X = np.arange(4, dtype=np.float32)
    X.flags.writeable = False
    strings = [a.value for a in mg.cpu.host_module(spec).operation.attributes["mg.cpu.strings"].value]
    params = [("memref", 1, 4, True), ("memref", 1, 4, False)]
    engine = C.CpuEngine(lowered, spec.name, params, "k.py", strings=strings)
    Y = np.zeros(4, np.float32)
    engine.launch([Y, X], 1, 4)   # X is only read: allowed
    np.testing.assert_array_equal(Y, X)
    with pytest.raises(mg.LaunchError, match="read-only"):
        engine.launch([X, Y], 1, 4)


N_STORES = mg.generics("N_STORES")


@mg.kernel
def stores_two_of_three(Y: mg.memref[N_STORES, mg.f32], X: mg.memref[N_STORES, mg.f32],
                        Z: mg.memref[N_STORES, mg.f32]):
    i = thread_idx.x
    mg.vstore(Y, (i * 4,), mg.vload(X, (i * 4,), 4))
    mg.atomic.add(Z, i, X[i])


@mg.kernel
def reads_through_shared(Y: mg.memref[N_STORES, mg.f32], X: mg.memref[N_STORES, mg.f32]):
    s = mg.shared.array((32,), mg.f32)
    s[thread_idx.x] = X[thread_idx.x]
    mg.syncthreads()
    Y[thread_idx.x] = s[31 - thread_idx.x] + X[N_STORES - 1 - thread_idx.x]


def test_gpu_kernels_know_which_parameters_they_store_to():
    # Found in the traced GPU module: a read-only array may be passed for the others.
    assert stores_two_of_three[64].stored_params() == {0, 2}     # vector store, atomic
    assert reads_through_shared[64].stored_params() == {0}      # X only read, also into shared memory
    assert copy_kernel.specialize({}).stored_params() == {0}


@pytest.mark.usefixtures("fake_driver")
def test_asarray_takes_dlpack_where_the_cuda_interface_cannot_describe_the_array():
    # torch raises from __cuda_array_interface__ for dtypes it has no type string for (8-bit floats).
    out = run_json(FAKE + '''
class Undescribed:
    def __init__(self, array):
        self.array = array
    @property
    def __cuda_array_interface__(self):
        raise KeyError("no type string for this dtype")
    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)
    def __dlpack_device__(self):
        return self.array.__dlpack_device__()
class Broken:
    @property
    def __cuda_array_interface__(self):
        raise KeyError("broken")
base = C.empty(16)
view = C.asarray(Undescribed(base))
out["same"] = view.ptr == base.ptr and view.shape == (16,)
try:
    C.asarray(Broken())
except KeyError as e:
    out["kept"] = str(e)
print(json.dumps(out))
''')
    assert out["same"]
    assert out["kept"] == "'broken'"   # without DLPack to fall back on, the interface's own error


@pytest.mark.usefixtures("fake_driver")
def test_cuda_launch_refuses_a_readonly_array_the_kernel_may_store_to():
    out = run_json(FAKE + '''
buf = C.zeros(8, C.u64)
ro = CAI(int(C.empty(16).ptr), readonly=True)
try:
    record(buf, np.uint32(1), ro, grid=1, block=1)
except C.LaunchError as e:
    out["refused"] = str(e)
reads_only = module.get_function("record_params", stores=[0])
reads_only(buf, np.uint32(1), ro, grid=1, block=1)
out["allowed"] = int(buf.get()[0]) == ro.ptr
d = C.Dispatcher(lambda args, kwargs: (d.register(args, record), record(*args, **kwargs)), "k")
d(buf, np.uint32(1), CAI(ro.ptr), grid=1, block=1)    # registers the writeable signature
try:
    d(buf, np.uint32(1), ro, grid=1, block=1)        # a read-only one is another signature
except C.LaunchError as e:
    out["dispatcher"] = str(e)
print(json.dumps(out))
''')
    assert "argument 2 is a read-only array" in out["refused"]
    assert out["allowed"]
    assert "read-only" in out["dispatcher"]


# ---------------------------------------------------------------------------
# 6. IR across roots

NESTED = (
    "func.func @f(%a: f32, %n: index) {\n"
    "  %c0 = arith.constant 0 : index\n  %c1 = arith.constant 1 : index\n"
    "  scf.for %i = %c0 to %n step %c1 {\n    %x = arith.addf %a, %a : f32\n  }\n"
    "  return\n}")


def test_clone_with_nested_uses_of_another_module_is_refused(ctx):
    source = ir.Module.parse(NESTED)
    loop = source.body.operations[0].regions[0].blocks[0].operations[2]
    assert loop.name == "scf.for"
    copy = loop.clone()
    target = ir.Module.parse("func.func @g() { return }")
    with pytest.raises(ValueError, match="outside the IR tree"):
        target.body.insert(0, copy) if hasattr(target.body, "insert") else target.body.append(copy)


def test_printing_after_the_source_module_dies(ctx):
    assert_isolated('''
        import gc
        from mlirgpu import ir
        from test_safety import NESTED
        with ir.Context():
            source = ir.Module.parse(NESTED)
            copy = source.body.operations[0].regions[0].blocks[0].operations[2].clone()
            target = ir.Module.parse("func.func @g() { return }")
            try:
                target.body.append(copy)
            except ValueError:
                print("refused")
            del source
            gc.collect()
            print(str(copy).count("arith.addf"), str(target).count("arith.addf"))
    ''', "refused\n1 0")


# ---------------------------------------------------------------------------
# 7. The JIT's materialization inside the fatal-error guard

def test_unselectable_intrinsic_is_a_compile_error():
    """An NVVM intrinsic in a host module: the x86 back end cannot select it,
    which LLVM reports as a fatal error (it used to end the process)."""
    assert_isolated('''
        import mlirgpu as mg
        import mlirgpu._mlirgpu as C
        from mlirgpu import ir, passes
        with ir.Context():
            module = ir.Module.parse(
                "llvm.func @k(%p: !llvm.ptr) attributes {llvm.emit_c_interface} {\\n"
                "  %t = nvvm.read.ptx.sreg.tid.x : i32\\n"
                "  llvm.store %t, %p : i32, !llvm.ptr\\n  llvm.return\\n}")
            try:
                C.CpuEngine(module, "k", [], "k.py")
            except mg.CompileError as e:
                print("CompileError")
    ''', "CompileError")


# ---------------------------------------------------------------------------
# 8. The caller's data is not written

@pytest.mark.usefixtures("fake_driver")
def test_get_function_leaves_the_callers_params_tuple_alone():
    out = run_json(FAKE + '''
params = ("ptr", "u32", "ptr")
before = hash(params)
f = module.get_function("record_params", params=params)
out["same"] = params == ("ptr", "u32", "ptr") and hash(params) == before
out["normalized"] = str(f.params[1]) if hasattr(f, "params") else "mlirgpu.u32"
print(json.dumps(out))
''')
    assert out["same"]


# ---------------------------------------------------------------------------
# 9. Long CPU launches: Ctrl-C and other threads

@mg.kernel
def spin(X: mg.memref[1024, mg.i32], n: mg.i32):
    acc = mg.cast(0, mg.i32)
    for i in range(n):
        acc = acc * 1664525 + mg.cast(i, mg.i32)   # a recurrence LLVM cannot fold away
    X[block_idx.x] = acc | 1


def test_long_cpu_launch_is_interrupted_and_lets_threads_run():
    """Ctrl-C (a SIGINT from another thread) lands between blocks, before
    the grid is done; a counting thread moves while the blocks run."""
    out = run_json('''
        import json, os, signal, threading, time
        import numpy as np
        import mlirgpu as mg
        from test_safety import spin
        # Python's own Ctrl-C handler, as in an interpreter started from a terminal: a parent
        # (a background job of a non-interactive shell) may have left SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        engine = mg.cpu.engine(spin.specialize({}))
        X = np.zeros(1024, np.int32)
        n = np.int32(20_000_000).tobytes()   # about 3 s of blocks here: the interrupt at 0.5 s lands mid-grid
        engine.launch([X, np.int32(1).tobytes()], 1, 1)     # compiled and warm
        X[:] = 0
        ticks = [0]
        started = threading.Event()
        def count():
            started.set()
            while ticks[0] >= 0:
                ticks[0] += 1
                time.sleep(0)
        def interrupt():
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)
        counter = threading.Thread(target=count, daemon=True)
        counter.start(); started.wait()
        threading.Thread(target=interrupt, daemon=True).start()
        before = ticks[0]
        try:
            engine.launch([X, n], 1024, 1)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        during = ticks[0] - before
        ticks[0] = -10**9
        print(json.dumps({"interrupted": interrupted, "blocks_done": int((X != 0).sum()), "ticks": during}))
    ''')
    assert out["interrupted"]
    assert out["blocks_done"] < 1024
    assert out["ticks"] > 0


def test_cpu_run_knows_which_parameters_the_kernel_stores_to():
    """mg.cpu.run passes a read-only array for a parameter the trace only
    reads, and refuses one for a parameter it stores to."""
    spec = copy_kernel.specialize({})
    assert mg.cpu.stored_params(mg.cpu.host_module(spec), spec.name) == {0}
    X = np.arange(4, dtype=np.float32)
    X.flags.writeable = False
    Y = np.zeros(4, np.float32)
    mg.cpu.run(spec, [Y, X], grid=1, block=4)
    np.testing.assert_array_equal(Y, X)
    with pytest.raises(mg.LaunchError, match="read-only"):
        mg.cpu.run(spec, [X, Y], grid=1, block=4)


# ---------------------------------------------------------------------------
# A kernel that faults on the GPU is named by the error that reports it

def test_a_faulting_kernel_is_named_and_the_context_declared_dead(fake_driver):
    """The fake driver's illegal_address kernel faults as an out-of-bounds
    kernel does: its launch succeeds and every later call fails with
    CUDA_ERROR_ILLEGAL_ADDRESS. Each of those errors names the kernel (the
    last launched on the call's stream, and the last launched anywhere) and
    says that the context is dead and how to recover."""
    out = run_json(FAKE + '''
import mlirgpu as mg
module = C.load_module(".visible .entry record_params(\\n.visible .entry illegal_address(\\n")
faulting = module.get_function("illegal_address")
first, second = mg.Stream(), mg.Stream()
buf = C.empty(4)
record(buf, np.uint32(0), grid=1, block=1, stream=second)
faulting(grid=1, block=1, stream=first)
messages = {}
for what, call in [("sync first", first.synchronize), ("sync second", second.synchronize),
                   ("get", buf.get), ("alloc", lambda: C.empty(4)),
                   ("launch", lambda: record(buf, np.uint32(0), grid=1, block=1, stream=first))]:
    try:
        call()
        messages[what] = None
    except mg.CudaError as error:
        messages[what] = [error.name, str(error)]
print(json.dumps(messages))
''')
    for what, (name, message) in out.items():
        assert name == "CUDA_ERROR_ILLEGAL_ADDRESS", what
        assert "The CUDA context of this device is now unusable" in message, what
        assert "starting a new process" in message and "cuDevicePrimaryCtxReset" in message, what
    assert "kernel 'illegal_address' (the last launched on this stream) faulted" in out["sync first"][1]
    assert ("'record_params' was the last launched on this stream, 'illegal_address' the last launched in "
            "this process") in out["sync second"][1]
    for what in ("alloc", "launch"):
        assert "kernel 'illegal_address' (the last launched in this process) faulted" in out[what][1], what
    assert out["launch"][1].startswith("cuLaunchKernel of 'record_params' failed: CUDA_ERROR_ILLEGAL_ADDRESS")


@pytest.mark.gpu
def test_an_out_of_bounds_kernel_on_the_gpu_is_named():
    """A real illegal address: the fault kills the context, so in a process
    of its own; the error of the next call names the kernel."""
    out = run_json('''
import json
import mlirgpu as mg

@mg.kernel
def wild_store(A: mg.memref[16, mg.f32], offset: mg.i64):
    A[offset] = mg.constant(1.0, mg.f32)

A = mg.zeros((16,), mg.f32)
wild_store(A, 1 << 40, grid=1, block=1)
try:
    mg.cuda.synchronize()
    print(json.dumps(None))
except mg.CudaError as error:
    print(json.dumps([error.name, str(error)]))
''')
    assert out is not None, "the wild store did not fault"
    name, message = out
    assert name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "kernel 'wild_store' (the last launched in this process) faulted" in message
    assert "now unusable" in message and "new process" in message
