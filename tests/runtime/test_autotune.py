"""mg.autotune: config checks, the CPU backend's rule (the first config that
compiles and launches), and the GPU's tuning logic run on the CPU backend
with the timing of one config (autotune._time_config) and the GPU's name
(autotune._gpu_name) replaced: the fastest config is chosen, recorded in the
cache directory and read back, the arguments are restored, the progress bar
is drawn. The timing itself and the device copies run against the fake
driver (tests/support/fake_cuda); real tuning on a GPU is marked `gpu`."""
import importlib
import json
import logging
import os
import stat
import threading

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx
from support.checks import run_isolated, toolkit_without_ptxas

autotune = importlib.import_module("mlirgpu.runtime.autotune")   # the module; mg.autotune is the decorator

M, N, K, T = mg.generics("M N K T")


@mg.kernel(generics=(M, N, K, T))
def tiled_matmul(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32]):
    """C += A @ B: one T x T tile of C per block of T x T threads."""
    As = mg.shared.array((T, T), mg.f32)
    Bs = mg.shared.array((T, T), mg.f32)
    tx, ty = thread_idx.x, thread_idx.y
    row = block_idx.y * T + ty
    col = block_idx.x * T + tx
    acc = mg.constant(0.0, mg.f32)
    for t in range(K // T):
        As[ty, tx] = A[row, t * T + tx]
        Bs[ty, tx] = B[t * T + ty, col]
        mg.syncthreads()
        for k in range(T):
            acc += As[ty, k] * Bs[k, tx]
        mg.syncthreads()
    C[row, col] = C[row, col] + acc


TOO_BIG = dict(T=128)   # two 64 KB static shared arrays: over the 48 KB limit, a CompileError
CONFIGS = [TOO_BIG, dict(T=16), dict(T=8)]


def grid(g):
    return (g["N"] // g["T"], g["M"] // g["T"])


def block(g):
    return (g["T"], g["T"])


def make_tuner(**options):
    return mg.autotune(configs=CONFIGS, key=["M", "N", "K"], **options)(tiled_matmul)


def operands(m=32, n=32, k=32, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    C = rng.standard_normal((m, n), dtype=np.float32)
    return A, B, C


def one_launch(A, B, C):
    """What one launch makes of C, in float64."""
    return C.astype(np.float64) + A.astype(np.float64) @ B.astype(np.float64)


@pytest.fixture(autouse=True)
def cpu_and_cache_dir(tmp_path, monkeypatch):
    """The CPU backend and an empty cache directory for every test here."""
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(tmp_path))
    previous = mg.backend()
    mg.set_backend("cpu")
    yield tmp_path
    mg.set_backend(previous)


@pytest.fixture
def log(monkeypatch, caplog):
    monkeypatch.setenv("MLIRGPU_LOG", "autotune")
    caplog.set_level(logging.INFO, logger="mlirgpu")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "mlirgpu"]


TIMES = {16: 0.25, 8: 0.5}   # ms, by T: T=16 is the fastest


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU path on the CPU backend: a GPU name, and a timing that
    compiles and launches the config for real (so it fails where the config
    does, and writes the arrays as a timing run would) and returns TIMES."""
    timed = []

    def time_config(spec, args, grid, block, shared_mem, stream, warmup, repeat):
        timed.append(dict(spec.values))
        for _ in range(warmup + repeat):
            spec.launch(args, grid, block, shared_mem, stream)
        return TIMES[spec.values["T"]]

    monkeypatch.setattr(autotune, "_gpu_name", lambda: "Fake GPU 80GB")
    monkeypatch.setattr(autotune, "_time_config", time_config)
    return timed


# ---------------------------------------------------------------------------
# Checks at decoration

@pytest.mark.parametrize("configs, key, error, match", [
    ([dict(T=8, X=1)], ["M"], ValueError, "config 0 names 'X', which is not a generic of tiled_matmul"),
    ([dict(T=8), dict(T=8, K=32)], ["M"], ValueError, "config 1 gives K, which the arguments .* determine"),
    ([dict(T=8), {}], ["M"], ValueError, "config 1 does not give T"),
    ([dict(T=0)], ["M"], ValueError, "config 0: generic T must be positive"),
    ([dict(T=mg.f32)], ["M"], ValueError, "config 0: generic T is a size"),
    ([dict(T=8)], ["M", "T"], ValueError, "key names 'T', which is not a generic the arguments .* determine"),
    ([dict(T=8)], ["Q"], ValueError, "key names 'Q'"),
    ([dict(T=8)], "M", TypeError, "key lists generic names"),
    ([], ["M"], TypeError, "configs is a non-empty list of dicts"),
    ([(("T", 8),)], ["M"], TypeError, "configs is a non-empty list of dicts"),
])
def test_bad_configs_and_keys_are_refused_at_decoration(configs, key, error, match):
    with pytest.raises(error, match=match):
        mg.autotune(configs=configs, key=key)(tiled_matmul)


def test_decorates_kernels_only():
    with pytest.raises(TypeError, match="decorates an @mg.kernel"):
        mg.autotune(configs=[dict(T=8)], key=["M"])(lambda A: None)


def test_attributes():
    tuner = make_tuner()
    assert isinstance(tuner, mg.Autotuner) and tuner.kernel is tiled_matmul
    assert tuner.configs == CONFIGS and tuner.key == ["M", "N", "K"]
    assert tuner.__name__ == "tiled_matmul" and tuner.__doc__ == tiled_matmul.__doc__
    assert tuner.best_config is None and tuner.best(M=32, N=32, K=32) is None
    assert tuner.path().parent == autotune.default_directory()
    assert tuner.path().name.startswith("test_autotune.tiled_matmul.")
    assert tuner.path().name.endswith(".autotune.json")
    with pytest.raises(TypeError, match="M, N, K"):
        tuner.best(M=32)


def test_dtype_generics_join_the_key():
    D = mg.generics("D")

    @mg.kernel(generics=(N, D, T))
    def fill(X: mg.memref[N, D], v: D):
        X[block_idx.x * T + thread_idx.x] = v

    tuner = mg.autotune(configs=[dict(T=4)], key=["N"])(fill)
    assert tuner.key == ["N", "D"]
    X = np.zeros(8, np.float64)
    tuner(X, np.float64(2.5), grid=lambda g: g["N"] // g["T"], block=lambda g: g["T"])
    assert (X == 2.5).all()
    assert tuner.best(N=8, D=np.float64) == dict(T=4)


# ---------------------------------------------------------------------------
# The CPU backend: the first config that compiles and launches

def test_cpu_backend_uses_the_first_config_that_compiles(cpu_and_cache_dir, log, capsys):
    tuner = make_tuner()
    A, B, C = operands()
    expected = one_launch(A, B, C)
    tuner(A, B, C, grid=grid, block=block)
    np.testing.assert_allclose(C, expected, rtol=1e-5, atol=1e-5)
    assert tuner.best_config == dict(T=16) and tuner.best(M=32, N=32, K=32) == dict(T=16)
    [(config, reason)] = tuner.skipped[(32, 32, 32)]
    assert config == TOO_BIG and reason.startswith("CompileError: ") and "48 KB" in reason
    assert any("skipped T=128: CompileError" in line and "48 KB" in line for line in log())
    assert tuner.timings == {}                                  # nothing is timed
    assert list(cpu_and_cache_dir.iterdir()) == []              # nor recorded
    assert capsys.readouterr().err == ""                        # no progress bar
    # Launched again: the choice is remembered, nothing is skipped again.
    lines = len(log())
    tuner(A, B, C, grid=grid, block=block)
    np.testing.assert_allclose(C, one_launch(A, B, expected), rtol=1e-5, atol=1e-5)
    assert len(log()) == lines


def test_cpu_backend_skips_a_config_the_launch_refuses(log):
    # T=64 compiles (2 x 16 KB of shared memory), but 64 x 64 threads is over 1024 a block.
    tuner = mg.autotune(configs=[dict(T=64), dict(T=8)], key=["M", "N", "K"])(tiled_matmul)
    A, B, C = operands(64, 64, 64)
    expected = one_launch(A, B, C)
    tuner(A, B, C, grid=grid, block=block)
    np.testing.assert_allclose(C, expected, rtol=1e-5, atol=1e-5)
    [(config, reason)] = tuner.skipped[(64, 64, 64)]
    assert config == dict(T=64) and reason.startswith("LaunchError: ") and "1024" in reason


def test_no_config_runs_is_a_launch_error():
    tuner = mg.autotune(configs=[TOO_BIG], key=["M", "N", "K"])(tiled_matmul)
    with pytest.raises(mg.LaunchError, match=r"no config compiles and launches:\n  T=128: CompileError"):
        tuner(*operands(), grid=grid, block=block)


def test_arguments_still_bind_and_check():
    tuner = make_tuner()
    A, B, C = operands()
    with pytest.raises(mg.LaunchError, match="generic K is 32 from A.shape.1. but 16 from B.shape.0."):
        tuner(A, B[:16], C, grid=grid, block=block)


# ---------------------------------------------------------------------------
# Tuning (the GPU's path, with the timing replaced)

def test_tuning_chooses_the_fastest_and_records_it(fake_gpu, log, capsys):
    tuner = make_tuner()
    A, B, C = operands()
    dC = mg.to_device(C)
    tuner(mg.to_device(A), mg.to_device(B), dC, grid=grid, block=block)
    key = (32, 32, 32)
    assert tuner.best_config == dict(T=16)
    assert tuner.timings[key] == [(dict(T=16), 0.25), (dict(T=8), 0.5)]
    [(config, reason)] = tuner.skipped[key]
    assert config == TOO_BIG and "48 KB" in reason
    assert [v["T"] for v in fake_gpu] == [128, 16, 8]
    data = json.loads(tuner.path().read_text())
    assert data["choices"] == {"Fake GPU 80GB|M=32,N=32,K=32": {"T": 16}}
    assert data["source"] == tiled_matmul.source_digest()
    assert any("on Fake GPU 80GB: chose T=16 (0.2500 ms; 2 timed, 1 skipped)" in line for line in log())
    # Each config ran warm-up and timed launches on C; the snapshot undid them all: one launch's worth.
    np.testing.assert_allclose(dC.get(), one_launch(A, B, C), rtol=1e-5, atol=1e-5)
    label = "mlirgpu autotune tiled_matmul (M=32, N=32, K=32)"
    assert capsys.readouterr().err == (f"\r{label}: [..........] 0/3 configs\r{label}: [###.......] 1/3 configs"
                                       f"\r{label}: [######....] 2/3 configs\r{label}: [##########] 3/3 configs\n")
    # A second launch does not tune again.
    tuner(mg.to_device(A), mg.to_device(B), dC, grid=grid, block=block)
    assert len(fake_gpu) == 3 and capsys.readouterr().err == ""


def test_numpy_arguments_are_not_touched_by_tuning(fake_gpu):
    tuner = make_tuner(progress=False)
    A, B, C = operands()
    expected = one_launch(A, B, C)
    tuner(A, B, C, grid=grid, block=block)
    np.testing.assert_allclose(C, expected, rtol=1e-5, atol=1e-5)


def test_progress_false_draws_nothing(fake_gpu, capsys):
    make_tuner(progress=False)(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 3 and capsys.readouterr().err == ""


def test_a_new_tuner_reads_the_choice_without_timing(fake_gpu, log, capsys):
    make_tuner()(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 3
    capsys.readouterr()
    fresh = make_tuner()   # a new decorator instance, as in a new process
    assert fresh.best(M=32, N=32, K=32) == dict(T=16)
    A, B, C = operands()
    expected = one_launch(A, B, C)
    fresh(A, B, C, grid=grid, block=block)
    assert len(fake_gpu) == 3                       # no timing
    assert fresh.best_config == dict(T=16) and fresh.timings == {}
    np.testing.assert_allclose(C, expected, rtol=1e-5, atol=1e-5)
    assert capsys.readouterr().err == ""
    assert any("loaded T=16 from" in line for line in log())


def test_key_values_and_gpu_name_are_separate_problems(fake_gpu, monkeypatch):
    tuner = make_tuner(progress=False)
    tuner(*operands(), grid=grid, block=block)
    tuner(*operands(32, 64, 32), grid=grid, block=block)
    assert len(fake_gpu) == 6
    monkeypatch.setattr(autotune, "_gpu_name", lambda: "Other GPU")
    tuner(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 9
    choices = json.loads(tuner.path().read_text())["choices"]
    assert sorted(choices) == ["Fake GPU 80GB|M=32,N=32,K=32", "Fake GPU 80GB|M=32,N=64,K=32",
                               "Other GPU|M=32,N=32,K=32"]


@pytest.mark.parametrize("content, reason", [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "not this kernel's choices"),
    ('{"source": "0000", "choices": {"Fake GPU 80GB|M=32,N=32,K=32": {"T": 16}}}', "not this kernel's choices"),
])
def test_a_corrupt_file_is_ignored_and_replaced(fake_gpu, log, content, reason):
    tuner = make_tuner(progress=False)
    tuner.path().write_text(content)
    tuner(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 3
    ignored = [line for line in log() if "ignoring" in line]
    assert len(ignored) == 1 and f"ignoring {tuner.path()} ({reason}" in ignored[0]   # logged once
    assert json.loads(tuner.path().read_text())["choices"] == {"Fake GPU 80GB|M=32,N=32,K=32": {"T": 16}}


def _plant_link(path, choices):
    target = path.with_name("elsewhere.json")
    target.write_text(choices)
    path.symlink_to(target)


def _plant_writable(path, choices):
    path.write_text(choices)
    path.chmod(0o666)


def _plant_large(path, choices):
    path.write_text(choices[:-1] + " " * autotune.MAX_CHOICES_BYTES + "}")


def _plant_fifo(path, choices):
    os.mkfifo(path)


def _plant_binary(path, choices):
    path.write_bytes(b"\xff\xfe" + choices.encode())


@pytest.mark.parametrize("plant, reason", [
    (_plant_link, "a symbolic link"), (_plant_writable, "group- or world-writable"),
    (_plant_large, "more than 1048576"), (_plant_fifo, "not a regular file"), (_plant_binary, "codec can't decode"),
])
def test_an_untrusted_choices_file_is_a_miss(fake_gpu, log, plant, reason):
    # What the compile cache refuses to read, the autotuner does not trust either: another user could
    # otherwise pick the configuration a kernel runs with.
    tuner = make_tuner(progress=False)
    tuner.path().parent.mkdir(parents=True, exist_ok=True)
    plant(tuner.path(), json.dumps({"source": tiled_matmul.source_digest(),
                                    "choices": {"Fake GPU 80GB|M=32,N=32,K=32": {"T": 8}}}))
    assert tuner.best(M=32, N=32, K=32) is None
    assert any(f"ignoring {tuner.path()} (" in line and reason in line for line in log())
    if plant is _plant_fifo:
        tuner.path().unlink()
    tuner(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 3 and tuner.best_config == dict(T=16)
    written = tuner.path().lstat()         # a file of this user's now, a link replaced
    assert stat.S_ISREG(written.st_mode) and stat.S_IMODE(written.st_mode) == 0o600


def test_a_stale_choice_is_ignored_and_retuned(fake_gpu, log):
    tuner = make_tuner(progress=False)
    tuner.path().write_text(json.dumps({"source": tiled_matmul.source_digest(), "choices": {
        "Fake GPU 80GB|M=32,N=32,K=32": {"T": 4},        # no longer a config
        "Fake GPU 80GB|M=64,N=64,K=64": {"T": 8}}}))     # another key: kept
    assert tuner.best(M=32, N=32, K=32) is None
    tuner(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 3 and tuner.best_config == dict(T=16)
    assert any("the choice {'T': 4}" in line and "is not in configs" in line for line in log())
    assert json.loads(tuner.path().read_text())["choices"] == {
        "Fake GPU 80GB|M=32,N=32,K=32": {"T": 16}, "Fake GPU 80GB|M=64,N=64,K=64": {"T": 8}}


def test_an_unwritable_cache_directory_keeps_the_choice_in_memory(fake_gpu, log, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(blocker / "cache"))   # under a file: cannot be made
    tuner = make_tuner(progress=False)
    tuner(*operands(), grid=grid, block=block)
    tuner(*operands(), grid=grid, block=block)
    assert len(fake_gpu) == 3 and tuner.best_config == dict(T=16)
    assert any("cannot write" in line and "kept in memory only" in line for line in log())


def test_every_config_failing_is_a_launch_error_and_restores(fake_gpu):
    tuner = mg.autotune(configs=[TOO_BIG], key=["M", "N", "K"], progress=False)(tiled_matmul)
    A, B, C = operands()
    with pytest.raises(mg.LaunchError, match="no config compiles and launches"):
        tuner(A, B, C, grid=grid, block=block)
    assert not tuner.path().exists()


def test_grid_and_block_callables_see_every_generic(fake_gpu):
    seen = []

    def grid_of(g):
        seen.append(dict(g))
        return grid(g)

    make_tuner(progress=False)(*operands(), grid=grid_of, block=block)
    assert seen[-1] == dict(M=32, N=32, K=32, T=16)   # the winner's launch
    assert [g["T"] for g in seen] == [128, 16, 8, 16]


# ---------------------------------------------------------------------------
# The GPU path against the fake driver (tests/support/fake_cuda): events, device
# snapshots, the recorded choice. The fake driver runs `add_scalar` (x[i] += v)
# by name; CUDA_HOME names a toolkit without ptxas, so kernels load as PTX, which it reads
# (it cannot read a cubin).

def test_tuning_on_the_fake_driver(fake_libcuda, tmp_path):
    script = tmp_path / "fake_driver_tuning.py"   # a file: the tracer reads the kernel's source
    script.write_text(f'''
import importlib, json, os
os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
os.environ["MLIRGPU_CACHE_DIR"] = {str(tmp_path)!r}
os.environ["CUDA_HOME"] = {toolkit_without_ptxas(str(tmp_path))!r}
import numpy as np
import mlirgpu as mg
autotune = importlib.import_module("mlirgpu.runtime.autotune")

N, R = mg.generics("N R")

@mg.autotune(configs=[dict(R=1), dict(R=2)], key=["N"], warmup=2, repeat=5)
@mg.kernel(generics=(N, R))
def add_scalar(X: mg.memref[N, mg.f32], v: mg.f32, n: mg.u32):   # R: a config the fake ignores
    X[mg.thread_idx.x] = X[mg.thread_idx.x] + v

out = {{"backend": mg.backend()}}
X = mg.zeros(64)
add_scalar(X, 1.5, 64, grid=1, block=64)
out["X"] = sorted(set(X.get().tolist()))
out["timings"] = [[c["R"], ms > 0] for c, ms in add_scalar.timings[(64,)]]
out["choices"] = json.loads(add_scalar.path().read_text())["choices"]
out["best"] = add_scalar.best_config
spec = add_scalar.kernel[64, 1]
x = mg.zeros(8)
out["ms"] = autotune._time_config(spec, [x, 2.0, 8], 1, 8, 0, None, 3, 4) > 0
out["x"] = sorted(set(x.get().tolist()))
print(json.dumps(out))
''')
    proc = run_isolated(f"import runpy; runpy.run_path({str(script)!r})")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == "cuda"
    assert out["X"] == [1.5]                    # 2 configs x 7 launches, restored: one launch's worth
    assert out["timings"] == [[1, True], [2, True]]
    assert out["choices"] == {f"Mock H100 80GB HBM3|N=64": {"R": out["best"]["R"]}}
    assert out["ms"] and out["x"] == [14.0]    # 3 warm-up + 4 timed launches of x += 2
    assert "mlirgpu autotune add_scalar (N=64): [##########] 2/2 configs" in proc.stderr


# ---------------------------------------------------------------------------
# On a GPU

@pytest.mark.gpu
def test_gpu_tuning_picks_a_config_and_keeps_it(monkeypatch, capsys):
    mg.set_backend("cuda")
    tuner = make_tuner()
    A, B, C = operands(64, 64, 64)
    dA, dB, dC = mg.to_device(A), mg.to_device(B), mg.to_device(C)
    tuner(dA, dB, dC, grid=grid, block=block)
    key = (64, 64, 64)
    assert tuner.best_config in (dict(T=16), dict(T=8))
    assert [c for c, _ in tuner.timings[key]] == [dict(T=16), dict(T=8)]
    assert all(ms > 0 for _, ms in tuner.timings[key])
    assert [c for c, _ in tuner.skipped[key]] == [TOO_BIG]
    np.testing.assert_allclose(dC.get(), one_launch(A, B, C), rtol=1e-4, atol=1e-4)
    assert "3/3 configs" in capsys.readouterr().err
    # Neither this tuner nor a fresh one times again.
    monkeypatch.setattr(autotune, "_time_config", lambda *a: pytest.fail("timed again"))
    tuner(dA, dB, dC, grid=grid, block=block)
    fresh = make_tuner()
    fresh(dA, dB, dC, grid=grid, block=block)
    assert fresh.best_config == tuner.best_config
    np.testing.assert_allclose(dC.get(), one_launch(A, B, one_launch(A, B, one_launch(A, B, C))),
                               rtol=1e-4, atol=1e-4)


def test_configs_compile_from_a_pool_of_threads_before_timing(fake_gpu, monkeypatch):
    """Every config's image is compiled (into the compile cache) before the
    first is timed, each in a thread of a pool; one that does not compile is
    skipped at its timing as before."""
    calls = []   # (thread, T, driver calls made before it)
    real_image = type(tiled_matmul[32, 32, 32, 8]).image

    def image(spec, chip=None):
        calls.append((threading.get_ident(), spec.values["T"], len(fake_gpu)))
        return real_image(spec, chip)

    monkeypatch.setattr(type(tiled_matmul[32, 32, 32, 8]), "image", image)
    tuner = make_tuner(progress=False)
    A, B, C = operands()
    tuner(mg.to_device(A), mg.to_device(B), mg.to_device(C), grid=grid, block=block)
    pooled = [(t, before) for thread, t, before in calls if thread != threading.get_ident()]
    assert sorted(t for t, _ in pooled) == [8, 16, 128]
    assert all(before == 0 for _, before in pooled)   # before the first launch was timed
    assert tuner.best_config == dict(T=16)
