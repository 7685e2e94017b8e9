"""The compilation cache: one cubin per specialization, in memory and on disk.

A specialization is named by a `CacheKey`, an ordered set of named string
parts (kernel, source, globals, generics, chip, options). `CompileCache`
answers `get_or_compile(key, compile_fn)` from a dict first, then from a
file under MLIRGPU_CACHE_DIR (default ~/.cache/mlirgpu), and only then calls
`compile_fn`. Files are written atomically (temp file, fsync, os.replace), so
processes may share the directory without locks; each carries the key, the
versions of mlirgpu, MLIR and CUDA, and the payload's length and sha256, and a
file that does not match is recompiled and overwritten, never trusted.

MLIRGPU_LOG (comma-separated) turns on logging through the "mlirgpu" logger:
`compile` logs each compile with what changed since the kernel's previous
compile; `cache` logs disk hits, corrupt entries and a cache directory that
cannot be written. See docs/design/compile_cache.md.
"""
import hashlib
import json
import logging
import os
import struct
import sys
import threading
import types
from collections import namedtuple
from pathlib import Path

import numpy

from .. import _mlirgpu
from .._mlirgpu import DType

__all__ = ["CacheInfo", "CacheKey", "CompileCache", "cache_clear", "cache_info", "default_cache", "environment",
           "fingerprint", "fingerprint_globals"]

# ---------------------------------------------------------------------------
# Fingerprints of the values a kernel reads as globals or closure cells
# ---------------------------------------------------------------------------

# A global array becomes a constant of the kernel; CUDA's constant bank is
# 64 KiB, and anything larger should be a kernel argument instead.
MAX_ARRAY_BYTES = 64 * 1024
_ARRAY_KINDS = "biufc"


def fingerprint(value):
    """A canonical string for a value a kernel may read as a global or closure
    variable: equal values give equal strings in every process, different
    values (or types: 1, 1.0, True, numpy.int32(1)) give different ones.

    Supported: None, bool, int, float, complex, str, bytes; tuples, lists and
    dicts of supported values; numpy scalars, dtypes, ufuncs and arrays of
    numbers up to MAX_ARRAY_BYTES; mlirgpu dtypes; Python functions (module,
    qualname and a hash of the code object); builtin functions, classes and
    modules (by name). Anything else raises TypeError.
    """
    return _fingerprint(value, set())


def _fingerprint(value, active):
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is complex:
        return repr(value)
    if kind is str or kind is bytes:
        return repr(value)
    if isinstance(value, DType):
        return f"mlirgpu.{value.name}"
    if isinstance(value, numpy.generic):
        return f"numpy.{kind.__name__}({value.item()!r})"
    if isinstance(value, numpy.dtype):
        return f"numpy.dtype({value.str!r})" if value.fields is None else f"numpy.dtype({value.descr!r})"
    if kind is numpy.ndarray:
        return _fingerprint_array(value)
    if kind in (tuple, list, dict):
        if id(value) in active:
            raise TypeError(f"cannot fingerprint a {kind.__name__} that contains itself")
        active.add(id(value))
        try:
            if kind is dict:
                items = sorted(f"{_fingerprint(k, active)}: {_fingerprint(v, active)}"
                               for k, v in value.items())
                return "{" + ", ".join(items) + "}"
            items = [_fingerprint(v, active) for v in value]
            if kind is tuple:
                return "(" + ", ".join(items) + (",)" if len(items) == 1 else ")")
            return "[" + ", ".join(items) + "]"
        finally:
            active.discard(id(value))
    if kind is types.FunctionType:
        return f"function {value.__module__}.{value.__qualname__} code:{_code_digest(value.__code__)}"
    # A builtin bound to an object ("abc".upper) is as unknown as the object.
    if kind is types.BuiltinFunctionType and type(value.__self__) in (type(None), types.ModuleType):
        return f"builtin {getattr(value, '__module__', None)}.{value.__qualname__}"
    if kind is numpy.ufunc:
        return f"numpy.ufunc {value.__name__}"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if kind is types.ModuleType:
        return f"module {value.__name__}"
    # Layouts, swizzles and MMA atoms are immutable compile-time integers, shown whole by their repr.
    if kind.__module__.startswith("mlirgpu.layout."):
        return f"{kind.__module__}.{kind.__qualname__} {value!r}"
    raise TypeError(f"cannot fingerprint a value of type {kind.__module__}.{kind.__qualname__}")


def _fingerprint_array(array):
    if array.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"cannot fingerprint a numpy array of dtype {array.dtype} (numbers only)")
    if array.nbytes > MAX_ARRAY_BYTES:
        raise TypeError(f"cannot fingerprint a numpy array of {array.nbytes} bytes (at most "
                        f"{MAX_ARRAY_BYTES}): pass it to the kernel as an argument")
    data = hashlib.sha256(numpy.ascontiguousarray(array).tobytes()).hexdigest()
    return f"numpy.ndarray({array.dtype.str!r}, {array.shape!r}, sha256:{data})"


def _code_digest(code):
    """sha256 of what a code object does, not where it is: positions, file
    names and line tables are left out (they do not reach the cubin), and
    marshal is not used (its bytes depend on reference counts)."""
    digest = hashlib.sha256()
    _hash_code(code, digest)
    return digest.hexdigest()


def _hash_code(code, digest):
    digest.update(repr((code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                        code.co_flags, code.co_names, code.co_varnames, code.co_freevars,
                        code.co_cellvars)).encode())
    digest.update(code.co_code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            digest.update(b"<code>")
            _hash_code(const, digest)
        elif isinstance(const, frozenset):
            digest.update(("frozenset" + repr(sorted(repr(c) for c in const))).encode())
        else:
            digest.update((type(const).__name__ + ":" + repr(const) + "\0").encode())


def fingerprint_globals(values):
    """(digest, details) for the globals and closure values a kernel reads,
    given as a mapping name -> value: digest is the sha256 of their
    fingerprints, details maps each name to a readable form (for the reason
    a recompile logs). Raises TypeError naming the value it cannot fingerprint."""
    digest = hashlib.sha256()
    details = {}
    for name in sorted(values):
        try:
            text = fingerprint(values[name])
        except TypeError as error:
            raise TypeError(f"global {name!r}: {error}") from None
        digest.update(f"{len(name)}:{name}{len(text)}:{text}".encode())
        details[name] = text if len(text) <= 80 else text[:77] + "..."
    return digest.hexdigest(), details


# ---------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------

class CacheKey:
    """The name of one specialization: an ordered mapping of part names to
    strings, e.g. {"kernel": "mod.qualname", "source": <sha256>, "globals":
    <sha256>, "generics": "M=256,dtype=f32", "chip": "sm_90a", "options":
    "opt_level=3"}. `digest` (sha256, hex) covers the parts in order.
    `details` (part -> {name: readable value}) only explains recompiles; it is
    not part of the digest or of equality."""

    __slots__ = ("parts", "details", "digest")

    def __init__(self, parts, details=None):
        parts = dict(parts)
        for name, value in parts.items():
            if not isinstance(name, str) or not name or not isinstance(value, str):
                raise TypeError(f"CacheKey parts map non-empty str to str, got {name!r}: {value!r}")
        clean = {}
        for part, mapping in (details or {}).items():
            if part not in parts:
                raise ValueError(f"CacheKey details for {part!r}, which is not a part ({', '.join(parts)})")
            clean[part] = {str(k): str(v) for k, v in mapping.items()}
        digest = hashlib.sha256(b"mlirgpu-cache-key-1\0")
        # Length prefixes make the encoding injective: no two keys share bytes.
        for name, value in parts.items():
            n, v = name.encode(), value.encode()
            digest.update(b"%d:%s%d:%s" % (len(n), n, len(v), v))
        object.__setattr__(self, "parts", types.MappingProxyType(parts))
        object.__setattr__(self, "details", types.MappingProxyType(clean))
        object.__setattr__(self, "digest", digest.hexdigest())

    def __setattr__(self, name, value):
        raise AttributeError("CacheKey is immutable")

    @property
    def kernel(self):
        """The "kernel" part, or "" where there is none."""
        return self.parts.get("kernel", "")

    def __eq__(self, other):
        return isinstance(other, CacheKey) and self.digest == other.digest

    def __hash__(self):
        return hash(self.digest)

    def __repr__(self):
        return f"CacheKey({dict(self.parts)!r})"


# ---------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------

logger = logging.getLogger("mlirgpu")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (notebooks replace it)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _log_enabled(*topics):
    words = {w.strip() for w in os.environ.get("MLIRGPU_LOG", "").split(",")}
    return bool(words & ({"all"} | set(topics)))


def log(topics, message):
    """Log at INFO when MLIRGPU_LOG names one of topics (read at each call)."""
    if not _log_enabled(*topics):
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)    # the user asked for these lines by setting MLIRGPU_LOG
    if not logger.hasHandlers():
        logger.addHandler(_StderrHandler())
    logger.info(message)


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


def _cuda_version(cuda_home):
    """The toolkit's version: version.json, else the nvcc wheel's dist-info,
    else CUDA_VERSION in cuda.h, else "unknown"."""
    try:
        with open(os.path.join(cuda_home, "version.json")) as f:
            return str(json.load(f)["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        for name in sorted(os.listdir(os.path.join(cuda_home, "dist-info"))):
            if name.startswith("nvidia_cuda_nvcc-") and name.endswith(".dist-info"):
                return name[len("nvidia_cuda_nvcc-"):-len(".dist-info")]
    except OSError:
        pass
    try:
        with open(os.path.join(cuda_home, "include", "cuda.h")) as f:
            for line in f:
                if line.startswith("#define CUDA_VERSION "):
                    number = int(line.split()[2])
                    return f"{number // 1000}.{number % 1000 // 10}"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def environment():
    """The versions every entry records and must match to be used (computed
    once per process): mlirgpu, mlirgpu_build, mlir, mlir_build, cuda."""
    global _environment
    with _environment_lock:
        if _environment is None:
            from .._version import __version__
            from . import toolkit

            mlir, mlir_build = _mlir_version()
            # Without ptxas an entry holds PTX, not a cubin: never the same entry.
            cuda = _cuda_version(toolkit.PTXAS.home) if toolkit.PTXAS else "none: PTX for the driver's JIT"
            if toolkit.PTXAS and toolkit.PTXAS.source == "nvidia-cuda-nvcc wheel":
                import importlib.metadata  # here: importing it costs more than the rest of mlirgpu's modules

                try:
                    cuda = importlib.metadata.version("nvidia-cuda-nvcc-cu12")
                except importlib.metadata.PackageNotFoundError:
                    pass
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
    except (ValueError, KeyError, TypeError):
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


# ---------------------------------------------------------------------------
# Why a kernel is compiled again
# ---------------------------------------------------------------------------

def _pairs(text):
    """{"M": "256", ...} for "M=256,K=128", or None if text is not that shape."""
    items = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name or name in items:
            return None
        items[name] = value
    return items


def _describe(part, old, new, old_details, new_details):
    if old_details is not None and new_details is not None:
        names = list(old_details) + [n for n in new_details if n not in old_details]
        changes = [f"{n}: {old_details.get(n, '<unset>')} -> {new_details.get(n, '<unset>')}"
                   for n in names if old_details.get(n) != new_details.get(n)]
        return f"{part} changed ({', '.join(changes)})" if changes else f"{part} changed"
    old_items, new_items = _pairs(old), _pairs(new)
    if old_items is not None and new_items is not None:
        names = list(old_items) + [n for n in new_items if n not in old_items]
        changes = []
        for n in names:
            if n not in new_items:
                changes.append(f"{n}={old_items[n]} removed")
            elif n not in old_items:
                changes.append(f"{n}={new_items[n]} added")
            elif old_items[n] != new_items[n]:
                changes.append(f"{n}={old_items[n]} -> {n}={new_items[n]}")
        return f"{part} changed ({', '.join(changes)})"
    is_digest = len(new) >= 32 and all(c in "0123456789abcdef" for c in new)
    if len(old) <= 40 and len(new) <= 40 and not is_digest:
        return f"{part} changed ({old} -> {new})"
    return f"{part} changed"


def _reason(previous, key):
    if previous is None:
        return "first compile"
    if previous == key:
        return "not cached (key unchanged since its last use)"
    reasons = []
    for part, value in key.parts.items():
        if part not in previous.parts:
            reasons.append(f"{part} added")
        elif previous.parts[part] != value:
            reasons.append(_describe(part, previous.parts[part], value,
                                     previous.details.get(part), key.details.get(part)))
    reasons += [f"{part} removed" for part in previous.parts if part not in key.parts]
    return "; ".join(reasons)


def _label(key):
    shown = [f"{part} {key.parts[part]}" for part in ("generics", "chip") if part in key.parts]
    name = key.kernel or key.digest[:16]
    return f"{name} [{', '.join(shown)}]" if shown else name


# ---------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------

CacheInfo = namedtuple("CacheInfo", "hits disk_hits misses compiles disk_writes corrupt")
CacheInfo.__doc__ = """Counters of a CompileCache. hits: answered from memory;
misses: not in memory (then answered from disk, counted in disk_hits, or
compiled); compiles: compile_fn calls that returned; disk_writes: entries
written; corrupt: disk entries found invalid (and recompiled)."""


def default_directory():
    return Path(os.environ.get("MLIRGPU_CACHE_DIR") or Path.home() / ".cache" / "mlirgpu")


class CompileCache:
    """Compiled payloads (bytes) by CacheKey, in a dict and in `directory`
    (default: $MLIRGPU_CACHE_DIR, else ~/.cache/mlirgpu; created on the first
    write). With disk=False, or where the directory cannot be created or
    written, the cache keeps to memory."""

    def __init__(self, directory=None, *, disk=True):
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

    def info(self):
        """A CacheInfo of this cache's counters."""
        with self._lock:
            return CacheInfo(**self._counts)

    def path(self, key):
        """The file that holds key's entry. Its name covers the environment
        too, so installations of different versions share a directory
        without overwriting each other's entries."""
        env = json.dumps(environment(), sort_keys=True)
        name = hashlib.sha256(f"{key.digest}\0{env}".encode()).hexdigest()
        return self.directory / (name + _SUFFIX)

    def get_or_compile(self, key, compile_fn):
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
            if self.disk:
                payload = self._read(key)
                if payload is not None:
                    self._memory[key.digest] = payload
                    self._count("disk_hits")
                    self._last[key.kernel] = key
                    log(("cache",), f"mlirgpu: loaded {_label(key)} from the disk cache")
                    return payload
            with self._lock:
                reason = _reason(self._last.get(key.kernel), key)
            log(("compile",), f"mlirgpu: compiling {_label(key)} because: {reason}")
            payload = compile_fn()
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError(f"compile_fn must return bytes, not {type(payload).__name__}")
            payload = bytes(payload)
            with self._lock:
                self._counts["compiles"] += 1
                self._last[key.kernel] = key
            self._memory[key.digest] = payload
            if self.disk:
                self._write(key, payload)
            return payload

    def _read(self, key):
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            log(("cache", "compile"), f"mlirgpu: cannot read cache entry {path} ({error}); recompiling")
            return None
        payload, problem = _decode_entry(data, key, environment())
        if problem is not None:
            self._count("corrupt")
            log(("cache", "compile"), f"mlirgpu: corrupt entry {path} for {_label(key)} ({problem}); "
                 "recompiling")
        return payload

    def _write(self, key, payload):
        if self._write_failed:
            return
        path = self.path(key)
        temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as f:
                f.write(_encode_entry(key, payload, environment()))
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)      # atomic: readers see the old entry or the new one
        except OSError as error:
            try:
                temp.unlink()
            except OSError:
                pass
            self._write_failed = True
            log(("cache", "compile"), f"mlirgpu: cannot write the compile cache in {self.directory} "
                 f"({error}); keeping compiled kernels in memory only")
            return
        self._count("disk_writes")

    def clear(self, memory=True, disk=False):
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


def default_cache():
    """The process's CompileCache (created at the first call, from
    MLIRGPU_CACHE_DIR as it is then)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CompileCache()
        return _default


def cache_info():
    """CacheInfo of the process's default cache.

    For example::

        print(mg.cache_info())   # CacheInfo(hits=3, disk_hits=1, misses=2, compiles=1, ...)
    """
    return default_cache().info()


def cache_clear(memory=True, disk=False):
    """Clear the process's default cache: its memory and/or its disk entries.

    For example::

        mg.cache_clear()                  # forget what this process compiled
        mg.cache_clear(disk=True)         # and delete the disk entries too
    """
    default_cache().clear(memory=memory, disk=disk)
