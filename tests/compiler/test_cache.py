"""The compilation cache (mlirgpu.compiler.cache): memory and disk hits, recompiles
with their logged reasons, corrupt entries, several processes on one
directory, fingerprints of globals. CPU only."""
import hashlib
import json
import logging
import math
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import mlirgpu
from mlirgpu.compiler import cache, fingerprints, log, toolkit
from mlirgpu.compiler.cache import CacheInfo, CacheKey, CompileCache, fingerprint, fingerprint_globals
from support.checks import PYTHON_DIR

REPO = Path(__file__).resolve().parents[2]


SOURCE = hashlib.sha256(b"def kernel(): pass").hexdigest()


def make_key(kernel="mod.kernel", source=SOURCE, globals_=None, generics="M=256,K=128,N=256,dtype=f32",
             chip="sm_90a", options="opt_level=3"):
    digest, details = fingerprint_globals(globals_ if globals_ is not None else {"TILE": 16})
    return CacheKey({"kernel": kernel, "source": source, "globals": digest, "generics": generics,
                     "chip": chip, "options": options}, details={"globals": details})


class Compiler:
    """A compile_fn that counts its calls and returns bytes derived from the key."""

    def __init__(self, key):
        self.key, self.calls = key, 0

    def __call__(self):
        self.calls += 1
        return b"cubin:" + self.key.digest.encode()


@pytest.fixture
def log_compile(monkeypatch, caplog):
    monkeypatch.setenv("MLIRGPU_LOG", "compile,cache")
    caplog.set_level(logging.INFO, logger="mlirgpu")
    return caplog


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "mlirgpu"]


def run_python(code, *args, env=None, **kwargs):
    env = dict(env if env is not None else os.environ, PYTHONPATH=PYTHON_DIR)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


# --------------------------------------------------------------------------- hits

def test_second_get_is_a_memory_hit(tmp_path):
    store, key = CompileCache(tmp_path), make_key()
    compile_fn = Compiler(key)
    first = store.get_or_compile(key, compile_fn)
    second = store.get_or_compile(key, compile_fn)
    assert first == second == compile_fn()
    assert compile_fn.calls == 2   # the two lookups plus the direct call above
    assert store.info() == CacheInfo(hits=1, disk_hits=0, misses=1, compiles=1, disk_writes=1, corrupt=0)


def test_equal_keys_built_separately_hit(tmp_path):
    store = CompileCache(tmp_path)
    store.get_or_compile(make_key(), Compiler(make_key()))
    compile_fn = Compiler(make_key())
    store.get_or_compile(make_key(), compile_fn)
    assert compile_fn.calls == 0


def test_new_cache_on_the_same_directory_hits_the_disk(tmp_path, log_compile):
    key = make_key()
    CompileCache(tmp_path).get_or_compile(key, Compiler(key))
    store, compile_fn = CompileCache(tmp_path), Compiler(key)
    assert store.get_or_compile(key, compile_fn) == b"cubin:" + key.digest.encode()
    assert compile_fn.calls == 0
    assert store.info() == CacheInfo(hits=0, disk_hits=1, misses=1, compiles=0, disk_writes=0, corrupt=0)
    assert store.get_or_compile(key, compile_fn) == b"cubin:" + key.digest.encode()
    assert store.info().hits == 1
    assert ("mlirgpu: loaded mod.kernel [generics M=256,K=128,N=256,dtype=f32, chip sm_90a] "
            "from the disk cache") in messages(log_compile)


CHILD = """
    import sys
    from mlirgpu.compiler.cache import CacheKey, CompileCache
    key = CacheKey({"kernel": "mod.kernel", "generics": "M=256"})
    def compile_fn():
        print("compiled")
        return b"payload-from-the-parent"
    payload = CompileCache(sys.argv[1]).get_or_compile(key, compile_fn)
    print(payload.decode())
"""


def test_a_new_process_hits_the_disk(tmp_path):
    key = CacheKey({"kernel": "mod.kernel", "generics": "M=256"})
    CompileCache(tmp_path).get_or_compile(key, lambda: b"payload-from-the-parent")
    out, err = run_python(CHILD, tmp_path).communicate(timeout=120)
    assert out.split() == ["payload-from-the-parent"], err


# --------------------------------------------------------------------------- recompiles and their reasons

@pytest.mark.parametrize("change, reason", [
    ({"generics": "M=512,K=128,N=256,dtype=f32"}, "generics changed (M=256 -> M=512)"),
    ({"generics": "M=256,K=128,N=256,dtype=f16"}, "generics changed (dtype=f32 -> dtype=f16)"),
    ({"chip": "sm_80"}, "chip changed (sm_90a -> sm_80)"),
    ({"globals_": {"TILE": 32}}, "globals changed (TILE: 16 -> 32)"),
    ({"globals_": {"TILE": 16, "BLOCK": (8, 8)}}, "globals changed (BLOCK: <unset> -> (8, 8))"),
    ({"source": hashlib.sha256(b"def kernel(): return").hexdigest()}, "source changed"),
    ({"options": "opt_level=2"}, "options changed (opt_level=3 -> opt_level=2)"),
])
def test_a_changed_part_recompiles_and_says_why(tmp_path, log_compile, change, reason):
    store = CompileCache(tmp_path)
    before, after = make_key(), make_key(**change)
    store.get_or_compile(before, Compiler(before))
    compile_fn = Compiler(after)
    assert store.get_or_compile(after, compile_fn) == compile_fn()
    assert compile_fn.calls == 2
    assert store.info().compiles == 2
    label = f"[generics {after.parts['generics']}, chip {after.parts['chip']}]"
    assert messages(log_compile) == [
        "mlirgpu: compiling mod.kernel [generics M=256,K=128,N=256,dtype=f32, chip sm_90a] "
        "because: first compile",
        f"mlirgpu: compiling mod.kernel {label} because: {reason}",
    ]


def test_several_changes_are_all_named(tmp_path, log_compile):
    store = CompileCache(tmp_path, disk=False)
    store.get_or_compile(make_key(), Compiler(make_key()))
    after = make_key(globals_={"TILE": 32}, chip="sm_80", generics="M=512,K=64,N=256,dtype=f32")
    store.get_or_compile(after, Compiler(after))
    assert messages(log_compile)[-1].endswith(
        "because: globals changed (TILE: 16 -> 32); generics changed (M=256 -> M=512, K=128 -> K=64); "
        "chip changed (sm_90a -> sm_80)")


def test_a_changed_global_recompiles_even_from_a_warm_disk(tmp_path, log_compile):
    """Going back to an earlier value is a disk hit, not a compile."""
    store = CompileCache(tmp_path)
    for tile in (16, 32, 16):
        key = make_key(globals_={"TILE": tile})
        store.get_or_compile(key, Compiler(key))
    assert store.info().compiles == 2
    assert store.info().hits == 1
    fresh = CompileCache(tmp_path)
    for tile in (16, 32):
        key = make_key(globals_={"TILE": tile})
        compile_fn = Compiler(key)
        fresh.get_or_compile(key, compile_fn)
        assert compile_fn.calls == 0
    assert fresh.info().disk_hits == 2


def test_kernels_are_explained_separately(tmp_path, log_compile):
    store = CompileCache(tmp_path, disk=False)
    for key in (make_key(kernel="mod.a"), make_key(kernel="mod.b"), make_key(kernel="mod.a", chip="sm_80")):
        store.get_or_compile(key, Compiler(key))
    reasons = [m.split("because: ")[1] for m in messages(log_compile)]
    assert reasons == ["first compile", "first compile", "chip changed (sm_90a -> sm_80)"]


def test_reasons_compare_with_the_key_last_used(tmp_path, log_compile):
    """A disk or memory hit counts as a use: the next compile is explained against it."""
    key16 = make_key(globals_={"TILE": 16})
    CompileCache(tmp_path).get_or_compile(key16, Compiler(key16))
    store = CompileCache(tmp_path)
    store.get_or_compile(key16, Compiler(key16))                  # from disk
    for tile in (32, 16, 64):                                     # 16 is a memory hit
        key = make_key(globals_={"TILE": tile})
        store.get_or_compile(key, Compiler(key))
    reasons = [m.split("because: ")[1] for m in messages(log_compile) if "compiling" in m]
    assert reasons == ["first compile", "globals changed (TILE: 16 -> 32)",
                       "globals changed (TILE: 16 -> 64)"]


def test_recompile_after_clear_says_the_key_did_not_change(tmp_path, log_compile):
    store = CompileCache(tmp_path, disk=False)
    store.get_or_compile(make_key(), Compiler(make_key()))
    store.clear()
    store.get_or_compile(make_key(), Compiler(make_key()))
    assert messages(log_compile)[-1].endswith("because: not cached (key unchanged since its last use)")


def test_nothing_is_logged_without_mlirgpu_log(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MLIRGPU_LOG", raising=False)
    caplog.set_level(logging.DEBUG)
    store, key = CompileCache(tmp_path), make_key()
    store.get_or_compile(key, Compiler(key))
    CompileCache(tmp_path).get_or_compile(key, Compiler(key))
    assert messages(caplog) == []


def test_mlirgpu_log_cache_logs_disk_hits_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLIRGPU_LOG", "cache")
    caplog.set_level(logging.INFO, logger="mlirgpu")
    key = make_key()
    CompileCache(tmp_path).get_or_compile(key, Compiler(key))
    CompileCache(tmp_path).get_or_compile(key, Compiler(key))
    assert [m.split(" [")[0] for m in messages(caplog)] == ["mlirgpu: loaded mod.kernel"]


def test_log_lines_reach_stderr_when_nothing_handles_them(tmp_path, monkeypatch, capsys):
    """A notebook user who sets MLIRGPU_LOG and configures no logging sees the lines."""
    monkeypatch.setenv("MLIRGPU_LOG", "compile")
    monkeypatch.setattr(log.logger, "propagate", False)
    monkeypatch.setattr(log.logger, "handlers", [])
    monkeypatch.setattr(log.logger, "level", logging.NOTSET)
    CompileCache(tmp_path, disk=False).get_or_compile(make_key(), Compiler(make_key()))
    assert "mlirgpu: compiling mod.kernel [" in capsys.readouterr().err


# --------------------------------------------------------------------------- corrupt entries

def _truncate(data):
    return data[:len(data) // 2]


def _flip_payload_byte(data):
    return data[:-3] + bytes([data[-3] ^ 0x40]) + data[-2:]


def _wrong_magic(data):
    return b"NOTMLIR\x00" + data[8:]


def _wrong_format_version(data):
    return data[:8] + struct.pack("<I", 99) + data[12:]


def _rewrite_metadata(edit):
    def rewrite(data):
        (length,) = struct.unpack_from("<I", data, 12)
        metadata = json.loads(data[16:16 + length])
        edit(metadata)
        text = json.dumps(metadata).encode()
        return data[:12] + struct.pack("<I", len(text)) + text + data[16 + length:]
    return rewrite


def _garbage_json(data):
    (length,) = struct.unpack_from("<I", data, 12)
    return data[:16] + b"{not json" + b"!" * (length - 9) + data[16 + length:]


@pytest.mark.parametrize("damage, problem", [
    (_truncate, "truncated"),
    (lambda data: data[:10], "truncated header"),
    (lambda data: b"", "truncated header"),
    (_flip_payload_byte, "payload sha256 mismatch"),
    (lambda data: data + b"extra", "payload of"),
    (_wrong_magic, "bad magic bytes"),
    (_wrong_format_version, "format version 99"),
    (_rewrite_metadata(lambda m: m["versions"].update(mlirgpu="0.0.1")), "versions differ (mlirgpu)"),
    (_rewrite_metadata(lambda m: m["versions"].update(cuda="11.8")), "versions differ (cuda)"),
    (_rewrite_metadata(lambda m: m["key"][-1].__setitem__(1, "opt_level=0")), "key parts differ"),
    (_rewrite_metadata(lambda m: m.pop("payload_sha256")), "unreadable metadata"),
    (_garbage_json, "unreadable metadata"),
])
def test_a_corrupt_entry_is_recompiled(tmp_path, log_compile, damage, problem):
    key = make_key()
    CompileCache(tmp_path).get_or_compile(key, Compiler(key))
    path = CompileCache(tmp_path).path(key)
    path.write_bytes(damage(path.read_bytes()))

    store, compile_fn = CompileCache(tmp_path), Compiler(key)
    assert store.get_or_compile(key, compile_fn) == b"cubin:" + key.digest.encode()
    assert compile_fn.calls == 1
    assert store.info() == CacheInfo(hits=0, disk_hits=0, misses=1, compiles=1, disk_writes=1, corrupt=1)
    corrupt = [m for m in messages(log_compile) if "corrupt entry" in m]
    assert len(corrupt) == 1 and problem in corrupt[0] and corrupt[0].endswith("recompiling")
    assert str(path) in corrupt[0]

    # The entry was overwritten with a good one.
    later, compile_fn = CompileCache(tmp_path), Compiler(key)
    later.get_or_compile(key, compile_fn)
    assert compile_fn.calls == 0 and later.info().disk_hits == 1


def test_an_unreadable_entry_is_a_miss(tmp_path, log_compile):
    key = make_key()
    store = CompileCache(tmp_path)
    store.path(key).parent.mkdir(parents=True, exist_ok=True)
    store.path(key).mkdir()              # a directory where the entry should be: reading fails
    compile_fn = Compiler(key)
    assert store.get_or_compile(key, compile_fn) == compile_fn()
    assert any("cannot read cache entry" in m for m in messages(log_compile))


# --------------------------------------------------------------------------- several processes

RACER = """
    import json, os, sys, time
    from mlirgpu.compiler.cache import CacheKey, CompileCache
    base, index = sys.argv[1], sys.argv[2]
    directory = os.path.join(base, "cache")
    key = CacheKey({"kernel": "mod.race", "generics": "M=1024"})
    def compile_fn():
        # Every racer is inside compile_fn before any returns: all of them write.
        open(os.path.join(base, f"compiling-{index}"), "w").close()
        deadline = time.monotonic() + 60
        while len([n for n in os.listdir(base) if n.startswith("compiling-")]) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(0.2)
        return bytes(range(256)) * 64
    open(os.path.join(base, f"ready-{index}"), "w").close()
    while not os.path.exists(os.path.join(base, "go")):
        time.sleep(0.001)
    store = CompileCache(directory)
    payload = store.get_or_compile(key, compile_fn)
    assert payload == bytes(range(256)) * 64
    print(json.dumps(store.info()._asdict()))
"""


def test_processes_compiling_the_same_key_at_once_all_succeed(tmp_path):
    directory = tmp_path / "cache"
    racers = [run_python(RACER, tmp_path, i) for i in range(4)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{i}").exists() for i in range(4)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in racers), "a racer died"
        time.sleep(0.01)
    (tmp_path / "go").touch()
    infos = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        infos.append(json.loads(out))
    assert all(info["compiles"] == info["disk_writes"] == 1 and info["corrupt"] == 0 for info in infos)

    assert [p.suffix for p in directory.iterdir()] == [".mgcache"]   # one entry, no temporary files left
    key = CacheKey({"kernel": "mod.race", "generics": "M=1024"})
    store = CompileCache(directory)
    payload = store.get_or_compile(key, lambda: pytest.fail("the entry should be valid"))
    assert payload == bytes(range(256)) * 64


def test_threads_compile_a_key_once(tmp_path):
    import threading

    key, calls = make_key(), []

    def compile_fn():
        calls.append(1)
        time.sleep(0.1)
        return b"once"

    store = CompileCache(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.get_or_compile(key, compile_fn)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [b"once"] * 8 and len(calls) == 1
    assert store.info().hits == 7 and store.info().misses == 1


# --------------------------------------------------------------------------- where the disk cache lives

def test_an_unwritable_directory_keeps_the_cache_in_memory(tmp_path, monkeypatch, log_compile):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(blocker / "cache"))
    store = CompileCache()
    assert store.directory == blocker / "cache"
    keys = [make_key(chip=chip) for chip in ("sm_80", "sm_90a")]
    for key in keys + keys:
        assert store.get_or_compile(key, Compiler(key)) == b"cubin:" + key.digest.encode()
    assert store.info() == CacheInfo(hits=2, disk_hits=0, misses=2, compiles=2, disk_writes=0, corrupt=0)
    assert len([m for m in messages(log_compile) if "cannot write the compile cache" in m]) == 1


def test_the_directory_comes_from_mlirgpu_cache_dir_or_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(tmp_path / "here"))
    assert CompileCache().directory == tmp_path / "here"
    monkeypatch.delenv("MLIRGPU_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CompileCache().directory == tmp_path / "home" / ".cache" / "mlirgpu"


def test_the_directory_is_created_on_the_first_write(tmp_path):
    store = CompileCache(tmp_path / "deep" / "er")
    assert not (tmp_path / "deep").exists()
    store.get_or_compile(make_key(), Compiler(make_key()))
    assert store.path(make_key()).is_file()


def test_disk_false_writes_nothing(tmp_path):
    store = CompileCache(tmp_path, disk=False)
    store.get_or_compile(make_key(), Compiler(make_key()))
    assert list(tmp_path.iterdir()) == [] and store.info().disk_writes == 0


def test_other_versions_keep_their_own_entries(tmp_path, monkeypatch):
    key = make_key()
    store = CompileCache(tmp_path)
    store.get_or_compile(key, lambda: b"built by 0.1.0")
    ours = store.path(key)
    monkeypatch.setattr(cache, "_environment", dict(cache.environment(), mlirgpu="9.9.9"))
    other = CompileCache(tmp_path)
    assert other.path(key) != ours
    assert other.get_or_compile(key, lambda: b"built by 9.9.9") == b"built by 9.9.9"
    assert other.info().corrupt == 0
    monkeypatch.undo()
    assert CompileCache(tmp_path).get_or_compile(key, lambda: pytest.fail("recompiled")) == b"built by 0.1.0"


def test_clear(tmp_path):
    key = make_key()
    store = CompileCache(tmp_path)
    store.get_or_compile(key, Compiler(key))
    (tmp_path / "unrelated.txt").write_text("kept")
    store.clear()
    store.get_or_compile(key, Compiler(key))
    assert store.info().disk_hits == 1
    store.clear(memory=True, disk=True)
    assert [p.name for p in tmp_path.iterdir()] == ["unrelated.txt"]
    compile_fn = Compiler(key)
    store.get_or_compile(key, compile_fn)
    assert compile_fn.calls == 1


# --------------------------------------------------------------------------- compile_fn

def test_a_failed_compile_stores_nothing(tmp_path):
    store, key = CompileCache(tmp_path), make_key()

    def fails():
        raise mlirgpu.CompileError("ptxas said no")

    with pytest.raises(mlirgpu.CompileError, match="ptxas said no"):
        store.get_or_compile(key, fails)
    assert list(tmp_path.iterdir()) == []
    compile_fn = Compiler(key)
    store.get_or_compile(key, compile_fn)
    assert compile_fn.calls == 1
    assert store.info() == CacheInfo(hits=0, disk_hits=0, misses=2, compiles=1, disk_writes=1, corrupt=0)


def test_compile_fn_must_return_bytes(tmp_path):
    store = CompileCache(tmp_path)
    with pytest.raises(TypeError, match="compile_fn must return bytes, not str"):
        store.get_or_compile(make_key(), lambda: "ptx text")
    assert store.get_or_compile(make_key(), lambda: bytearray(b"ok")) == b"ok"


def test_get_or_compile_takes_a_cache_key(tmp_path):
    with pytest.raises(TypeError, match="CacheKey"):
        CompileCache(tmp_path).get_or_compile({"kernel": "k"}, lambda: b"")


# --------------------------------------------------------------------------- the process-wide cache

def test_default_cache_info_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIRGPU_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_default", None)
    store = cache.default_cache()
    assert cache.default_cache() is store and store.directory == tmp_path
    assert cache.cache_info() == CacheInfo(0, 0, 0, 0, 0, 0)
    key = make_key()
    store.get_or_compile(key, Compiler(key))
    store.get_or_compile(key, Compiler(key))
    cache.cache_clear()
    store.get_or_compile(key, Compiler(key))
    cache.cache_clear(memory=True, disk=True)
    store.get_or_compile(key, Compiler(key))
    assert cache.cache_info() == CacheInfo(hits=1, disk_hits=1, misses=3, compiles=2, disk_writes=2,
                                           corrupt=0)


# --------------------------------------------------------------------------- keys

def test_key_digest_is_stable_and_ordered():
    parts = {"kernel": "mod.k", "generics": "M=1"}
    assert CacheKey(parts).digest == CacheKey(dict(parts)).digest
    assert len(CacheKey(parts).digest) == 64
    assert CacheKey(parts).digest != CacheKey({"generics": "M=1", "kernel": "mod.k"}).digest
    # Pinned: a change to the encoding orphans every entry on disk, so make it on purpose.
    assert CacheKey(parts).digest == "01af709198617faa59006abacdfd7da8018695e5f473360c2d539aab40d31d89"


@pytest.mark.parametrize("one, other", [
    ({"ab": "c"}, {"a": "bc"}),
    ({"a": "b=c"}, {"a=b": "c"}),
    ({"a": "b", "c": "d"}, {"a": "b1:c1:d"}),
    ({"a": ""}, {"a": "", "b": ""}),
    ({"a": "é"}, {"a": "e"}),
])
def test_key_digests_do_not_collide(one, other):
    assert CacheKey(one).digest != CacheKey(other).digest
    assert CacheKey(one) != CacheKey(other)


def test_details_are_not_part_of_the_key():
    one = CacheKey({"globals": "abc"}, details={"globals": {"TILE": "16"}})
    other = CacheKey({"globals": "abc"}, details={"globals": {"TILE": "32"}})
    assert one == other and hash(one) == hash(other) and one.digest == other.digest
    assert one.details["globals"] == {"TILE": "16"}


def test_keys_are_immutable_and_checked():
    key = CacheKey({"kernel": "k"})
    with pytest.raises(AttributeError):
        key.digest = "x"
    with pytest.raises(TypeError):
        key.parts["kernel"] = "other"
    with pytest.raises(TypeError, match="str to str"):
        CacheKey({"generics": 256})
    with pytest.raises(TypeError, match="str to str"):
        CacheKey({"": "x"})
    with pytest.raises(ValueError, match="not a part"):
        CacheKey({"kernel": "k"}, details={"globals": {}})
    assert key.kernel == "k" and CacheKey({"chip": "sm_80"}).kernel == ""
    assert repr(key) == "CacheKey({'kernel': 'k'})"


# --------------------------------------------------------------------------- fingerprints

def helper(x):
    return x * 2


def other_helper(x):
    return x * 3


SUPPORTED = [
    None, True, False, 0, 1, -7, 2 ** 70, 1.0, 1.5, -0.0, float("inf"), 1 + 2j, "tile", "", b"bytes",
    (), (1,), (1, 2), [1, 2], [], {"a": 1, "b": (2.0, None)}, {},
    np.float32(1.5), np.float64(1.5), np.int32(1), np.int64(1), np.bool_(True), np.uint8(255),
    np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(6, dtype=np.int64), np.zeros(0),
    np.dtype("float32"), np.dtype("int8"), mlirgpu.f32, mlirgpu.f16, mlirgpu.index,
    helper, other_helper, math.sqrt, np.sqrt, np.float32, int, math, np,
]


def test_fingerprints_are_stable_and_distinct():
    prints = [fingerprint(v) for v in SUPPORTED]
    assert prints == [fingerprint(v) for v in SUPPORTED]
    assert all(isinstance(p, str) for p in prints)
    assert len(set(prints)) == len(prints), [p for p in prints if prints.count(p) > 1]


def test_fingerprints_follow_values_not_identity():
    assert fingerprint([1, (2, "x")]) == fingerprint([1, (2, "x")])
    assert fingerprint({"b": 2, "a": 1}) == fingerprint({"a": 1, "b": 2})
    assert fingerprint(np.ones(3)) == fingerprint(np.ones(3))
    assert fingerprint(np.ones(3)) != fingerprint(np.ones(4))
    a = np.ones(3)
    b = a.copy()
    b[1] = 2
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(np.ones((2, 3))) != fingerprint(np.ones((3, 2)))
    assert fingerprint(np.ones(3, np.float32)) != fingerprint(np.ones(3, np.float64))
    transposed = np.arange(6).reshape(2, 3).T
    assert fingerprint(transposed) == fingerprint(np.ascontiguousarray(transposed))
    assert fingerprint(mlirgpu.dtype(np.float32)) == fingerprint(mlirgpu.f32)


@pytest.mark.parametrize("one, other", [
    (1, 1.0), (1, True), (0, False), (1, np.int64(1)), (1.5, np.float64(1.5)),
    (np.float32(1.5), np.float64(1.5)),
    ((1, 2), [1, 2]), ("1", 1), (None, "None"), (0.0, -0.0), (b"x", "x"), ((1,), 1),
])
def test_fingerprints_tell_types_apart(one, other):
    assert fingerprint(one) != fingerprint(other)


def test_a_function_fingerprint_follows_its_code():
    def make(scale):
        def f(x):
            return x * scale
        return f

    namespace = {}
    exec("def g(x):\n    return x + 1\n", namespace)
    same = {}
    exec("\n\n\ndef g(x):\n    return x + 1\n", same)
    changed = {}
    exec("def g(x):\n    return x + 2\n", changed)
    assert fingerprint(namespace["g"]) == fingerprint(same["g"])   # positions do not matter
    assert fingerprint(namespace["g"]) != fingerprint(changed["g"])
    assert fingerprint(helper) != fingerprint(other_helper)
    assert fingerprint(make(1)) == fingerprint(make(2))     # closures are not followed (documented)
    assert fingerprint(helper).startswith("function test_cache.helper code:")


FINGERPRINT_CHILD = """
    import math, numpy as np, mlirgpu
    from mlirgpu.compiler.cache import fingerprint
    def helper(x):
        return {"k": [x, 1.5, "s"]}, lambda y: y * 2
    print(fingerprint([1, 2.5, "a", None, (np.float32(2.0), mlirgpu.f32, np.ones(4)), math.sqrt]))
    print(fingerprint(helper).split(" code:")[1])
"""


def test_fingerprints_are_the_same_in_another_process():
    """Nothing hash-randomized or refcount-dependent goes into a fingerprint."""
    outputs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PYTHONHASHSEED=seed)
        outputs.add(subprocess.run([sys.executable, "-c", textwrap.dedent(FINGERPRINT_CHILD)], env=env,
                                   capture_output=True, text=True, check=True, timeout=120).stdout)
    assert len(outputs) == 1


class Opaque:
    pass


def _generator():
    yield 1


@pytest.mark.parametrize("value", [
    object(), Opaque(), {1, 2}, frozenset(), _generator(), Opaque().__init__, Compiler(None).__call__,
    "bound".upper, [1, object()],
    {"a": {1}}, np.array(["a", "b"]), np.array([None], dtype=object),
    np.zeros(fingerprints.MAX_ARRAY_BYTES // 8 + 1),
    np.ma.masked_array([1.0]), bytearray(b"x"),
], ids=lambda v: type(v).__name__)
def test_unsupported_values_raise_type_error(value):
    with pytest.raises(TypeError, match="cannot fingerprint"):
        fingerprint(value)


def test_a_list_that_contains_itself_raises_type_error():
    cycle = [1]
    cycle.append(cycle)
    with pytest.raises(TypeError, match="contains itself"):
        fingerprint(cycle)


def test_fingerprint_globals():
    digest, details = fingerprint_globals({"TILE": 16, "SCALE": 0.5, "f": helper})
    assert details["TILE"] == "16" and details["SCALE"] == "0.5"
    assert details["f"].startswith("function test_cache.helper code:")
    assert digest == fingerprint_globals({"f": helper, "SCALE": 0.5, "TILE": 16})[0]
    assert digest != fingerprint_globals({"TILE": 32, "SCALE": 0.5, "f": helper})[0]
    assert fingerprint_globals({"A": 1, "B": 2})[0] != fingerprint_globals({"A": 2, "B": 1})[0]
    assert fingerprint_globals({})[0] == fingerprint_globals({})[0]
    long = fingerprint_globals({"T": tuple(range(100))})[1]["T"]
    assert len(long) == 80 and long.endswith("...")
    with pytest.raises(TypeError, match="global 'lock': cannot fingerprint"):
        fingerprint_globals({"TILE": 16, "lock": object()})


# --------------------------------------------------------------------------- what entries record

def test_environment():
    env = cache.environment()
    assert set(env) == {"mlirgpu", "mlirgpu_build", "mlir", "mlir_build", "cuda"}
    assert env["mlirgpu"] == mlirgpu.__version__
    assert env["mlir"].startswith("22")
    assert env == cache.environment()


def test_cuda_version_sources(tmp_path):
    assert toolkit.cuda_version(str(tmp_path)) == "unknown"
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda.h").write_text("#pragma once\n#define CUDA_VERSION 12080\n")
    assert toolkit.cuda_version(str(tmp_path)) == "12.8"
    (tmp_path / "dist-info" / "nvidia_cuda_nvcc-13.0.88.dist-info").mkdir(parents=True)
    assert toolkit.cuda_version(str(tmp_path)) == "13.0.88"
    (tmp_path / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}))
    assert toolkit.cuda_version(str(tmp_path)) == "12.4.1"


def test_an_entry_records_key_and_versions(tmp_path):
    key = make_key()
    store = CompileCache(tmp_path)
    store.get_or_compile(key, lambda: b"\x7fELF payload")
    data = store.path(key).read_bytes()
    magic, version, length = struct.unpack_from("<8sII", data)
    assert magic == cache.MAGIC and version == cache.FORMAT_VERSION
    metadata = json.loads(data[16:16 + length])
    assert metadata["key"] == [list(p) for p in key.parts.items()]
    assert metadata["versions"] == cache.environment()
    assert metadata["payload_length"] == 12
    assert data[16 + length:] == b"\x7fELF payload"


# --------------------------------------------------------------------------- end to end

def test_the_naive_sgemm_cubin_through_the_cache(tmp_path):
    from support.sgemm_ir import build_sgemm_module

    module = build_sgemm_module(256, 128, 256)
    key = CacheKey({"kernel": "sgemm_naive.sgemm_naive", "generics": "M=256,K=128,N=256,dtype=f32",
                    "chip": "sm_90a", "options": "opt_level=3"})
    compiles = []

    def compile_fn():
        compiles.append(1)
        return mlirgpu.compile_cubin(module, chip="sm_90a")

    store = CompileCache(tmp_path)
    cubin = store.get_or_compile(key, compile_fn)
    assert cubin[:4] == b"\x7fELF"
    assert store.get_or_compile(key, compile_fn) is cubin
    assert CompileCache(tmp_path).get_or_compile(key, compile_fn) == cubin
    assert len(compiles) == 1


x = np.zeros(100_000, np.float32)   # a global named like the `x` of thread_idx.x
SCALE = 3


def test_the_key_holds_the_globals_a_kernel_loads_not_its_attribute_names():
    import mlirgpu as mg
    from mlirgpu.runtime.compiled import read_values

    N = mg.generics("N")

    @mg.kernel
    def scale(y: mg.memref[N, mg.f32]):
        i = mg.thread_idx.x
        if i < N:
            y[i] = y[i] * SCALE

    values = read_values(scale.function)
    assert "SCALE" in values and "x" not in values      # `x` is an attribute here, not the array
    mg.cache_clear(memory=True, disk=False)
    assert scale[64].cache_key("sm_90a") is not None     # the 400 KB array never needs a fingerprint


def test_globals_read_from_bytecode_are_those_dis_shows():
    import dis
    from mlirgpu.frontend.rewrite import code_objects
    from mlirgpu.runtime.compiled import _loaded_globals

    def shown(code):
        return {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}

    # More than 256 names: their loads need EXTENDED_ARG prefixes.
    source = ("def many():\n" + "".join(f"    g{i}\n" for i in range(300)) +
              "    return [g299 + x for x in g1 if ROWS]\n")
    scope = {}
    exec(compile(source, "many.py", "exec"), scope)
    codes = [compile("\n".join(f"a{i} = b{i}.x" for i in range(300)), "module.py", "exec")]
    for function in (scope["many"], fingerprint, CompileCache.get_or_compile, json.dumps, textwrap.dedent):
        codes += code_objects(function.__code__)
    for code in codes:
        assert _loaded_globals(code) == shown(code), code.co_name
    many = set().union(*map(_loaded_globals, code_objects(scope["many"].__code__)))
    assert {"g0", "g299", "ROWS"} <= many and "x" not in many and "b299" in _loaded_globals(codes[0])


KERNEL_FILE = """
import mlirgpu as mg

N = mg.generics("N")
SCALE = {scale}


@mg.kernel
def scale(x: mg.memref[N, mg.f32]):
    i = mg.thread_idx.x
    if i < N:
        x[i] = x[i] * SCALE{extra}
"""

KERNEL_CHILD = """
    import hashlib, sys
    sys.path.insert(0, sys.argv[1])
    import mlirgpu as mg
    from mlirgpu.runtime.compiled import CompiledModule
    from mlirgpu.runtime.kernel import Specialization

    def refuse(*args, **kwargs):
        raise AssertionError("a disk hit traced or lowered the kernel")

    if sys.argv[2] == "hit":
        Specialization.trace = CompiledModule.compilation = refuse
    import kern
    image = kern.scale[64].image("sm_90a")
    info = mg.cache_info()
    print(info.disk_hits, info.compiles, hashlib.sha256(image).hexdigest()[:16])
"""


def test_a_new_process_loads_a_kernel_from_disk_without_tracing_and_misses_on_any_change(tmp_path):
    (tmp_path / "cache").mkdir()
    env = {"MLIRGPU_CACHE_DIR": str(tmp_path / "cache")}

    def run(expect, **file):
        (tmp_path / "kern.py").write_text(KERNEL_FILE.format(**{"scale": 3, "extra": "", **file}))
        out, err = run_python(KERNEL_CHILD, tmp_path, expect, env=dict(os.environ, **env)).communicate(timeout=120)
        assert out.strip(), err
        hits, compiles, image = out.split()
        assert (int(hits), int(compiles)) == ((1, 0) if expect == "hit" else (0, 1)), (expect, file)
        return image

    first = run("compile")
    assert run("hit") == first
    assert run("compile", scale=4) != first              # a global the kernel loads
    assert run("compile", extra=" + 1.0") != first       # its source
    assert run("hit", extra=" + 1.0") != first


def test_layouts_a_kernel_closes_over_are_part_of_its_key():
    import mlirgpu as mg
    from mlirgpu.layout import wgmma

    def make(tile):
        @mg.kernel
        def first_offsets(out: mg.memref[8, mg.i32]):
            for k in mg.static_range(8):
                out[k] = tile(1, k)
        return first_offsets

    # Kernels of one source over different layouts (each swizzle's tile): their own keys, their own results.
    kernels = {s: make(wgmma.tile_layout((64, 64), 2, s)) for s in ("32B", "64B", "128B")}
    keys = {kernel[()].cache_key("sm_90a").digest for kernel in kernels.values()}
    assert len(keys) == 3
    assert make(wgmma.tile_layout((64, 64), 2, "32B"))[()].cache_key("sm_90a").digest in keys


# --------------------------------------------------------------------------- what the cache trusts

@pytest.fixture
def deadline():
    """Fail a lookup that hangs (a FIFO read) instead of blocking the run."""
    def expire(signum, frame):
        raise TimeoutError("the cache lookup did not return")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _good_entry(key):
    return cache._encode_entry(key, b"cubin:" + key.digest.encode(), cache.environment())


def _fifo(path, tmp_path, key):
    os.mkfifo(path, 0o600)


def _symlink_to_dev_zero(path, tmp_path, key):
    os.symlink("/dev/zero", path)


def _symlink_to_a_valid_entry(path, tmp_path, key):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / path.name).write_bytes(_good_entry(key))
    os.chmod(elsewhere / path.name, 0o600)
    os.symlink(elsewhere / path.name, path)


def _deeply_nested_metadata(path, tmp_path, key):
    metadata = b"[" * 200_000 + b"]" * 200_000
    path.write_bytes(struct.pack("<8sII", cache.MAGIC, cache.FORMAT_VERSION, len(metadata)) + metadata)


def _oversized(path, tmp_path, key):
    path.write_bytes(_good_entry(key))
    os.truncate(path, cache.MAX_ENTRY_BYTES + 1)    # sparse: no disk space used


def _mode(mode):
    def plant(path, tmp_path, key):
        path.write_bytes(_good_entry(key))
        os.chmod(path, mode)
    return plant


def _owned_by_another_user(path, tmp_path, key):
    path.write_bytes(_good_entry(key))
    os.chmod(path, 0o600)
    os.chown(path, OTHER_UID, OTHER_UID)


OTHER_UID = 12345
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")


@pytest.mark.parametrize("plant, problem, corrupt", [
    (_fifo, "not a regular file", 0),
    (_symlink_to_dev_zero, "a symbolic link", 0),
    (_symlink_to_a_valid_entry, "a symbolic link", 0),
    (_deeply_nested_metadata, "unreadable metadata", 1),
    (_oversized, f"{cache.MAX_ENTRY_BYTES + 1} bytes, more than {cache.MAX_ENTRY_BYTES}", 0),
    (_mode(0o620), "group- or world-writable (mode 620)", 0),
    (_mode(0o602), "group- or world-writable (mode 602)", 0),
    pytest.param(_owned_by_another_user, f"owned by uid {OTHER_UID}", 0, marks=as_root),
])
def test_an_untrusted_entry_is_a_miss_and_is_replaced(tmp_path, log_compile, deadline, plant, problem, corrupt):
    key = make_key()
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    path = CompileCache(directory).path(key)
    plant(path, tmp_path, key)

    store, compile_fn = CompileCache(directory), Compiler(key)
    assert store.get_or_compile(key, compile_fn) == b"cubin:" + key.digest.encode()
    assert compile_fn.calls == 1
    assert store.info() == CacheInfo(hits=0, disk_hits=0, misses=1, compiles=1, disk_writes=1, corrupt=corrupt)
    said = [m for m in messages(log_compile) if str(path) in m]
    assert len(said) == 1 and problem in said[0] and said[0].endswith("recompiling")

    # The compile replaced what was planted with a private regular file, which a new cache trusts.
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    later, compile_fn = CompileCache(directory), Compiler(key)
    assert later.get_or_compile(key, compile_fn) == b"cubin:" + key.digest.encode()
    assert compile_fn.calls == 0 and later.info().disk_hits == 1


def _chown_to_another_user(directory):
    os.chown(directory, OTHER_UID, OTHER_UID)


@pytest.mark.parametrize("share, problem", [
    (lambda d: os.chmod(d, 0o777), "group- or world-writable (mode 777)"),
    (lambda d: os.chmod(d, 0o1777), "group- or world-writable (mode 1777)"),
    (lambda d: os.chmod(d, 0o770), "group- or world-writable (mode 770)"),
    pytest.param(_chown_to_another_user, f"owned by uid {OTHER_UID}", marks=as_root),
])
def test_a_shared_directory_is_neither_read_nor_written(tmp_path, log_compile, deadline, share, problem):
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o700)
    keys = [make_key(chip=chip) for chip in ("sm_80", "sm_90a")]
    for key in keys:                     # well-formed entries another user planted
        path = CompileCache(directory).path(key)
        path.write_bytes(_good_entry(key))
        os.chmod(path, 0o600)
    planted = sorted(directory.iterdir())
    share(directory)

    store = CompileCache(directory)
    with pytest.warns(RuntimeWarning, match="not using the compile cache") as warned:
        for key in keys + keys:
            assert store.get_or_compile(key, Compiler(key)) == b"cubin:" + key.digest.encode()
        assert CompileCache(directory).get_or_compile(keys[0], Compiler(keys[0]))
    assert len(warned) == 1 and problem in str(warned[0].message)
    assert store.info() == CacheInfo(hits=2, disk_hits=0, misses=2, compiles=2, disk_writes=0, corrupt=0)
    said = [m for m in messages(log_compile) if "not using the compile cache" in m]
    assert len(said) == 1 and problem in said[0] and str(directory) in said[0]
    assert sorted(directory.iterdir()) == planted


def test_a_new_directory_and_its_entries_are_private(tmp_path):
    store = CompileCache(tmp_path / "deep" / "er")
    store.get_or_compile(make_key(), Compiler(make_key()))
    for made in (tmp_path / "deep", tmp_path / "deep" / "er"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path(make_key()).stat().st_mode) == 0o600


@pytest.mark.parametrize("plant", [_fifo, _symlink_to_dev_zero])
def test_a_new_process_compiles_past_an_entry_that_would_hang_it(tmp_path, plant):
    (tmp_path / "cache").mkdir(mode=0o700)
    env = dict(os.environ, MLIRGPU_CACHE_DIR=str(tmp_path / "cache"))
    (tmp_path / "kern.py").write_text(KERNEL_FILE.format(scale=3, extra=""))

    def run():
        out, err = run_python(KERNEL_CHILD, tmp_path, "compile", env=env).communicate(timeout=120)
        assert out.strip(), err
        return out.split()

    hits, compiles, image = run()
    entries = list((tmp_path / "cache").glob("*.mgcache"))
    assert (hits, compiles) == ("0", "1") and len(entries) == 1
    entries[0].unlink()
    plant(entries[0], tmp_path, None)
    assert run() == ["0", "1", image]
