"""@mg.autotune: the fastest of several configs of a kernel's generics, per problem.

    BM, BN, BK, TM, TN = mg.generics("BM BN BK TM TN")

    @mg.autotune(configs=[dict(BM=128, BN=128, BK=8, TM=8, TN=8), dict(BM=64, BN=64, BK=8, TM=8, TN=4)],
                 key=["M", "N", "K"])
    @mg.kernel(generics=(M, N, K, BM, BN, BK, TM, TN))
    def sgemm(A: mg.memref[M, K, mg.f32], ...): ...

    sgemm(A, B, C, grid=lambda g: (g["N"] // g["BN"], g["M"] // g["BM"]),
          block=lambda g: (g["BM"] * g["BN"] // (g["TM"] * g["TN"]),))

A config gives the generics the arguments do not determine (tile sizes);
the key's generics, bound from the arguments, name a tuning problem. On the
GPU backend the first launch of a key times every config (CUDA events, after
warm-up launches; the median), keeps the fastest and records the choice in
the cache directory, keyed by the GPU's name and the key's values, so a new
process launches it without timing. On the CPU backend the first config that
compiles and launches is used. The configs compile concurrently (a thread
pool: compiling runs without the GIL) before the first is timed.
docs/design/autotune.md has the details.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .._mlirgpu import CompileError, CudaError, DeviceArray, DType, Event, LaunchError, Stream
from .backend import Dims, asarray, current, empty, to_device
from .compiled import default_chip
from ..compiler.cache import default_directory, directory_problem, read_private_file, write_private_file
from ..compiler.log import log
from .kernel import Kernel, check_generic_value, show

__all__ = ["autotune", "Autotuner", "WARMUP", "REPEAT"]

WARMUP = 3    # launches before the timed ones: the module load, caches and clocks settle
REPEAT = 10   # timed launches per config; the median is kept

_SKIPPED = (CompileError, LaunchError, CudaError)   # a config that cannot run here: skipped, not fatal
_SUFFIX = ".autotune.json"
# A choices file is a few hundred bytes a key; one larger than this is not read.
MAX_CHOICES_BYTES = 1 << 20


def autotune(configs: Sequence[dict[str, Any]], key: Sequence[str], *, warmup: int = WARMUP, repeat: int = REPEAT,
             progress: bool = True) -> Callable[[Kernel], Autotuner]:
    """`@mg.autotune(configs=[{...}, ...], key=["M", "N", "K"])` over an `@mg.kernel`.
    `progress=False` silences the progress bar.

    For example::

        N, BLOCK = mg.generics("N BLOCK")

        @mg.autotune(configs=[dict(BLOCK=128), dict(BLOCK=256)], key=["N"])
        @mg.kernel(generics=(N, BLOCK))
        def scale(x: mg.memref[N, mg.f32], a: mg.f32):
            i = mg.block_idx.x * BLOCK + mg.thread_idx.x
            if i < N:
                x[i] = a * x[i]

        scale(x, 2.0, grid=lambda g: ((g["N"] + g["BLOCK"] - 1) // g["BLOCK"],), block=lambda g: (g["BLOCK"],))
    """
    return lambda kernel: Autotuner(kernel, configs, key, warmup=warmup, repeat=repeat, progress=progress)


class Autotuner:
    """An @mg.kernel launched with the config chosen for its key's values.

    kernel, configs (each a dict of generic name to value), key (the names
    whose values name a tuning problem: those given, then the dtype generics
    the arguments bind), timings and skipped (per key tuple, from its last
    tuning in this process: [(config, median ms)] and [(config, reason)]),
    best_config (the config of the last launch), best(**key_values), table(gpu)
    (every choice recorded for a GPU, which mg.export takes), path().

    For example::

        scale(x, 2.0, grid=..., block=...)   # tunes on the first launch of a key
        scale.best(N=4096)                    # {'BLOCK': 256}
        scale.timings[(4096,)]                # [(config, median ms), ...]
    """

    def __init__(self, kernel, configs, key, *, warmup=WARMUP, repeat=REPEAT, progress=True):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"@mg.autotune decorates an @mg.kernel, not {type(kernel).__name__}")
        self.kernel = kernel
        self.__name__, self.__qualname__, self.__doc__ = kernel.__name__, kernel.__qualname__, kernel.__doc__
        from_arguments = kernel.argument_generics()
        self._tuned = [g for g in kernel.generics if g not in from_arguments]
        self.configs = _check_configs(kernel, configs, self._tuned)
        if not isinstance(key, (list, tuple)) or not all(isinstance(name, str) for name in key):
            raise TypeError(f"key lists generic names, e.g. ['M', 'N', 'K'], not {key!r}")
        for name in key:
            if name not in from_arguments:
                raise ValueError(f"key names {name!r}, which is not a generic the arguments of "
                                 f"{kernel.__qualname__} determine ({', '.join(sorted(from_arguments))})")
        dtypes = [g for g in kernel.generics if g in kernel.dtype_generics() and g not in key]
        self.key = list(key) + dtypes
        if not (isinstance(warmup, int) and warmup >= 0 and isinstance(repeat, int) and repeat >= 1):
            raise ValueError(f"warmup is an int >= 0 and repeat an int >= 1, got {warmup!r} and {repeat!r}")
        self.warmup, self.repeat, self.progress = warmup, repeat, bool(progress)
        self.timings, self.skipped = {}, {}
        self.best_config = None
        self._chosen = {}   # (GPU name or None for the CPU backend, key tuple) -> config

    def __repr__(self):
        return f"<mlirgpu autotune {self.kernel.__qualname__}: {len(self.configs)} configs, key {self.key}>"

    def __call__(self, *args: Any, grid: Dims | Callable[[dict], Dims], block: Dims | Callable[[dict], Dims],
                 shared_mem: int | Callable[[dict], int] = 0, stream: Stream | None = None) -> None:
        """Launches the kernel as `kernel(*args, ...)` does, with the key's
        config; `grid`, `block` and `shared_mem` may be callables of the dict
        of every generic's value."""
        bound = self.kernel.bind(args, unbound=self._tuned)
        key = tuple(bound[name] for name in self.key)
        gpu = _gpu_name()
        config = self._chosen.get((gpu, key))
        if config is None and gpu is None:
            self.best_config = self._launch_first_that_runs(key, bound, args, grid, block, shared_mem, stream)
            return
        if config is None:
            config = self._load(gpu, key)
            if config is None:
                config = self._tune(gpu, key, bound, args, grid, block, shared_mem, stream)
            self._chosen[(gpu, key)] = config
        self.best_config = config
        values = {**bound, **config}
        self.kernel.specialize(values).launch(args, *_launch_shape(values, grid, block, shared_mem), stream)

    def best(self, **key_values: Any) -> dict[str, Any] | None:
        """The config chosen for these key values on the current GPU (from
        this process, else from the cache directory) or, on the CPU backend,
        in this process; None where none has been chosen yet."""
        if set(key_values) != set(self.key):
            raise TypeError(f"best() takes the key's values by name: {', '.join(self.key)}")
        dtypes = self.kernel.dtype_generics()
        try:
            key = tuple(check_generic_value(name, key_values[name], dtypes) for name in self.key)
        except CompileError as error:
            raise ValueError(str(error)) from None
        gpu = _gpu_name()
        config = self._chosen.get((gpu, key))
        if config is None and gpu is not None:
            config = self._load(gpu, key)
        return config

    def table(self, gpu: str | None = None) -> dict[tuple, dict[str, Any]]:
        """{key values: config} of every choice recorded for `gpu` (a GPU's
        name, as mg.cuda.Device(0).name gives it; default: the current GPU's),
        in this process or the cache directory: what mg.export takes to build
        each tuned config, dispatched by the key's values."""
        gpu = gpu if gpu is not None else _gpu_name()
        if gpu is None:
            return {}
        dtypes = self.kernel.dtype_generics()
        table = {}
        for entry, stored in self._read().items():
            name, _, values = entry.partition("|")
            pairs = dict(pair.split("=", 1) for pair in values.split(",") if "=" in pair)
            config = next((c for c in self.configs if _as_json(c) == stored), None)
            if name != gpu or config is None or set(pairs) != set(self.key):
                continue
            try:
                key = tuple(check_generic_value(n, pairs[n] if n in dtypes else int(pairs[n]), dtypes)
                            for n in self.key)
            except (CompileError, ValueError):
                continue   # an entry this kernel's key cannot read: not its choice
            table[key] = config
        table.update({key: config for (name, key), config in self._chosen.items() if name == gpu})
        return table

    def path(self) -> Path:
        """The file in the cache directory that holds this kernel's choices:
        named after the kernel and the sha256 of its source."""
        kernel = self.kernel
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{kernel.function.__module__}.{kernel.__qualname__}")
        return default_directory() / f"{name}.{kernel.source_digest()[:16]}{_SUFFIX}"

    # -- choosing --------------------------------------------------------
    def _label(self, key):
        return f"{self.kernel.__qualname__} ({', '.join(f'{n}={show(v)}' for n, v in zip(self.key, key))})"

    def _skip(self, key, config, error, skipped):
        reason = f"{type(error).__name__}: {error}"
        skipped.append((config, reason))
        log(("autotune",), f"mlirgpu: autotune {self._label(key)}: skipped {_describe(config)}: {reason}")

    def _launch_first_that_runs(self, key, bound, args, grid, block, shared_mem, stream):
        """The CPU backend's rule: there is no GPU to time, so the first config
        (in `configs` order) that compiles and launches is used, for this
        process only."""
        skipped = self.skipped[key] = []
        for config in self.configs:
            values = {**bound, **config}
            try:
                self.kernel.specialize(values).launch(args, *_launch_shape(values, grid, block, shared_mem), stream)
            except (CompileError, LaunchError) as error:
                self._skip(key, config, error, skipped)
                continue
            self._chosen[(None, key)] = config
            return config
        raise _nothing_runs(self._label(key), skipped)

    def _tune(self, gpu, key, bound, args, grid, block, shared_mem, stream):
        """Times every config on the arguments (arrays snapshot first and
        restored after; NumPy arrays replaced by device copies), keeps the
        fastest and records it in path()."""
        timings = self.timings[key] = []
        skipped = self.skipped[key] = []
        label = self._label(key)
        arrays, snapshots = _tuning_arguments(self.kernel, args, stream)
        _compile_concurrently([self.kernel.specialize({**bound, **config}) for config in self.configs])
        try:
            for done, config in enumerate(self.configs):
                self._show_progress(label, done)
                values = {**bound, **config}
                try:
                    ms = _time_config(self.kernel.specialize(values), arrays,
                                      *_launch_shape(values, grid, block, shared_mem), stream,
                                      self.warmup, self.repeat)
                except _SKIPPED as error:
                    self._skip(key, config, error, skipped)
                    continue
                timings.append((config, ms))
            self._show_progress(label, len(self.configs))
        finally:
            if self.progress:
                sys.stderr.write("\n")   # ends the bar's line, also when an error ends the tuning
            for array, snapshot in snapshots:
                array.copy_from(snapshot, stream=stream)
        if not timings:
            raise _nothing_runs(label, skipped)
        config, ms = min(timings, key=lambda timing: timing[1])
        log(("autotune",), f"mlirgpu: autotune {label} on {gpu}: chose {_describe(config)} ({ms:.4f} ms; "
             f"{len(timings)} timed, {len(skipped)} skipped)")
        self._store(gpu, key, config)
        return config

    def _show_progress(self, label, done):
        if self.progress:
            sys.stderr.write("\r" + _progress_line(label, done, len(self.configs)))
            sys.stderr.flush()

    # -- the cache directory ---------------------------------------------
    def _entry(self, gpu, key):
        return f"{gpu}|{','.join(f'{n}={show(v)}' for n, v in zip(self.key, key))}"

    def _read(self, quiet=False):
        """The file's choices (entry -> config as JSON), or {} where there is
        no file or one that is not this kernel's valid choices (logged unless
        `quiet`: the write after a tuning reads it again). The file is
        trusted as the compile cache's entries are: a regular file of this
        user's that no one else may write, in a directory likewise, of at most
        MAX_CHOICES_BYTES; anything else, or what does not decode, is a miss."""
        path = self.path()
        problem = directory_problem(path.parent)
        if problem == "missing":
            return {}
        if problem is None:
            data, problem = read_private_file(path, MAX_CHOICES_BYTES)
            if data is None and problem is None:
                return {}
        if problem is None:
            try:
                data = json.loads(data.decode())
            except ValueError as error:     # UnicodeDecodeError included
                problem = str(error)
            else:
                if (isinstance(data, dict) and isinstance(data.get("choices"), dict)
                        and data.get("source") == self.kernel.source_digest()):
                    return data["choices"]
                problem = "not this kernel's choices"
        if not quiet:
            log(("autotune",), f"mlirgpu: autotune: ignoring {path} ({problem}); tuning again")
        return {}

    def _load(self, gpu, key):
        """The config recorded for (gpu, key), if it is still one of `configs`."""
        stored = self._read().get(self._entry(gpu, key))
        if stored is None:
            return None
        for config in self.configs:
            if _as_json(config) == stored:
                log(("autotune",), f"mlirgpu: autotune {self._label(key)}: loaded {_describe(config)} "
                     f"from {self.path()}")
                return config
        log(("autotune",), f"mlirgpu: autotune {self._label(key)}: the choice {stored!r} in {self.path()} is not "
             f"in configs; tuning again")
        return None

    def _store(self, gpu, key, config):
        """Adds the choice to path(), written as the compile cache's entries
        are (atomically, mode 0600, in a private directory). Another process
        writing the same file at once may lose its entry: that key is then
        tuned again, never wrong."""
        path = self.path()
        choices = self._read(quiet=True)
        choices[self._entry(gpu, key)] = _as_json(config)
        text = json.dumps({"kernel": f"{self.kernel.function.__module__}.{self.kernel.__qualname__}",
                           "source": self.kernel.source_digest(), "choices": choices}, indent=1, sort_keys=True)
        try:
            write_private_file(path.parent, path, text.encode())
        except OSError as error:
            log(("autotune",), f"mlirgpu: autotune: cannot write {path} ({error}); the choice is kept in "
                 "memory only")


def _progress_line(label, done, total, width=10):
    """`mlirgpu autotune sgemm (M=64, N=64, K=64): [#####.....] 5/10 configs`"""
    filled = done * width // total
    return f"mlirgpu autotune {label}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} configs"


def _check_configs(kernel, configs, tuned):
    """The configs with checked values (as kernel[...] checks them); ValueError
    for a config that names an unknown generic, one the arguments determine,
    or leaves one of `tuned` out."""
    if not isinstance(configs, (list, tuple)) or not configs or not all(isinstance(c, dict) for c in configs):
        raise TypeError("configs is a non-empty list of dicts of generic values, e.g. [dict(BM=64, BN=64)]")
    dtypes = kernel.dtype_generics()
    checked = []
    for i, config in enumerate(configs):
        for name in config:
            if name not in kernel.generics:
                raise ValueError(f"config {i} names {name!r}, which is not a generic of {kernel.__qualname__} "
                                 f"({', '.join(kernel.generics)})")
            if name not in tuned:
                raise ValueError(f"config {i} gives {name}, which the arguments of {kernel.__qualname__} determine")
        missing = [name for name in tuned if name not in config]
        if missing:
            raise ValueError(f"config {i} does not give {', '.join(missing)}: a config gives every generic the "
                             f"arguments do not determine ({', '.join(tuned)})")
        try:
            checked.append({name: check_generic_value(name, config[name], dtypes) for name in tuned})
        except CompileError as error:
            raise ValueError(f"config {i}: {error}") from None
    return checked


def _describe(config):
    return ", ".join(f"{name}={show(value)}" for name, value in config.items()) or "{}"


def _as_json(config):
    """The config as the file records it: dtypes by name."""
    return {name: value.name if isinstance(value, DType) else value for name, value in config.items()}


def _nothing_runs(label, skipped):
    reasons = "".join(f"\n  {_describe(config)}: {reason}" for config, reason in skipped)
    return LaunchError(f"autotune {label}: no config compiles and launches:{reasons}")


def _launch_shape(values, grid, block, shared_mem):
    """grid, block and shared_mem, each called with the generics' values where it is a callable."""
    return tuple(x(dict(values)) if callable(x) else x for x in (grid, block, shared_mem))


def _gpu_name():
    """The current GPU's name, which keys the recorded choices; None on the
    CPU backend, where nothing is timed."""
    return current().tuning_device()


def _tuning_arguments(kernel, args, stream):
    """(the arguments the timing launches take, [(array, snapshot)]) for a
    tuning: a NumPy array is replaced by a device copy (the user's array is
    never touched), every other array is used in place and snapshot with a
    device-to-device copy, which the tuner copies back afterwards."""
    arrays, snapshots = [], []
    for p, arg in zip(kernel.parameters, args):
        if p.memref is None:
            arrays.append(arg)
        elif isinstance(arg, np.ndarray):
            arrays.append(to_device(arg, stream=stream))
        else:
            array = arg if isinstance(arg, DeviceArray) else asarray(arg)
            snapshot = empty(array.shape, array.dtype, stream=stream)
            snapshot.copy_from(array, stream=stream)
            arrays.append(array)
            snapshots.append((array, snapshot))
    return arrays, snapshots


def _compile_concurrently(specs):
    """Every spec's image for the current GPU (what spec.function() loads),
    compiled from a pool of threads into the compile cache (compiling
    releases the GIL). A config that does not compile is left to
    _time_config, which raises its error again."""
    chip = default_chip()

    def compile_one(spec):
        try:
            spec.image(chip)
        except CompileError:
            pass   # reported, once, where the config is timed

    with ThreadPoolExecutor(min(len(specs), os.cpu_count() or 1)) as pool:
        list(pool.map(compile_one, specs))


def _time_config(spec, args, grid, block, shared_mem, stream, warmup=WARMUP, repeat=REPEAT):
    """The median time in ms of `repeat` launches of `spec` (after `warmup`
    untimed ones), each between two CUDA events on `stream`. Compiling and
    loading happen first: their errors, and the driver's refusal of a launch,
    are raised (the tuner skips the config)."""
    function = spec.function()
    for _ in range(warmup):
        function(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream)
    events = [(Event(), Event()) for _ in range(repeat)]
    for start, end in events:
        start.record(stream)
        function(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream)
        end.record(stream)
    events[-1][1].synchronize()
    import statistics  # here, where a GPU is timed: importing it costs more than some of mlirgpu's layers

    return statistics.median(start.elapsed_time(end) for start, end in events)
