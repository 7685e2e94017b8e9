"""A kernel specialization traced into a module for a target.

    module = trace_kernel(function, rewritten, "sgemm", params, {"M": 256, ...})

`params` gives each parameter's (name, shape, dtype), shape None for a
scalar (dtype mlirgpu.TensorMap for a tensor map taken by value): sizes become the static shapes of the function's memrefs, and inside
the body each generic's name evaluates to its value (so `range(K)` has a
constant bound and `mg.constant(1.0, dtype)` a concrete type).
"""
import linecache
import re

from .. import ir
from .._mlirgpu import CompileError, MLIRError, TensorMap
from ..language import core as lang
from ..language import tma
from ..language.generics import ALIGNMENT
from ..language.intrinsics import assume
from ..targets.gpu import GpuLowering
from .trace import tracing

__all__ = ["trace_kernel"]


def trace_kernel(function, rewritten, name, params, generic_values, *, target=None, attributes=None,
                 fastmath=False, qualifiers=None, dynamic=None, aligned=False):
    """The module holding `function` traced as kernel `name` for `target`
    (default: the GPU), verified; CompileError at the user's line otherwise.
    `fastmath`: its float operations (and its device functions') carry
    MLIR's `fast` flags. `qualifiers` gives per parameter (readonly,
    noalias): LLVM's readonly and noalias on its pointer. `dynamic` maps a
    dynamic generic's name to (parameter, dimension, multiple): its value is
    that dynamic extent, assumed a multiple of `multiple`. `aligned`: every
    array is assumed to start at a multiple of ALIGNMENT bytes."""
    qualifiers = qualifiers or [(False, False)] * len(params)
    target = target or GpuLowering()
    location = ir.Location.file(rewritten[3], function.__code__.co_firstlineno, 0)
    with ir.Context.current():
        module = ir.Module.create(location=location)
        types, argument_attributes, maps = [], [], []
        for (_, shape, dtype), (readonly, noalias) in zip(params, qualifiers):
            if dtype is TensorMap:
                maps.append(len(types))
            parameter_types = (target.memref_parameter_types(list(shape), dtype) if shape is not None
                               else [ir.Type.parse(tma.PARAMETER_TYPE)] if dtype is TensorMap
                               else [lang.ir_type(dtype)])
            types += parameter_types
            names = (["llvm.noalias"] if noalias else []) + (["llvm.readonly"] if readonly else [])
            argument_attributes += [names] + [[]] * (len(parameter_types) - 1)
        attributes = dict(attributes or {})
        if maps:
            attributes[tma.GRID_CONSTANTS] = ir.Attribute.dense_i32_array(maps)
        body = target.kernel_function(module, name, types, location, attributes, argument_attributes)
        with tracing(function, rewritten, generic_values, target=target,
                     module_state={"fastmath": fastmath}) as trace, ir.InsertionPoint(body):
            target.bind_extra_arguments(trace, body.arguments[len(types):])
            given = iter(body.arguments)
            arguments = [target.memref_parameter(given, list(shape), dtype, p, readonly) if shape is not None
                         else tma.TensorMapValue(next(given), p) if dtype is TensorMap
                         else lang.Scalar(next(given), dtype)
                         for (p, shape, dtype), (readonly, _) in zip(params, qualifiers)]
            if aligned:
                arguments = [assume_aligned(a) if isinstance(a, lang.MemRef) else a for a in arguments]
            sizes = {generic: arguments[i].shape[d] for generic, (i, d, _) in (dynamic or {}).items()}
            for generic, (_, _, multiple) in (dynamic or {}).items():
                if multiple > 1:
                    assume(sizes[generic] % multiple == 0)
            trace.bind_generics(sizes)
            trace.instance(*arguments)
            lang.emit(target.return_op)
        target.finish(module, trace.module_state)
        try:
            module.verify()
        except MLIRError as error:
            raise located_compile_error(error) from None
    return module


def assume_aligned(memref):
    """`memref` as a view that LLVM may take to start at a multiple of ALIGNMENT bytes."""
    view = lang.emit("memref.assume_alignment", [memref.value], [memref.value.type],
                     attributes={"alignment": ir.Attribute.integer(ALIGNMENT, ir.Type.integer(32))})
    return lang.MemRef(view.result, memref.dtype, memref.extents, memref.name, memref.readonly)


def located_compile_error(error):
    """CompileError for MLIR's diagnostics on a traced kernel, each as
    `file:line: severity: message` and the user's source line, like every
    other CompileError of a kernel."""
    lines, first = [], None
    for severity, location, message in error.diagnostics:
        match = re.match(r'loc\("([^"]+)":(\d+):\d+\)', location)
        if match is None:
            lines.append(f"{location}: {severity}: {message}")
            continue
        filename, line = match.group(1), int(match.group(2))
        first = first or (filename, line)
        lines.append(f"{filename}:{line}: {severity}: {message}")
        source = linecache.getline(filename, line).strip()
        if source:
            lines.append(f"    {source}")
    new = CompileError("\n".join(lines) or str(error))
    new.diagnostics = error.diagnostics
    if first is not None:
        new.filename, new.lineno = first
    return new
