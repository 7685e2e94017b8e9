"""Writing an exported library: the variants of each kernel, their images and
CPU builds, the generated C source around runtime.c, and the compile.

    build([sgemm], "out/", chips=("sm_80", "sm_90a"), name="kernels")

The generated source holds, per kernel, one typed C function that packs its
arguments as the GPU launch takes them and hands them to runtime.c with the
kernel's tables (variants, the sizes each serves, images, CPU entry points);
everything else is runtime.c, shipped with the package and compiled in.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import _mlirgpu, ir
from .._mlirgpu import CompileError, TensorMap
from ..compiler import toolkit
from ..language.generics import DIVISOR, Dynamic
from ..runtime.autotune import Autotuner
from ..runtime.cpu import PIPELINE
from ..runtime.kernel import Kernel, Specialization
from ..runtime.tensormap import encode_arguments
from ..targets.cpu import INDICES, CpuLowering

__all__ = ["build", "C_TYPES", "RUNTIME"]

RUNTIME = Path(__file__).with_name("runtime.c")

#: Each dtype's C type, in the header and for the CPU builds' scalars.
C_TYPES = {"bool_": "uint8_t", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
           "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t", "f16": "uint16_t",
           "bf16": "uint16_t", "f32": "float", "f64": "double", "index": "int64_t"}
# Scalars a CPU build takes by value as the C type above (f16 and bf16 travel in float registers).
_CPU_SCALARS = set(C_TYPES) - {"f16", "bf16"}
_CHIP = re.compile(r"sm_(\d+)(a?)")
_LAUNCH_EXPRESSION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|[-+*/%() ]")
_RUNTIME_NAMES = {"last_error", "backend", "alloc", "free", "copy_to_device", "copy_to_host", "signatures"}
# What runtime.c gives a CPU build besides its arithmetic: a block's threads as fibers, its shared
# memory, mbarriers and TMA copies. A build that calls anything else of the CPU backend's runtime
# (warp operations, wgmma, printf) is left out of the library.
_CPU_RUNTIME = {"mg_cpu_barrier", "_mlir_ciface_mg_cpu_shared", "mg_cpu_mbarrier_init", "mg_cpu_mbarrier_arrive",
                "mg_cpu_mbarrier_wait", "mg_cpu_tma_load", "mg_cpu_tma_store"}
_MAP_KEYS = {"dtype", "shape", "box", "swizzle", "strides", "element_strides", "oob_fill", "l2_promotion"}


class _Sizes(list):
    """The kernel's sizes, which a tensor map's shape may name, and the names its parameters take."""

    def __init__(self, sizes, parameters):
        super().__init__(sizes)
        self.taken = set(parameters)


class _TensorMap:
    """A tensor-map parameter of an exported kernel. The kernel's code fixes
    the element type, box, swizzle and fill (`description`, as mg.tensor_map
    takes them); the function takes the array's pointer and, as sizes, what
    the export leaves open of its shape and row strides (in elements): an
    entry None is a parameter <name>_extent<d> (<name>_stride<d>), a string
    names a size (one of the kernel's, or a parameter of its own, which
    every map naming it shares), an int is fixed. Strides left out are the
    row-major array's."""

    def __init__(self, kernel, name, description, sizes):
        where = f"mg.export(tensor_maps=...): {kernel}'s {name}"
        if not isinstance(description, dict) or set(description) - _MAP_KEYS or \
                not {"dtype", "shape", "box"} <= set(description):
            optional = ", ".join(sorted(_MAP_KEYS - {"dtype", "shape", "box"}))
            raise ValueError(f"{where} takes dtype, shape, box and optionally {optional}, got {description!r}")
        self.name, self.parameters = name, []   # the sizes it adds to the function's parameters
        try:
            self.dtype = _mlirgpu.dtype(description["dtype"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {error}") from None
        self.shape = self._entries(where, "shape", description["shape"], None, sizes, "extent")
        rank = len(self.shape)
        strides = description.get("strides")
        self.strides = (None if strides is None else
                        self._entries(where, "strides", strides, rank - 1, sizes, "stride"))
        # The driver's checks, on a stand-in of the array (each open size one box): what the
        # export fixes must be encodable; what the call gives is checked by the library.
        box = description["box"]
        stand_in = [size if isinstance(size, int) else b for size, b in
                    zip(self.shape, box if isinstance(box, (tuple, list)) else (box,))]
        element_strides, running = [], 1
        for size in reversed(stand_in):
            element_strides.append(running)
            running *= size
        byte_strides = tuple(s * self.dtype.itemsize for s in reversed(element_strides))
        if self.strides is not None:
            byte_strides = tuple(s * self.dtype.itemsize if isinstance(s, int) else b
                                 for s, b in zip(self.strides, byte_strides)) + byte_strides[-1:]
        try:
            self.encoding = encode_arguments(tuple(stand_in), byte_strides, self.dtype, 0, box,
                                             description.get("swizzle", "128B"), description.get("element_strides"),
                                             description.get("oob_fill", "zero"), None,
                                             description.get("l2_promotion", "128B"))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def _entries(self, where, what, entries, rank, sizes, kind):
        entries = tuple(entries) if isinstance(entries, (tuple, list)) else (entries,)
        if rank is not None and len(entries) != rank or not 1 <= len(entries) <= 5 and rank is None:
            raise ValueError(f"{where}: {what} has {rank if rank is not None else '1 to 5'} entries, got {entries!r}")
        for entry in entries:
            if not (entry is None or (isinstance(entry, int) and not isinstance(entry, bool) and entry > 0) or
                    (isinstance(entry, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", entry) and
                     entry not in sizes.taken)):
                raise ValueError(f"{where}: each entry of {what} is a positive int, None (a parameter "
                                 f"{self.name}_{kind}<d>) or a size's name (one of the kernel's, "
                                 f"{', '.join(sizes) or 'none'}, or a new parameter of the function), not {entry!r}")
        self.parameters += [f"{self.name}_{kind}{d}" if e is None else e for d, e in enumerate(entries)
                            if e is None or (isinstance(e, str) and e not in sizes)]
        return entries

    def c_expressions(self, entries, kind):
        """C expressions of the shape's (kind "extent") or strides' entries, in the array's order."""
        return [f"{self.name}_{kind}{d}" if e is None else f"INT64_C({e})" if isinstance(e, int) else e
                for d, e in enumerate(entries)]

    def table(self, symbol):
        """The C table of what the export fixes (mgx_map): innermost first, as the driver takes it."""
        e = self.encoding
        box = ", ".join(map(str, e["box"]))
        strides = ", ".join(map(str, e["element_strides"]))
        return (f'static const mgx_map {symbol} = {{"{self.name}", {e["data_type"]}, {len(self.shape)}, '
                f'{self.dtype.itemsize}, {{{box}}}, {{{strides}}}, {e["swizzle"]}, {e["l2_promotion"]}, '
                f'{e["oob_fill"]}}};')


class _Exported:
    """One kernel of the library: its specializations (one per variant of
    each set of static generic values), the C function's parameters, and how
    the launch's parameters follow from them. `tuned`: the generics an
    autotuning table gives per set of sizes (not parameters of the function;
    its launch rule may name them)."""

    def __init__(self, kernel: Kernel, bindings: list[dict], launch: dict | None, tuned=(), tensor_maps=None):
        self.kernel, self.name, self.tuned = kernel, kernel.__name__, list(tuned)
        dtype_generics = kernel.dtype_generics()
        self.size_names = [g for g in kernel.generics if g not in dtype_generics and g not in self.tuned]
        self.variants = []     # (specialization, rules)
        dynamic = list(kernel.dynamic)
        for binding in bindings:
            for aligned, multiples in itertools.product((True, False) if dynamic else (False,),
                                                        itertools.product((DIVISOR, 1), repeat=len(dynamic))):
                values = {**binding, **{g: Dynamic(m) for g, m in zip(dynamic, multiples)}}
                spec = kernel.specialize(values, aligned)
                rules = [_rule(spec.values[g]) for g in self.size_names]
                self.variants.append((spec, rules))
        first = self.variants[0][0]
        for spec, _ in self.variants[1:]:
            if any(spec.values[g] != first.values[g] for g in dtype_generics):
                raise ValueError(f"mg.export: the specializations of {self.name} differ in element types; a C "
                                 f"function has one set of pointer types: export each under a kernel of its own")
        self.params = first._param_types()
        self.extents = [f"{p.name}_extent{d}" for p, shape, _ in self.params if shape is not None
                        for d, size in enumerate(p.memref.shape) if size is None]
        self.maps = self._tensor_maps(tensor_maps or {})
        stored = set().union(*(map(_owners(spec).__getitem__, spec.stored_params()) for spec, _ in self.variants))
        # An array annotated .readonly() is const too: storing to it does not compile, a cp.async from it reads.
        self.readonly = {i for i, (p, shape, _) in enumerate(self.params)
                         if shape is not None and (i not in stored or p.memref.is_readonly)}
        # A size that several maps name is one parameter.
        self.map_sizes = list(dict.fromkeys(name for m in self.maps.values() for name in m.parameters))
        self.launch = _launch_rule(self.name, launch, self.size_names + self.extents + self.map_sizes + self.tuned)
        if self.tuned and self.launch is None:
            raise ValueError(f"mg.export: {self.name} is autotuned: its launch shape depends on the tuned "
                             f"config, so give it a rule in launch= on its sizes and {', '.join(self.tuned)}")

    def _tensor_maps(self, descriptions):
        """{parameter index: _TensorMap} of the kernel's tensor-map parameters, which `descriptions`
        ({parameter name: what mg.tensor_map would take}) must describe, all and only those."""
        names = [p.name for p, _, dtype in self.params if dtype is TensorMap]
        if set(descriptions) != set(names):
            raise ValueError(f"mg.export: {self.name} takes tensor maps ({', '.join(names) or 'none'}): "
                             f"tensor_maps={{{self.name!r}: ...}} describes each of them (its dtype, shape, box, "
                             f"swizzle, as the kernel reads it), got {sorted(descriptions)}")
        sizes = _Sizes(self.size_names + self.extents, [p.name for p, _, _ in self.params])
        return {i: _TensorMap(self.name, p.name, descriptions[p.name], sizes)
                for i, (p, _, dtype) in enumerate(self.params) if dtype is TensorMap}

    def c_parameters(self) -> list[tuple[str, str]]:
        """(C type, name) of the function's parameters after the stream, grid and block aside."""
        result = []
        for i, (p, shape, dtype) in enumerate(self.params):
            if i in self.maps:
                result.append((C_TYPES.get(self.maps[i].dtype.name, "uint8_t") + " *", p.name))
            elif shape is None:
                result.append((C_TYPES[dtype.name], p.name))
            else:
                result.append((("const " if i in self.readonly else "") + C_TYPES[dtype.name] + " *", p.name))
        return result + [("int64_t", name) for name in self.size_names + self.extents + self.map_sizes]

    def dynamic_extents(self) -> list[str]:
        """C expressions of every dynamic extent, in launch order: a dynamic generic's
        name, or the extent parameter of a size annotated None."""
        return [f"{p.name}_extent{d}" if p.memref.shape[d] is None else p.memref.shape[d].name
                for p, shape, _ in self.params if shape is not None for d, size in enumerate(shape) if size is None]

    def launch_operands(self) -> list[str]:
        """C expressions of what the launch's parameter array points at, in the order the
        kernel takes them: an array's pointer, then its dynamic extents (in mgx_extents)."""
        operands, extents = [], itertools.count()
        for i, (p, shape, _) in enumerate(self.params):
            # A tensor map's 128 bytes, encoded into the call's mgx_map<i>, by value.
            operands.append(f"(void *)mgx_map{i}" if i in self.maps else f"(void *)&{p.name}")
            if shape is not None:
                operands += [f"&mgx_extents[{next(extents)}]" for size in shape if size is None]
        return operands


def _owners(spec):
    """The parameter each argument of the kernel's function belongs to (an array's dynamic extents follow it)."""
    owners = []
    for i, entry in enumerate(spec.function_params()):
        owners += [i] * (1 + len(entry[1]) if isinstance(entry, tuple) else 1)
    return owners


def _rule(value):
    """What a variant needs of a size: a value (> 0), a multiple of a divisor (< 0), or nothing (0)."""
    if isinstance(value, Dynamic):
        return -value.multiple if value.multiple > 1 else 0
    return value


def _launch_rule(name, launch, sizes):
    """The kernel's own launch shape ({"grid": C expressions of its sizes, "block": the same,
    "shared_mem": one}, as strings), or None: the function takes grid, block and shared_mem."""
    if launch is None or name not in launch:
        return None
    rule = dict(launch[name])
    unknown = set(rule) - {"grid", "block", "shared_mem"}
    if unknown or "grid" not in rule or "block" not in rule:
        raise ValueError(f"mg.export(launch=...): {name}'s rule takes grid, block and optionally shared_mem, "
                         f"got {sorted(rule)}")
    grid, block = (tuple(rule[k]) + (1,) * (3 - len(rule[k])) for k in ("grid", "block"))
    if len(grid) != 3 or len(block) != 3:
        raise ValueError(f"mg.export(launch=...): {name}'s grid and block have 1 to 3 entries")
    shape = {"grid": grid, "block": block, "shared_mem": (rule.get("shared_mem", 0),)}
    for part, entries in shape.items():
        least = 1 if part == "block" else 0
        for entry in entries:
            if isinstance(entry, bool) or not isinstance(entry, (int, str)) or (isinstance(entry, int) and
                                                                                  entry < least):
                raise ValueError(f"mg.export(launch=...): {name}'s {part} takes ints and C expressions of its "
                                 f"sizes, got {entry!r}")
            text = str(entry)
            tokens = _LAUNCH_EXPRESSION.findall(text)
            names = {t for t in tokens if t[0].isalpha() or t[0] == "_"}
            if "".join(tokens) != text or names - set(sizes):
                raise ValueError(f"mg.export(launch=...): {name}'s {part} entry {text!r} is not arithmetic on its "
                                 f"sizes ({', '.join(sizes)})")
    return {part: [str(e) for e in entries] for part, entries in shape.items()}


def _group(kernels, tuned):
    """{kernel: ([static generic values, ...], [tuned generics])} of the export's entries, in
    their order; an autotuned kernel's entries are its table's (`tuned`'s, else its recorded one)."""
    if isinstance(kernels, (Kernel, Specialization, Autotuner)):
        kernels = [kernels]
    kernels = list(kernels)
    unknown = set(tuned or {}) - {k.__name__ for k in kernels if isinstance(k, Autotuner)}
    if unknown:
        raise ValueError(f"mg.export(tuned=...) names kernels that are not exported autotuned: {sorted(unknown)}")
    groups = {}
    for entry in kernels:
        names = []
        if isinstance(entry, Specialization):
            kernel = entry.kernel
            entries = [{k: v for k, v in entry.values.items() if k not in kernel.dynamic}]
        elif isinstance(entry, Autotuner):
            kernel = entry.kernel
            names = [g for g in kernel.generics if g in entry.configs[0]]
            entries = _tuned_entries(entry, names, (tuned or {}).get(entry.__name__))
        elif isinstance(entry, Kernel):
            kernel, entries = entry, [{}]
            static = [g for g in kernel.generics if g not in kernel.dynamic]
            if static:
                raise ValueError(f"mg.export: {kernel.__name__} has generics that are not dynamic "
                                 f"({', '.join(static)}): export its specializations, e.g. {kernel.__name__}[...]")
        else:
            raise TypeError(f"mg.export takes kernels and specializations, not {type(entry).__name__}: an "
                            f"@mg.kernel, a kernel[...] or an @mg.autotune over a kernel")
        bindings, known = groups.setdefault(kernel, ([], names))
        if known != names:
            raise ValueError(f"mg.export: {kernel.__name__} is given both autotuned and not: export one of them")
        bindings += [binding for binding in entries if binding not in bindings]
    if not groups:
        raise ValueError("mg.export needs at least one kernel")
    return groups


def _tuned_entries(tuner, names, table):
    """The generic values of each entry of an autotuning table ({key values: config}, the key's
    values in tuner.key's order), or of the tuner's choices recorded for the current GPU."""
    name = tuner.__name__
    table = tuner.table() if table is None else table
    if not isinstance(table, dict) or not table:
        raise ValueError(f"mg.export: {name} is autotuned and has no table: tune it on the GPU (launch it there) "
                         f"first, or give tuned={{{name!r}: {{({', '.join(tuner.key)}): config, ...}}}}")
    static = [g for g in tuner.kernel.generics if g not in tuner.kernel.dynamic]
    entries = []
    for key, config in table.items():
        key = key if isinstance(key, tuple) else (key,)
        if len(key) != len(tuner.key) or not isinstance(config, dict) or set(config) != set(names):
            raise ValueError(f"mg.export(tuned=...): {name}'s table maps the values of ({', '.join(tuner.key)}) to "
                             f"a config of {', '.join(names)}, got {key!r}: {config!r}")
        binding = {**dict(zip(tuner.key, key)), **config}
        missing = [g for g in static if g not in binding]
        if missing:
            raise ValueError(f"mg.export: {name}'s autotuning key leaves {', '.join(missing)} unknown: a tuned "
                             f"entry must give every generic that is not dynamic (its key: {', '.join(tuner.key)})")
        entries.append(binding)
    return entries


def _chip_capability(chip):
    match = _CHIP.fullmatch(chip) if isinstance(chip, str) else None
    if match is None:
        raise ValueError(f"mg.export: {chip!r} is not a chip name such as 'sm_80' or 'sm_90a'")
    return int(match.group(1)), bool(match.group(2))


def _images(spec, chips):
    """(chip, capability, arch-specific, is PTX, bytes) of a variant: a cubin per chip (PTX where
    there is no ptxas), and PTX for the newest chip that is not arch-specific, for newer GPUs."""
    with_ptxas = toolkit.PTXAS is not None
    images = []
    for chip in chips:
        capability, specific = _chip_capability(chip)
        data = spec.cubin(chip=chip) if with_ptxas else spec.ptx(chip=chip).encode() + b"\0"
        images.append((chip, capability, specific, not with_ptxas, data))
    portable = [c for c in chips if not _chip_capability(c)[1]]
    if with_ptxas and portable:
        chip = max(portable, key=lambda c: _chip_capability(c)[0])
        images.append((chip, _chip_capability(chip)[0], False, True, spec.ptx(chip=chip).encode() + b"\0"))
    return images


def _find_llc():
    """LLVM's static compiler, which turns the CPU builds' LLVM IR into objects; None if absent."""
    for candidate in (os.environ.get("MLIRGPU_LLC"), shutil.which("llc-22"), shutil.which("llc"),
                      "/usr/lib/llvm-22/bin/llc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _cpu_object(spec, symbol, exported, directory, llc):
    """The CPU build of `spec` as (an object defining _mlir_ciface_<symbol>, whether its threads
    run as fibers, its static shared bytes), or None where the kernel needs more of the CPU
    backend's runtime than runtime.c has (_CPU_RUNTIME)."""
    if any(shape is None and dtype is not TensorMap and dtype.name not in _CPU_SCALARS
           for _, shape, dtype in exported.params):
        return None
    traced = spec.trace(CpuLowering(frozenset(), runtime=False), name=symbol)
    lowered = ir.Module.parse(_mlirgpu.lower(traced, PIPELINE), context=traced.context)
    text = _mlirgpu.translate_to_llvm_ir(lowered)
    called = set(re.findall(r"^declare .*@((?:_mlir_ciface_)?mg_cpu_\w+)\(", text, re.MULTILINE))
    if called - _CPU_RUNTIME:
        return None
    source, obj = directory / f"{symbol}.ll", directory / f"{symbol}.o"
    source.write_text(text)
    _run([llc, "-O3", "-filetype=obj", "-relocation-model=pic", str(source), "-o", str(obj)], "llc")
    return obj, bool(called), traced.operation.attributes["mg.cpu.static_shared"].value


def _run(command, what):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"mg.export: {what} failed ({' '.join(command)}):\n{result.stderr.strip()}")


def _bytes(name, data):
    rows = [", ".join(str(b) for b in data[i:i + 32]) for i in range(0, len(data), 32)]
    return f"static const unsigned char {name}[{len(data)}] = {{\n    " + ",\n    ".join(rows) + "\n};\n"


def _cpu_thunk(exported, spec, symbol):
    """The C function that calls a CPU build with the launch's parameter array."""
    lines, arguments, declared, slot = [], [], [], 0
    for i, (p, shape, dtype) in enumerate(spec._param_types()):
        if dtype is TensorMap:
            # The map's 128 bytes, which the CPU build reads through a pointer.
            arguments.append(f"p[{slot}]")
            declared.append("void *")
            slot += 1
            continue
        if shape is None:
            ctype = C_TYPES[dtype.name]
            arguments.append(f"*({ctype} *)p[{slot}]")
            declared.append(ctype)
            slot += 1
            continue
        pointer, slot = slot, slot + 1
        sizes = []
        for size in shape:
            if size is None:
                sizes.append(f"*(int64_t *)p[{slot}]")
                slot += 1
            else:
                sizes.append(f"INT64_C({size})")
        lines.append(f"    int64_t d{i}[{3 + 2 * len(shape)}], s{i}[{len(shape)}] = {{{', '.join(sizes)}}};")
        lines.append(f"    mgx_descriptor(d{i}, *(void **)p[{pointer}], {len(shape)}, s{i});")
        arguments.append(f"d{i}")
        declared.append("int64_t *")
    arguments += [f"ix[{k}]" for k in range(len(INDICES))]
    declared += ["int64_t"] * len(INDICES)
    return (f"void _mlir_ciface_{symbol}({', '.join(declared)});\n"
            f"static void cpu_{symbol}(void **p, const int64_t ix[12])\n{{\n" + "\n".join(lines) +
            f"\n    _mlir_ciface_{symbol}({', '.join(arguments)});\n}}\n")


def _signature(prefix, exported):
    """The C declaration of a kernel's function."""
    parameters = ["void *stream"] + [f"{t}{'' if t.endswith('*') else ' '}{n}" for t, n in exported.c_parameters()]
    if exported.launch is None:
        parameters += [f"{prefix}_dim3 grid", f"{prefix}_dim3 block", "uint32_t shared_mem"]
    return f"{prefix}_status {prefix}_{exported.name}({', '.join(parameters)})"


def _header(prefix, kernels):
    guard = f"{prefix.upper()}_H"
    lines = [f"/* {prefix}: kernels exported by mlirgpu. Each function launches its kernel on `stream` (a",
             " * CUstream; NULL: the default stream) with device pointers, sizes and scalars, and returns",
             f" * {prefix.upper()}_SUCCESS or an error whose message {prefix}_last_error() gives. Where there is no",
             " * GPU (or MLIRGPU_BACKEND=cpu) the library's CPU builds run instead, on host pointers. */",
             f"#ifndef {guard}", f"#define {guard}", "", "#include <stddef.h>", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             "typedef enum {", f"    {prefix.upper()}_SUCCESS = 0,",
             f"    {prefix.upper()}_INVALID_VALUE = 1,   /* a size, grid or argument the kernel cannot take */",
             f"    {prefix.upper()}_NO_VARIANT = 2,      /* no exported specialization serves the sizes */",
             f"    {prefix.upper()}_NO_IMAGE = 3,        /* no image runs on this GPU */",
             f"    {prefix.upper()}_NO_BACKEND = 4,      /* no GPU, and no CPU build of the kernel */",
             f"    {prefix.upper()}_CUDA_ERROR = 5,      /* the CUDA driver failed */",
             f"    {prefix.upper()}_KERNEL_FAULT = 6     /* a CPU build found its kernel misusing shared memory, an "
             f"mbarrier or a TMA copy */",
             f"}} {prefix}_status;", "",
             f"typedef struct {{ uint32_t x, y, z; }} {prefix}_dim3;", "",
             "/* The message of this thread's last failed call. */",
             f"const char *{prefix}_last_error(void);",
             '/* "cuda" or "cpu": where the functions run, and what memory they take. */',
             f"const char *{prefix}_backend(void);",
             "/* Memory of the backend's kind (device memory on the GPU), and copies to and from it. */",
             f"{prefix}_status {prefix}_alloc(void **pointer, size_t bytes);",
             f"{prefix}_status {prefix}_free(void *pointer);",
             f"{prefix}_status {prefix}_copy_to_device(void *device, const void *host, size_t bytes);",
             f"{prefix}_status {prefix}_copy_to_host(void *host, const void *device, size_t bytes);", ""]
    for exported in kernels:
        rule = exported.launch
        how = (f"grid ({', '.join(rule['grid'])}), block ({', '.join(rule['block'])})" if rule else
               "the grid, block and dynamic shared memory given")
        lines += [f"/* {exported.name}: launched with {how}. */", _signature(prefix, exported) + ";", ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def _source(prefix, kernels, cpu_symbols, images, metadata):
    """The generated C source: the runtime, each kernel's tables and function."""
    out = [f"/* Generated by mlirgpu.export: {prefix}'s tables and functions around mlirgpu's runtime. */",
           '#include "runtime.c"', f'#include "{prefix}.h"', ""]
    for k, exported in enumerate(kernels):
        variant_rows = []
        for v, (spec, rules) in enumerate(exported.variants):
            symbol, fibers, static_shared = cpu_symbols[k][v] or (None, False, 0)
            image_rows = []
            for j, (chip, capability, specific, is_ptx, data) in enumerate(images[k][v]):
                out.append(_bytes(f"image_{k}_{v}_{j}", data))
                image_rows.append(f'{{"{chip}", {capability}, {int(specific)}, {int(is_ptx)}, image_{k}_{v}_{j}, '
                                  f'{len(data)}}}')
            out.append(f"static const mgx_image images_{k}_{v}[] = {{{', '.join(image_rows)}}};")
            out.append(f"static const int64_t rules_{k}_{v}[] = {{{', '.join(map(str, rules)) or '0'}}};")
            tuned = ", ".join(str(spec.values[g]) for g in exported.tuned)
            out.append(f"static const int64_t tuned_{k}_{v}[] = {{{tuned or '0'}}};")
            if symbol:
                out.append(_cpu_thunk(exported, spec, symbol))
            description = json.dumps(repr(spec).strip("<>"))
            variant_rows.append(f'{{{description}, "{exported.name}", rules_{k}_{v}, tuned_{k}_{v}, '
                                f'{int(spec.aligned)}, {len(image_rows)}, '
                                f'images_{k}_{v}, {f"cpu_{symbol}" if symbol else "NULL"}, {int(fibers)}, '
                                f'{static_shared}, {{NULL}}}}')
        names = ", ".join(f'"{n}"' for n in exported.size_names) or "NULL"
        out += [m.table(f"map_{k}_{i}") for i, m in exported.maps.items()]
        out += [f"static mgx_variant variants_{k}[] = {{\n    " + ",\n    ".join(variant_rows) + "\n};",
                f"static const char *const size_names_{k}[] = {{{names}}};",
                f'static const mgx_kernel kernel_{k} = {{"{exported.name}", {len(exported.size_names)}, '
                f"size_names_{k}, {len(exported.variants)}, variants_{k}}};", ""]
        sizes = ", ".join(exported.size_names) or "0"
        extents = exported.dynamic_extents()
        rule = exported.launch
        arrays = [f"(uintptr_t){p.name}" for p, shape, _ in exported.params if shape is not None]
        body = [_signature(prefix, exported), "{"]
        # The kernel's tensor maps, by value: 64-byte aligned, as the driver wants a CUtensorMap.
        body += [f"    _Alignas(64) unsigned char mgx_map{i}[MGX_TENSOR_MAP_BYTES];" for i in exported.maps]
        body += [
                f"    const int64_t mgx_sizes[] = {{{sizes}}};",
                f"    const int mgx_aligned = ({' | '.join(arrays) or '0'}) % MGX_ALIGNMENT == 0;",
                f"    int64_t mgx_extents[] = {{{', '.join(extents) or '0'}}};",
                f"    void *mgx_params[] = {{{', '.join(exported.launch_operands())}}};"]
        body.append(f"    if (mgx_check_sizes(&kernel_{k}, mgx_sizes) != MGX_SUCCESS) return ({prefix}_status)"
                    f"MGX_INVALID_VALUE;")
        for name in exported.extents + exported.map_sizes:
            body.append(f'    if ({name} <= 0) return ({prefix}_status)mgx_fail(MGX_INVALID_VALUE, '
                        f'"{exported.name}: {name} is %lld; sizes are positive", (long long){name});')
        for i, (p, shape, _) in enumerate(exported.params):
            if shape is not None or i in exported.maps:
                body.append(f'    if ({p.name} == NULL) return ({prefix}_status)mgx_fail(MGX_INVALID_VALUE, '
                            f'"{exported.name}: {p.name} is NULL");')
        body += ["    mgx_variant *mgx_v;",
                 f"    int mgx_status = mgx_variant_for(&kernel_{k}, mgx_sizes, mgx_aligned, &mgx_v);",
                 f"    if (mgx_status != MGX_SUCCESS) return ({prefix}_status)mgx_status;"]
        # The tuned generics' values in the variant the sizes chose, which the launch rule may name.
        body += [f"    const int64_t {g} = mgx_v->tuned[{i}];" for i, g in enumerate(exported.tuned)]
        body += [f"    (void){g};" for g in exported.tuned]
        for i, m in exported.maps.items():
            shape = ", ".join(m.c_expressions(m.shape, "extent"))
            body.append(f"    const int64_t mgx_shape{i}[] = {{{shape}}};")
            strides = f"mgx_strides{i}" if m.strides else "NULL"
            if m.strides:
                strides_c = ", ".join(m.c_expressions(m.strides, "stride"))
                body.append(f"    const int64_t mgx_strides{i}[] = {{{strides_c}}};")
            body += [f"    mgx_status = mgx_encode_map(&kernel_{k}, &map_{k}_{i}, {m.name}, mgx_shape{i}, {strides}, "
                     f"mgx_map{i});",
                     f"    if (mgx_status != MGX_SUCCESS) return ({prefix}_status)mgx_status;"]
        if rule:
            body += [f"    const unsigned mgx_grid[3] = {{{', '.join(f'(unsigned)({g})' for g in rule['grid'])}}};",
                     f"    const unsigned mgx_block[3] = {{{', '.join(f'(unsigned)({b})' for b in rule['block'])}}};",
                     f"    const unsigned shared_mem = (unsigned)({rule['shared_mem'][0]});"]
        else:
            body += ["    const unsigned mgx_grid[3] = {grid.x, grid.y, grid.z};",
                     "    const unsigned mgx_block[3] = {block.x, block.y, block.z};"]
        body += ["    (void)mgx_extents;",
                 f"    return ({prefix}_status)mgx_launch(&kernel_{k}, mgx_v, stream, mgx_params, mgx_grid, mgx_block, "
                 f"shared_mem);", "}", ""]
        out += body
    out += [f"const char *{prefix}_last_error(void) {{ return mgx_last_error(); }}",
            f'const char *{prefix}_backend(void) {{ return mgx_backend_is_cuda() ? "cuda" : "cpu"; }}',
            f"{prefix}_status {prefix}_alloc(void **pointer, size_t bytes) {{ return ({prefix}_status)"
            f"mgx_alloc(pointer, bytes); }}",
            f"{prefix}_status {prefix}_free(void *pointer) {{ return ({prefix}_status)mgx_free(pointer); }}",
            f"{prefix}_status {prefix}_copy_to_device(void *device, const void *host, size_t bytes) "
            f"{{ return ({prefix}_status)mgx_copy(device, host, bytes, 1); }}",
            f"{prefix}_status {prefix}_copy_to_host(void *host, const void *device, size_t bytes) "
            f"{{ return ({prefix}_status)mgx_copy(host, device, bytes, 0); }}",
            "/* What mg.load_library reads: each function's parameters. */",
            f"const char {prefix}_signatures[] = {json.dumps(json.dumps(metadata))};", ""]
    return "\n".join(out)


def _metadata(prefix, kernels):
    return {"prefix": prefix, "kernels": [{
        "name": e.name,
        "params": [{"name": p.name, "kind": "map", "dtype": e.maps[i].dtype.name, "rank": len(e.maps[i].shape),
                    "strided": e.maps[i].strides is not None}
                   if i in e.maps else
                   {"name": p.name, "kind": "scalar" if shape is None else "array", "dtype": dtype.name,
                    "rank": 0 if shape is None else len(shape)} for i, (p, shape, dtype) in enumerate(e.params)],
        "sizes": e.size_names + e.extents + e.map_sizes,
        "launch_rule": e.launch is not None} for e in kernels]}


def _readme(prefix, kernels, chips, with_cpu):
    lines = [f"# lib{prefix}.so", "",
             f"Kernels exported by mlirgpu: `{prefix}.h` declares one C function per kernel. Each takes a",
             "CUDA stream (NULL: the default stream), device pointers, sizes and scalars, launches on that",
             f"stream and returns `{prefix.upper()}_SUCCESS` or an error code; `{prefix}_last_error()` gives",
             "the message.", "",
             "The library needs only libc and, to run on a GPU, the CUDA driver (`libcuda.so.1`, opened at",
             "the first call). It holds images for " + ", ".join(chips) + " and PTX that newer GPUs compile",
             "when a kernel is first launched on them.", ""]
    if with_cpu:
        lines += ["Without a GPU (or with `MLIRGPU_BACKEND=cpu`) the functions run their CPU builds on host",
                  f"pointers; `{prefix}_backend()` says which, and `{prefix}_alloc` / `{prefix}_copy_to_device`",
                  "give memory of the right kind.", ""]
    lines += ["## Functions", ""]
    for exported in kernels:
        lines += ["```c", _signature(prefix, exported) + ";", "```", ""]
        variants = [repr(spec).strip("<>") for spec, _ in exported.variants]
        lines += ["Its specializations; a call launches the first that serves its sizes:", ""]
        lines += [f"- `{variant}`" for variant in variants] + [""]
    lines += ["Build a program against it with:", "", "```sh",
              f"cc program.c -I. -L. -l{prefix} -Wl,-rpath,'$ORIGIN'", "```", ""]
    return "\n".join(lines)


def build(kernels, out_dir, *, chips=("sm_80", "sm_90a"), name="kernels", launch=None, tuned=None, tensor_maps=None,
          cpu=None, cc=None) -> Path:
    """mg.export's work; returns the library's path."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"mg.export(name=...) is a C identifier, not {name!r}")
    chips = [chips] if isinstance(chips, str) else list(chips)
    if not chips:
        raise ValueError("mg.export needs at least one chip, e.g. chips=['sm_90a']")
    for chip in chips:
        _chip_capability(chip)
    if cpu not in (None, True, False):
        raise ValueError(f"mg.export(cpu=...) takes True, False or None (if LLVM's llc is found), not {cpu!r}")
    llc = _find_llc() if cpu is not False else None
    if cpu is True and llc is None:
        raise CompileError("mg.export(cpu=True) needs LLVM 22's llc to compile the CPU builds: install it, or "
                           "name it in MLIRGPU_LLC")
    if tuned is not None and not isinstance(tuned, dict):
        raise ValueError(f"mg.export(tuned=...) maps autotuned kernels' names to tables, not {tuned!r}")
    if tensor_maps is not None and not isinstance(tensor_maps, dict):
        raise ValueError(f"mg.export(tensor_maps=...) maps kernels' names to their tensor maps' descriptions, "
                         f"not {tensor_maps!r}")
    groups = _group(kernels, tuned)
    for option, given in (("launch", launch), ("tensor_maps", tensor_maps)):
        unknown = set(given or {}) - {kernel.__name__ for kernel in groups}
        if unknown:
            raise ValueError(f"mg.export({option}=...) names kernels that are not exported: {sorted(unknown)}")
    exported = [_Exported(kernel, bindings, launch, names, (tensor_maps or {}).get(kernel.__name__))
                for kernel, (bindings, names) in groups.items()]
    for e in exported:
        if e.name in _RUNTIME_NAMES:
            raise ValueError(f"mg.export: a kernel named {e.name} would clash with {name}_{e.name} of the runtime")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    compiler = cc or os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise CompileError(f"mg.export needs a C compiler to build the library (running it does not): "
                           f"{compiler!r} is not found; set CC or pass cc=...")
    with tempfile.TemporaryDirectory(prefix="mlirgpu-export-") as temporary:
        work = Path(temporary)
        images, cpu_symbols, objects = [], [], []
        for k, e in enumerate(exported):
            images.append([_images(spec, chips) for spec, _ in e.variants])
            symbols = []
            for v, (spec, _) in enumerate(e.variants):
                symbol = f"mgx_{name}_{e.name}_{v}"
                built = _cpu_object(spec, symbol, e, work, llc) if llc else None
                symbols.append((symbol, *built[1:]) if built else None)
                if built:
                    objects.append(str(built[0]))
            cpu_symbols.append(symbols)
        header = _header(name, exported)
        (out / f"{name}.h").write_text(header)
        (work / f"{name}.h").write_text(header)
        source = work / f"{name}.c"
        source.write_text(_source(name, exported, cpu_symbols, images, _metadata(name, exported)))
        script = work / "exports.map"
        script.write_text(f"{{ global: {name}_*; local: *; }};\n")
        library = out / f"lib{name}.so"
        _run([compiler, "-std=c11", "-O2", "-fPIC", "-shared", f"-I{RUNTIME.parent}",
              f"-I{work}", str(source), *objects, "-o", str(library), f"-Wl,--version-script={script}",
              "-Wl,--as-needed", "-pthread", "-ldl", "-lm"], "the C compiler")
    (out / "README.md").write_text(_readme(name, exported, chips, any(s for row in cpu_symbols for s in row)))
    return library
