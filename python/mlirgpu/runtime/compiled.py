"""One way from a traced module to a loaded GPU function, shared by
@mg.kernel specializations and @mg.vectorize's GPU kernels.

    compiled.compilation(chip)   # compiler.Compilation: every stage, inspectable
    compiled.ptx(chip), compiled.cubin(chip)
    compiled.image(chip)         # what the GPU loads (cubin, else PTX), through the compile cache
    compiled.function()          # loaded on the current device, once per device

A subclass gives `name` (the kernel's symbol), `source_function` (the Python
function it was traced from, which the cache key names), `gpu_module()`,
`cache_fields()` and `function_params()`.
"""
import hashlib
import linecache
import opcode
import sys
import types

from .. import cuda
from .._mlirgpu import CompileError, DType
from ..compiler import cache, toolkit
from ..compiler.nvvm import NO_PTXAS, Compilation
from ..frontend.rewrite import code_objects, source_unavailable
from ..language.generics import is_symbol

__all__ = ["CompiledModule", "default_chip", "read_values", "source_digest"]


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
    generics: what compiling it depends on besides its source."""
    code = function.__code__
    # The globals its code loads: co_names also holds attribute names (the x of thread_idx.x), which
    # would drag an unrelated global of that name into the key.
    names = set()
    for c in code_objects(code):
        names |= _loaded_globals(c)
    values = {}
    for name in sorted(names):
        if name in function.__globals__:
            values[name] = function.__globals__[name]
    closure = zip(code.co_freevars, (c.cell_contents for c in function.__closure__ or ()))
    values.update(closure)
    # mlirgpu's own names (mg.thread_idx, mg.constant, ...) change only
    # with mlirgpu, which the cache's entries record already.
    return {k: v for k, v in values.items() if not is_symbol(v) and not _is_mlirgpu_object(v)}


_LOAD_GLOBAL, _LOAD_NAME = opcode.opmap["LOAD_GLOBAL"], opcode.opmap["LOAD_NAME"]
# Since Python 3.11 LOAD_GLOBAL's low bit says whether a NULL is pushed too.
_GLOBAL_SHIFT = 1 if sys.version_info >= (3, 11) else 0


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
    return found


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


def stored_params(module, name):
    """The indices of the memref parameters of the kernel @`name` (a func.func
    or gpu.func) in the traced `module` that it may store to (conservatively:
    any use other than a read, through any chain of views)."""
    function = next(op for op in module.walk() if op.name in ("func.func", "gpu.func")
                    and op.get_attribute("sym_name").value == name)
    derived = {argument: index for index, argument in enumerate(function.regions[0].blocks[0].arguments)
               if str(argument.type).startswith("memref")}
    stored = set()
    for op in function.walk():   # pre-order: a view is defined before it is used
        for position, operand in enumerate(op.operands):
            index = derived.get(operand)
            if index is None or (op.name in _READS and position == 0):
                continue
            if op.name in _VIEWS and position == 0:
                derived.update((result, index) for result in op.results)
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

    def ptx(self, chip=None):
        """PTX text for `chip` (default: the current GPU's, else sm_90a). Needs no GPU."""
        return self.compilation(chip).ptx

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
        return cache.default_cache().get_or_compile(self.cache_key(chip), lambda: self.compilation(chip).image)

    def cache_key(self, chip):
        """The compile cache's key of this module's cubin for `chip`."""
        function = self.source_function
        try:
            digest, details = cache.fingerprint_globals(read_values(function))
        except TypeError as error:
            raise CompileError(f"{function.__qualname__}: {error}: the compile cache cannot tell when it "
                               f"changes; pass it as an argument or make it a plain constant") from None
        generics, options = self.cache_fields()
        return cache.CacheKey({"kernel": f"{function.__module__}.{function.__qualname__}",
                               "source": source_digest(function), "globals": digest, "generics": generics,
                               "chip": chip, "options": options}, details={"globals": details})

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
