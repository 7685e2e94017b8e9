"""The compilation cache: one cubin per specialization, in memory and on disk.

A specialization is named by a `CacheKey` (cache_key.py), an ordered set of
named string parts (kernel, source, globals, generics, chip, options; the
globals part is made by fingerprints.py). `CompileCache` answers
`get_or_compile(key, compile_fn)` from a dict first, then from a file under
MLIRGPU_CACHE_DIR (default ~/.cache/mlirgpu), and only then calls
`compile_fn`. Files are written atomically (temp file, fsync, os.replace), so
processes may share the directory without locks; each carries the key, the
versions of mlirgpu, MLIR and CUDA, and the payload's length and sha256, and a
file that does not match is recompiled and overwritten, never trusted.

Entries are code the process runs, so only a private directory is used: one
owned by this user and writable by no one else (created 0700), whose entries
are regular files of this user's, not group/world-writable, of at most
MAX_ENTRY_BYTES. Anything else is a miss and is recompiled.

With MLIRGPU_LOG=compile each compile is logged with what changed since the
kernel's previous compile; with MLIRGPU_LOG=cache, disk hits, corrupt or
refused entries and a cache directory that cannot be written or is not
trusted (log.py). See docs/design/compile_cache.md ("Trust" for what is).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import struct
import threading
import warnings
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path

from .. import _mlirgpu
from .cache_key import CacheKey, label, recompile_reason
# Re-exported: the cache's documented API names them here.
from .fingerprints import fingerprint, fingerprint_globals
from .log import log

__all__ = ["CacheInfo", "CacheKey", "CompileCache", "cache_clear", "cache_info", "default_cache", "environment",
           "fingerprint", "fingerprint_globals"]

# ---------------------------------------------------------------------------
# The environment an entry was compiled in
# ---------------------------------------------------------------------------

_environment = None
_environment_lock = threading.Lock()


def _package_build():
    """sha256 (16 hex) of the names, sizes and modification times of
    mlirgpu's Python sources and extension: __version__ stays put between
    development builds, the code that traces and lowers does not. (Stat, not
    contents, as Python's own .pyc check does: a new process reads this before
    its first cache hit, so the walk is os.scandir's, without pathlib.)"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the mlirgpu package
    files = []
    folders = [""]
    while folders:
        folder = folders.pop()
        with os.scandir(os.path.join(root, folder)) as entries:
            for entry in entries:
                name = os.path.join(folder, entry.name)
                if entry.is_dir():
                    if entry.name != "__pycache__":
                        folders.append(name)
                elif entry.name.endswith((".py", ".so")) and entry.is_file():
                    stat = entry.stat()
                    files.append(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0")
    return hashlib.sha256("".join(sorted(files)).encode()).hexdigest()[:16]


def _mlir_version():
    """"22.1" from the libMLIR.so.* this process loaded, plus size and mtime
    of libMLIR and libLLVM (a new snapshot of the same version changes them).
    An extension with MLIR linked in statically loads neither: "22" and
    "unknown", its own size and mtime being in mlirgpu_build already."""
    found = {}
    for path in _mlirgpu.shared_objects():
        for lib in ("libMLIR.so", "libLLVM.so"):
            if lib not in found and os.path.basename(path).startswith(lib):
                found[lib] = os.path.realpath(path)
    version = "22"
    mlir = found.get("libMLIR.so", "")
    if os.path.basename(mlir).startswith("libMLIR.so."):
        version = os.path.basename(mlir)[len("libMLIR.so."):]
    builds = []
    for lib in ("libMLIR.so", "libLLVM.so"):
        try:
            stat = os.stat(found[lib])
            builds.append(f"{stat.st_size}:{stat.st_mtime_ns}")
        except (KeyError, OSError):
            builds.append("unknown")
    return version, ",".join(builds)


def environment() -> dict[str, str]:
    """The versions every entry records and must match to be used (computed
    once per process): mlirgpu, mlirgpu_build, mlir, mlir_build, cuda."""
    global _environment
    with _environment_lock:
        if _environment is None:
            from .._version import __version__
            from . import toolkit

            mlir, mlir_build = _mlir_version()
            # Without ptxas an entry holds PTX, not a cubin: never the same entry.
            cuda = toolkit.PTXAS.version() if toolkit.PTXAS else "none: PTX for the driver's JIT"
            _environment = {"mlirgpu": __version__,
                            "mlirgpu_build": _package_build(), "mlir": mlir, "mlir_build": mlir_build,
                            "cuda": cuda}
        return dict(_environment)


# ---------------------------------------------------------------------------
# Disk entries
# ---------------------------------------------------------------------------

MAGIC = b"MLIRGPU\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII")   # magic, format version, length of the JSON metadata
_SUFFIX = ".mgcache"
_MAX_METADATA = 1 << 20
# Bound on an entry's size: far above any cubin, far below what a read may cost.
MAX_ENTRY_BYTES = 256 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _encode_entry(key, payload, env):
    metadata = json.dumps({"key": list(key.parts.items()), "versions": env,
                           "payload_length": len(payload),
                           "payload_sha256": hashlib.sha256(payload).hexdigest()},
                          sort_keys=True).encode()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(metadata)) + metadata + payload


def _decode_entry(data, key, env):
    """(payload, None) for a valid entry of key, else (None, what is wrong)."""
    if len(data) < _HEADER.size:
        return None, "truncated header"
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        return None, "bad magic bytes"
    if version != FORMAT_VERSION:
        return None, f"format version {version}, expected {FORMAT_VERSION}"
    if length > _MAX_METADATA or _HEADER.size + length > len(data):
        return None, "truncated metadata"
    try:
        metadata = json.loads(data[_HEADER.size:_HEADER.size + length])
        stored_key = [tuple(pair) for pair in metadata["key"]]
        versions, size, sha = metadata["versions"], metadata["payload_length"], metadata["payload_sha256"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None, "unreadable metadata"
    if stored_key != list(key.parts.items()):
        return None, "key parts differ"
    if versions != env:
        changed = sorted(set(env) | set(versions if isinstance(versions, dict) else {}))
        changed = [n for n in changed if not isinstance(versions, dict) or versions.get(n) != env.get(n)]
        return None, "versions differ (" + ", ".join(changed) + ")"
    payload = data[_HEADER.size + length:]
    if len(payload) != size:
        return None, f"payload of {len(payload)} bytes, expected {size}"
    if hashlib.sha256(payload).hexdigest() != sha:
        return None, "payload sha256 mismatch"
    return bytes(payload), None


def read_private_file(path, max_bytes=MAX_ENTRY_BYTES):
    """(bytes, None) of the file at path (a cache entry, an autotuner's
    choices), (None, None) if there is none, else (None, why it is refused):
    not a regular file of this user's that no one else may write, or more
    than max_bytes. One open and one fstat: no symlink is followed and no
    FIFO or device is waited on or read."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None, "a symbolic link"
        return None, str(error)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_uid != os.geteuid():
            return None, f"owned by uid {st.st_uid}"
        if st.st_mode & 0o022:
            return None, f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
        if st.st_size > max_bytes:
            return None, f"{st.st_size} bytes, more than {max_bytes}"
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as error:
        return None, str(error)
    finally:
        os.close(fd)
    if len(data) > max_bytes:     # it grew after the fstat
        return None, f"more than {max_bytes} bytes"
    return data, None


def write_private_file(directory, path, data):
    """Writes data to path in directory (made 0700 where missing) as a file
    of mode 0600, atomically (a temporary file, fsync, os.replace): readers
    see the old file or the new one. False, writing nothing, where the
    directory is not trusted; OSError where writing fails."""
    _make_private_directory(directory)
    if directory_problem(directory) is not None:
        return False                    # logged and warned once by the check
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        with os.fdopen(os.open(temp, _WRITE_FLAGS, 0o600), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except OSError:
        try:
            temp.unlink()
        except OSError:
            pass   # never made
        raise
    return True


# Directory -> why it is not trusted (None: trusted); checked once per process.
_directory_problems = {}
_directory_lock = threading.Lock()


def directory_problem(directory):
    """Why directory must not hold this user's entries, else None; "missing"
    (not remembered) while it does not exist. Logged and warned once."""
    name = os.path.abspath(directory)
    with _directory_lock:
        if name in _directory_problems:
            return _directory_problems[name]
        try:
            st = os.stat(name)
        except OSError:
            return "missing"
        problem = None
        if not stat.S_ISDIR(st.st_mode):
            problem = "not a directory"
        elif st.st_uid != os.geteuid():
            problem = f"owned by uid {st.st_uid}, not {os.geteuid()}"
        elif st.st_mode & 0o022:
            problem = f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
        _directory_problems[name] = problem
    if problem is not None:
        message = (f"mlirgpu: not using the compile cache in {name}: it is {problem}, so another user "
                   "could plant kernels in it; compiling without a disk cache")
        log(("cache", "compile"), message)
        # Every run now recompiles: say so even without MLIRGPU_LOG.
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return problem


def _make_private_directory(directory):
    """directory and its missing parents, each created 0700."""
    missing = []
    path = Path(directory)
    while not path.exists():
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:     # another process made it first
            pass


# ---------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------

CacheInfo = namedtuple("CacheInfo", "hits disk_hits misses compiles disk_writes corrupt")
CacheInfo.__doc__ = """Counters of a CompileCache. hits: answered from memory;
misses: not in memory (then answered from disk, counted in disk_hits, or
compiled); compiles: compile_fn calls that returned; disk_writes: entries
written; corrupt: disk entries found invalid (and recompiled)."""


def default_directory() -> Path:
    return Path(os.environ.get("MLIRGPU_CACHE_DIR") or Path.home() / ".cache" / "mlirgpu")


class CompileCache:
    """Compiled payloads (bytes) by CacheKey, in a dict and in `directory`
    (default: $MLIRGPU_CACHE_DIR, else ~/.cache/mlirgpu; created on the first
    write). With disk=False, or where the directory cannot be created or
    written, the cache keeps to memory."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, disk: bool = True) -> None:
        self.directory = Path(directory) if directory is not None else default_directory()
        self.disk = bool(disk)
        self._memory = {}
        self._last = {}                 # kernel name -> the CacheKey it was last looked up with
        self._lock = threading.Lock()   # counters, _last, _key_locks
        self._key_locks = {}            # digest -> Lock: one compile per key per process
        self._counts = dict.fromkeys(CacheInfo._fields, 0)
        self._write_failed = False

    def __repr__(self):
        where = str(self.directory) if self.disk else "memory only"
        return f"CompileCache({where!r}, {len(self._memory)} entries)"

    def _count(self, field):
        with self._lock:
            self._counts[field] += 1

    def info(self) -> CacheInfo:
        """A CacheInfo of this cache's counters."""
        with self._lock:
            return CacheInfo(**self._counts)

    def path(self, key: CacheKey) -> Path:
        """The file that holds key's entry. Its name covers the environment
        too, so installations of different versions share a directory
        without overwriting each other's entries."""
        env = json.dumps(environment(), sort_keys=True)
        name = hashlib.sha256(f"{key.digest}\0{env}".encode()).hexdigest()
        return self.directory / (name + _SUFFIX)

    def get_or_compile(self, key: CacheKey, compile_fn: Callable[[], bytes | bytearray | memoryview]) -> bytes:
        """key's payload: from memory, else from disk, else compile_fn()
        (which must return bytes), kept in memory and written to disk."""
        if not isinstance(key, CacheKey):
            raise TypeError(f"get_or_compile takes a CacheKey, not {type(key).__name__}")
        payload = self._memory.get(key.digest)
        if payload is not None:
            self._count("hits")
            self._last[key.kernel] = key
            return payload
        with self._lock:
            key_lock = self._key_locks.setdefault(key.digest, threading.Lock())
        with key_lock:
            payload = self._memory.get(key.digest)
            if payload is not None:     # another thread compiled it while we waited
                self._count("hits")
                self._last[key.kernel] = key
                return payload
            self._count("misses")
            trusted = self.disk and directory_problem(self.directory) in (None, "missing")
            if trusted:
                payload = self._read(key)
                if payload is not None:
                    self._memory[key.digest] = payload
                    self._count("disk_hits")
                    self._last[key.kernel] = key
                    log(("cache",), f"mlirgpu: loaded {label(key)} from the disk cache")
                    return payload
            with self._lock:
                reason = recompile_reason(self._last.get(key.kernel), key)
            log(("compile",), f"mlirgpu: compiling {label(key)} because: {reason}")
            payload = compile_fn()
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError(f"compile_fn must return bytes, not {type(payload).__name__}")
            payload = bytes(payload)
            with self._lock:
                self._counts["compiles"] += 1
                self._last[key.kernel] = key
            self._memory[key.digest] = payload
            if trusted:
                self._write(key, payload)
            return payload

    def _read(self, key):
        path = self.path(key)
        data, problem = read_private_file(path)
        if problem is not None:
            log(("cache", "compile"), f"mlirgpu: cannot read cache entry {path} ({problem}); recompiling")
            return None
        if data is None:
            return None
        payload, problem = _decode_entry(data, key, environment())
        if problem is not None:
            self._count("corrupt")
            log(("cache", "compile"), f"mlirgpu: corrupt entry {path} for {label(key)} ({problem}); "
                 "recompiling")
        return payload

    def _write(self, key, payload):
        if self._write_failed:
            return
        try:
            if not write_private_file(self.directory, self.path(key), _encode_entry(key, payload, environment())):
                return
        except OSError as error:
            self._write_failed = True
            log(("cache", "compile"), f"mlirgpu: cannot write the compile cache in {self.directory} "
                 f"({error}); keeping compiled kernels in memory only")
            return
        self._count("disk_writes")

    def clear(self, memory: bool = True, disk: bool = False) -> None:
        """Forget the in-memory entries and/or delete this cache's files (its
        entries and stray temporary files; nothing else in the directory).
        Counters are kept."""
        if memory:
            self._memory.clear()
        if disk:
            try:
                names = os.listdir(self.directory)
            except OSError:
                return
            for name in names:
                if name.endswith(_SUFFIX) or (name.startswith(".") and name.endswith(".tmp")
                                              and _SUFFIX in name):
                    try:
                        os.unlink(self.directory / name)
                    except OSError:
                        pass


_default = None
_default_lock = threading.Lock()


def default_cache() -> CompileCache:
    """The process's CompileCache (created at the first call, from
    MLIRGPU_CACHE_DIR as it is then)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CompileCache()
        return _default


def cache_info() -> CacheInfo:
    """CacheInfo of the process's default cache.

    For example::

        print(mg.cache_info())   # CacheInfo(hits=3, disk_hits=1, misses=2, compiles=1, ...)
    """
    return default_cache().info()


def cache_clear(memory: bool = True, disk: bool = False) -> None:
    """Clear the process's default cache: its memory and/or its disk entries.

    For example::

        mg.cache_clear()                  # forget what this process compiled
        mg.cache_clear(disk=True)         # and delete the disk entries too
    """
    default_cache().clear(memory=memory, disk=disk)
