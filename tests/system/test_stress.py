"""A bounded stress run of the CPU backend: 8 threads at once compile
specializations, launch them (printing kernels among them), compile PTX
(every round anew: the stages run without the GIL, all at once), allocate
and free DeviceArrays, for MLIRGPU_STRESS_SECONDS (default 20) seconds in a
fresh interpreter. It must end normally, every result must be right, and after the
first round (which compiles everything once) the process must stay within a
bounded resident size."""
import json
import os

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

from support.checks import run_isolated

N = mg.generics("N")

@mg.kernel
def scale(X: mg.memref[N, mg.f32], k: mg.f32):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        X[i] = X[i] * k

@mg.kernel
def shout(X: mg.memref[N, mg.i32]):
    t = thread_idx.x
    mg.syncthreads()
    X[t] = X[t] + 1
    if t == 0:
        mg.printf("block %d\n", block_idx.x)


SECONDS = float(os.environ.get("MLIRGPU_STRESS_SECONDS", "20"))
MB = 1 << 20

STRESS = '''
import io, json, os, sys, threading, time
import numpy as np
import mlirgpu as mg
from mlirgpu import thread_idx, block_idx, block_dim

mg.set_backend("cpu")
from test_stress import scale, shout

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

SIZES = [32, 64, 96, 128, 160, 192, 224, 256]
deadline = time.monotonic() + float(sys.argv[1])
errors, rounds = [], [0] * 8
sizes_after_warmup = []
barrier = threading.Barrier(8)
sys.stdout = io.StringIO()   # the printing kernels write here, from every thread

def work(w):
    try:
        n = SIZES[w]
        while True:
            X = np.arange(n, dtype=np.float32)
            scale(X, np.float32(2.0), grid=(n + 31) // 32, block=32)
            assert (X == 2 * np.arange(n)).all(), "scale"
            Y = np.zeros(32, np.int32)
            shout(Y, grid=3, block=32)
            assert (Y == 3).all(), "shout"
            assert ".entry scale" in mg.Compilation(scale[n].module(), "sm_80").ptx, "ptx"
            arrays = [mg.zeros(1000 + 37 * k) for k in range(8)]
            del arrays
            rounds[w] += 1
            if rounds[w] == 1:
                barrier.wait()
                if w == 0:
                    sizes_after_warmup.append(rss())
            if time.monotonic() > deadline:
                return
    except BaseException as e:
        errors.append(f"{w}: {e!r}")
        barrier.abort()

threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
for t in threads: t.start()
for t in threads: t.join()
sys.stdout = sys.__stdout__
grown = rss() - sizes_after_warmup[0] if sizes_after_warmup else None
print(json.dumps({"errors": errors, "rounds": rounds, "grown": grown}))
'''


def test_eight_threads_compile_launch_and_allocate():
    proc = run_isolated(STRESS.replace("sys.argv[1]", repr(str(SECONDS))), timeout=SECONDS + 300)
    assert proc.returncode == 0, f"status {proc.returncode}\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == []
    assert min(out["rounds"]) >= 2
    assert out["grown"] < 64 * MB
