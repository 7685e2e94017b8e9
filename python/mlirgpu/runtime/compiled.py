"""One way from a traced module to a loaded GPU function, shared by
@mg.kernel specializations and @mg.vectorize's GPU kernels.

    compiled.compilation(chip)   # compiler.Compilation: every stage, inspectable
    compiled.ptx(chip), compiled.cubin(chip)
    compiled.image(chip)         # what the GPU loads (cubin, else PTX), through the compile cache
    compiled.function()          # loaded on the current device, once per device

A subclass gives `name` (the kernel's symbol), `source_function` (the Python
function it was traced from, which the cache key names), `check_globals()`
(which forgets stale traces), `traced_globals`, `gpu_module()`,
`cache_fields()` and `function_params()`.
"""
import functools
import hashlib
import linecache
import opcode
import os
import sys
import types

import numpy as np

from .. import cuda
from .._mlirgpu import CompileError, Dispatcher, DType
from ..compiler import cache, toolkit
from ..compiler.nvvm import NO_PTXAS, Compilation
from ..frontend.function import DeviceFunction
from ..frontend.rewrite import code_objects, source_unavailable
from ..language.generics import is_symbol
from .tracebacks import user_frames

__all__ = ["CompiledModule", "GLOBAL_POLICIES", "TracedGlobals", "default_chip", "read_values", "source_digest"]


def default_chip():
    """The current GPU's chip, else sm_90a (compiling needs no GPU)."""
    return cuda.Device(cuda.current_device()).chip if cuda.is_available() else "sm_90a"


def source_digest(function):
    """sha256 of `function`'s source lines, read once per function. The
    lines are those its code spans (decorators to its last line), taken from
    linecache: no tokenizing, which would cost a new process's first cache
    hit more than the rest of it."""
    digest = getattr(function, "__mlirgpu_source_digest__", None)
    if digest is None:
        code = function.__code__
        lines = linecache.getlines(code.co_filename, function.__globals__)
        last = max((line for c in code_objects(code) for _, _, line in c.co_lines() if line is not None),
                   default=code.co_firstlineno)
        if not lines or last > len(lines):
            raise source_unavailable(function, "Python kept no source lines for it")
        source = "".join(lines[code.co_firstlineno - 1:last])
        digest = hashlib.sha256(source.encode()).hexdigest()
        try:
            function.__mlirgpu_source_digest__ = digest
        except AttributeError:
            pass  # a function that takes no attributes is read again next time
    return digest


def read_values(function):
    """The globals and closure variables `function`'s code names, except
    generics, and those of the @mg.func helpers (and plain functions of its
    module) it names, as "helper.NAME": what compiling it depends on besides
    its source."""
    return {name: value for name, _, _, value in _reads(function, "", {function})
            if name is not None and value is not UNBOUND and _tracked(value)}


#: The value _reads gives a name its function's globals do not hold.
UNBOUND = Dispatcher.UNBOUND


def _reads(function, prefix, seen):
    """Where read_values looks, each as (name, namespace, key, value): per
    function its code, (None, function, None, code); per global its code
    loads (name, its globals, name, value or UNBOUND); per closure variable
    (name, cell, None, value); then those of the helpers they name, whose
    names take the prefix "helper."."""
    code = function.__code__
    yield None, function, None, code
    # The globals its code loads: co_names also holds attribute names (the x of thread_idx.x), which
    # would drag an unrelated global of that name into the key.
    names = set()
    for c in code_objects(code):
        names |= _loaded_globals(c)
    namespace = function.__globals__
    # A closure variable hides a global of its name, which is read all the same.
    found = {name: (namespace, name, namespace.get(name, UNBOUND)) for name in sorted(names)}
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        if name in found:
            yield None, *found[name]
        found[name] = cell, None, cell.cell_contents
    for name, (namespace, key, value) in found.items():
        helper = _helper_function(value, function)
        if helper is not None and helper not in seen:
            seen.add(helper)
            yield from _reads(helper, f"{prefix}{helper.__qualname__}.", seen)
        yield prefix + name, namespace, key, value


def _tracked(value):
    """Whether a change of `value` is one a launch checks."""
    # mlirgpu's own names (mg.thread_idx, mg.constant, ...) change only
    # with mlirgpu, which the cache's entries record already; a module
    # (mg, np, math) is not rebound between launches.
    return not is_symbol(value) and not _is_mlirgpu_object(value) and not isinstance(value, types.ModuleType)


def _helper_function(value, caller):
    """The Python function a kernel traces when it calls `value`: an @mg.func's,
    or a plain function of the caller's module; else None."""
    function = value.function if isinstance(value, DeviceFunction) else value
    if isinstance(function, types.FunctionType) and (function is not value or
                                                     function.__globals__ is caller.__globals__):
        return function
    return None


#: What a launch does when a global or closure value a kernel's trace read
#: has changed since: trace and compile it again, or raise CompileError.
GLOBAL_POLICIES = ("recompile", "error")
_MUTABLE = (list, dict, set, bytearray)
# A launch from C compares a list's items, or an array's bytes, at most this many of them.
_WITNESS_ITEMS, _WITNESS_BYTES = 512, 4096
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_NO_WITNESS = object()


def _compared_by_content(value):
    return isinstance(value, _MUTABLE) or hasattr(value, "__array_interface__")


def _witness(value):
    """What a launch from C compares a value compared by content with
    besides its identity (Dispatcher.register's witness), or _NO_WITNESS:
    nothing for a NumPy scalar (immutable), the items of a short list of
    scalars, a copy of a small C-contiguous NumPy array of numbers. Anything
    else would cost a launch as long to compare as the check in Python."""
    if isinstance(value, np.generic) and not isinstance(value, np.void):
        return None
    if type(value) is list and len(value) <= _WITNESS_ITEMS and all(type(item) in _SCALARS for item in value):
        return tuple(value)
    if (type(value) is np.ndarray and value.flags.c_contiguous and value.dtype.kind in "biufc"
            and value.nbytes <= _WITNESS_BYTES):
        return value.copy()
    return _NO_WITNESS


def _fingerprint_or_none(value):
    try:
        return cache.fingerprint(value)
    except TypeError:
        return None   # compared by identity only


class TracedGlobals:
    """The globals and closure values a function's traces read, as they were
    when it was traced: a launch compares them with the values now (by
    identity, and by content for lists, dicts and arrays), and on a change
    forgets the traces (policy "recompile") or raises CompileError naming
    the value and the kernel (policy "error"). The policy is the kernel's
    `on_global_change=`, else MLIRGPU_GLOBALS, else "recompile"."""

    def __init__(self, function, policy=None):
        if policy is not None and policy not in GLOBAL_POLICIES:
            raise ValueError(f"on_global_change takes one of {', '.join(map(repr, GLOBAL_POLICIES))}, "
                             f"not {policy!r}")
        self.function, self.policy = function, policy
        self.values = None

    def _record(self):
        values = read_values(self.function)
        self.values = values
        self.prints = {name: _fingerprint_or_none(v) for name, v in values.items() if _compared_by_content(v)}
        # A helper's value that has no fingerprint stays out of the key (as helpers' values all were),
        # a launch still comparing it by identity; the kernel's own must have one.
        keyed = {name: v for name, v in values.items() if "." not in name or _fingerprint_or_none(v) is not None}
        try:
            self.digest, self.details = cache.fingerprint_globals(keyed)
            self.unkeyable = None
        except TypeError as error:
            self.digest, self.details, self.unkeyable = None, None, error

    def changed(self):
        """The names whose value differs from the traced one."""
        now = read_values(self.function)
        names = sorted(set(now) | set(self.values))
        return [name for name in names
                if name not in now or name not in self.values or now[name] is not self.values[name]
                or (name in self.prints and _fingerprint_or_none(now[name]) != self.prints[name])]

    def check(self, forget):
        """Before a trace or launch: records the values at the first, and when
        they changed since, calls forget() (the traces are stale) or raises."""
        if self.values is None:
            self._record()
            return
        changed = self.changed()
        if not changed:
            return
        policy = self.policy or os.environ.get("MLIRGPU_GLOBALS", "recompile")
        if policy not in GLOBAL_POLICIES:
            raise ValueError(f"MLIRGPU_GLOBALS is one of {', '.join(GLOBAL_POLICIES)}, not {policy!r}")
        if policy == "error":
            function = self.function
            raise CompileError(f"{function.__qualname__} was compiled with the value of global "
                               f"{changed[0]!r} it had then, which has changed since: pass it as an "
                               f"argument, or let the kernel recompile (on_global_change='recompile')")
        forget()
        self._record()

    def guards(self):
        """What a launch from C checks instead (Dispatcher.register's
        guards): every global, closure cell and code object that changed()
        reads, as it is now, which check() has just found unchanged; None
        where a value has no witness to compare (a dict, a large array), so
        that such launches keep coming through check()."""
        guards = []
        for _, namespace, key, value in _reads(self.function, "", {self.function}):
            witness = _witness(value) if _tracked(value) and _compared_by_content(value) else None
            # The dispatcher reads exact dicts only: a subclass's lookup is its own code.
            if witness is _NO_WITNESS or isinstance(namespace, dict) and type(namespace) is not dict:
                return None
            guards.append((namespace, key, value, witness))
        return tuple(guards)

    def key(self):
        """(digest, details) of the traced values for the compile cache's key."""
        if self.unkeyable is not None:
            raise CompileError(f"{self.function.__qualname__}: {self.unkeyable}: the compile cache cannot tell "
                               f"when it changes; pass it as an argument or make it a plain constant")
        return self.digest, self.details


_LOAD_GLOBAL, _LOAD_NAME = opcode.opmap["LOAD_GLOBAL"], opcode.opmap["LOAD_NAME"]
# Since Python 3.11 LOAD_GLOBAL's low bit says whether a NULL is pushed too.
_GLOBAL_SHIFT = 1 if sys.version_info >= (3, 11) else 0


@functools.lru_cache(maxsize=4096)   # every launch of a kernel that reads globals asks again
def _loaded_globals(code):
    """The names `code` loads with LOAD_GLOBAL (co_names[arg >> 1], before
    Python 3.11 co_names[arg]) or LOAD_NAME (co_names[arg]). The
    instructions are read two bytes at a time, EXTENDED_ARG prefixes widening
    the next argument and inline caches reading as CACHE, as dis documents
    them: dis.get_instructions would cost a new process's first cache hit
    more than the rest of the key."""
    raw, names, found = code.co_code, code.co_names, set()
    extended = 0
    for at in range(0, len(raw), 2):
        op, arg = raw[at], raw[at + 1] | extended
        if op == opcode.EXTENDED_ARG:
            extended = arg << 8
            continue
        extended = 0
        if op == _LOAD_GLOBAL:
            found.add(names[arg >> _GLOBAL_SHIFT])
        elif op == _LOAD_NAME:
            found.add(names[arg])
    return frozenset(found)


def _is_mlirgpu_object(value):
    if isinstance(value, DType):
        return False
    module = value.__module__ if isinstance(value, (types.FunctionType, type)) else type(value).__module__
    # A layout, swizzle or MMA atom is a value the kernel computes with (two
    # kernels of one source may close over different ones): part of the key.
    if module.startswith("mlirgpu.layout.") and not isinstance(value, (types.FunctionType, type)):
        return False
    return isinstance(module, str) and module.startswith("mlirgpu")


# Operations that only read the memref operand they are given (and
# memref.dim, which reads its shape); views pass the question on to their
# result. Any other use of a parameter counts as a store: a read-only array
# is then refused rather than written.
_READS = {"memref.load", "vector.load", "vector.maskedload", "vector.transfer_read", "memref.dim",
          "vector.gather"}
_VIEWS = {"memref.subview", "memref.cast", "memref.reinterpret_cast", "memref.collapse_shape",
          "memref.expand_shape", "memref.view", "memref.transpose", "memref.extract_strided_metadata",
          "memref.assume_alignment"}
# The integer arithmetic that a parameter's address (memref.extract_aligned_pointer_as_index)
# goes through on its way to a function that only reads it.
_ADDRESS_ARITHMETIC = {"arith.addi", "arith.muli", "arith.index_cast", "arith.index_castui"}


def stored_params(module, name, address_readers=()):
    """The indices of the memref parameters of the kernel @`name` (a func.func
    or gpu.func) in the traced `module` that it may store to (conservatively:
    any use other than a read, through any chain of views, or of an address
    taken of one other than as an operand of a function in `address_readers`,
    which only read the addresses they are given)."""
    function = next(op for op in module.walk() if op.name in ("func.func", "gpu.func")
                    and op.get_attribute("sym_name").value == name)
    derived = {argument: index for index, argument in enumerate(function.regions[0].blocks[0].arguments)
               if str(argument.type).startswith("memref")}
    addresses = {}
    stored = set()
    for op in function.walk():   # pre-order: a view is defined before it is used
        for position, operand in enumerate(op.operands):
            if operand in addresses:
                index = addresses[operand]
                if op.name in _ADDRESS_ARITHMETIC:
                    addresses.update((result, index) for result in op.results)
                elif not (op.name == "func.call" and op.get_attribute("callee").value in address_readers):
                    stored.add(index)
                continue
            index = derived.get(operand)
            if index is None or (op.name in _READS and position == 0):
                continue
            if op.name in _VIEWS and position == 0:
                # A view's memrefs; extract_strided_metadata's offset, sizes and strides are numbers.
                derived.update((result, index) for result in op.results if str(result.type).startswith("memref"))
            elif op.name == "memref.extract_aligned_pointer_as_index":
                addresses[op.results[0]] = index
            else:
                stored.add(index)
    return stored


class CompiledModule:
    """A traced GPU module, compiled per chip and loaded per device."""

    #: Whether memrefs pass as bare pointers (static shapes) or as descriptors.
    bare_pointers = True

    def __init__(self):
        self._compilations = {}
        self._functions = {}

    def compilation(self, chip=None):
        """The Compilation (mlirgpu.compiler) of the GPU module for `chip`."""
        chip = chip or default_chip()
        compilation = self._compilations.get(chip)
        if compilation is None:
            compilation = self._compilations[chip] = Compilation(self.gpu_module(), chip,
                                                                 bare_pointers=self.bare_pointers)
        return compilation

    @user_frames
    def ptx(self, chip=None):
        """PTX text for `chip` (default: the current GPU's, else sm_90a). Needs no GPU."""
        return self.compilation(chip).ptx

    @user_frames
    def cubin(self, chip=None):
        """cubin bytes for `chip` (default: the current GPU's, else sm_90a). Needs no GPU.
        Served from the compile cache (memory, then disk) when the source,
        the globals it reads, the generics, chip and options match."""
        if toolkit.PTXAS is None:
            raise CompileError(NO_PTXAS)
        return self.image(chip)

    def image(self, chip=None):
        """What a GPU of `chip` loads: the cubin, or where there is no ptxas
        the PTX for the driver's JIT (Compilation.image_format says which).
        Served from the compile cache (memory, then disk) when the source,
        the globals it reads, the generics, chip and options match."""
        chip = chip or default_chip()
        self.check_globals()
        return cache.default_cache().get_or_compile(self.cache_key(chip), lambda: self.compilation(chip).image)

    def cache_key(self, chip):
        """The compile cache's key of this module's cubin for `chip`: its
        globals part the values the module's trace read, not those of now."""
        function = self.source_function
        self.check_globals()
        digest, details = self.traced_globals.key()
        generics, options = self.cache_fields()
        return cache.CacheKey({"kernel": f"{function.__module__}.{function.__qualname__}",
                               "source": source_digest(function), "globals": digest, "generics": generics,
                               "chip": chip, "options": options}, details={"globals": details})

    def forget_traces(self):
        """Drops what was traced, compiled and loaded: a global it read has changed."""
        self._compilations.clear()
        self._functions.clear()

    def stored_params(self):
        """The indices of the array parameters the kernel may store to (None: any)."""
        return None

    def function(self, exact_stores=False):
        """The kernel, loaded on the current device. It refuses a read-only
        array for any array parameter unless `exact_stores`: then it is
        loaded knowing which parameters the kernel stores to (found in its IR,
        which takes a trace, so only launches given read-only arrays ask)."""
        device = cuda.current_device()
        loaded = self._functions.get((device, exact_stores))
        if loaded is None:
            image = self.image(cuda.Device(device).chip)
            stores = self.stored_params() if exact_stores else None
            loaded = self._functions[device, exact_stores] = cuda.load_module(image).get_function(
                self.name, params=self.function_params(), stores=None if stores is None else sorted(stores))
        return loaded
