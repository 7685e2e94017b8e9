"""mg.HostProgram's options, on the CPU: the kernel format (cubin, fatbin,
PTX), ptxas options, the bare-pointer calling conventions, and a pass
pipeline run first so that programs written above the gpu dialect (linalg
to parallel loops to gpu.launch) compile."""
import re

import pytest

import mlirgpu as mg
from test_host_program import PROGRAM, two_matmuls_program

LINALG = """
#map = affine_map<(d0) -> (d0)>
module attributes {gpu.container_module} {
  // B = 2 A, written with linalg: no gpu op until the pipeline maps the loop to the GPU.
  func.func @scale(%a: memref<1024xf32>, %b: memref<1024xf32>) {
    %two = arith.constant 2.0 : f32
    linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]}
        ins(%a : memref<1024xf32>) outs(%b : memref<1024xf32>) {
    ^bb0(%x: f32, %y: f32):
      %z = arith.mulf %x, %two : f32
      linalg.yield %z : f32
    }
    return
  }
}
"""
# The same with a transform script that maps the generic to parallel loops.
TRANSFORM = LINALG.replace("module attributes {gpu.container_module} {",
                           "module attributes {gpu.container_module, transform.with_named_sequence} {").replace(
    "    return\n  }\n}", """    return
  }
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %f = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    %g = transform.apply_registered_pass "convert-linalg-to-parallel-loops" to %f
        : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}""")
TRANSFORM_TO_GPU = "transform-interpreter, func.func(gpu-map-parallel-loops, convert-parallel-loops-to-gpu)"

LINALG_TO_GPU = ("func.func(convert-linalg-to-parallel-loops, scf-parallel-loop-tiling{parallel-loop-tile-sizes=128}, "
                 "gpu-map-parallel-loops, convert-parallel-loops-to-gpu)")


def declared(prog):
    return {line.split("@")[1].split("(")[0] for line in prog.llvm_ir.splitlines() if line.startswith("declare")}


@pytest.mark.parametrize("format, loader", [("cubin", "mgpuModuleLoad"), ("fatbin", "mgpuModuleLoad"),
                                            ("ptx", "mgpuModuleLoadJIT")])
def test_formats(format, loader):
    prog = mg.HostProgram(PROGRAM, format=format)
    assert prog.format == format and loader in declared(prog)
    assert re.search(r"gpu\.binary @kernels .*#gpu\.object<#nvvm\.target", prog.lowered)


def test_ptxas_options_reach_ptxas():
    mg.HostProgram(PROGRAM, ptxas_options="--maxrregcount=16 -O1")
    with pytest.raises(mg.CompileError, match=r"binary stage failed(.|\n)*Unknown option '-no-such-option'"):
        mg.HostProgram(PROGRAM, ptxas_options="--no-such-option")


@pytest.mark.parametrize("kwargs, match", [
    ({"ptxas_options": 'a "quoted" option'}, "without quotes or braces"),
    ({"ptxas_options": "-v", "format": "ptx"}, "need format='cubin' or 'fatbin'"),
    ({"format": "sass"}, "format must be one of"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mg.HostProgram(PROGRAM, **kwargs)


def test_kernel_bare_pointers():
    described = mg.HostProgram(two_matmuls_program(32, 64, 32), format="ptx")
    bare = mg.HostProgram(two_matmuls_program(32, 64, 32), format="ptx", kernel_bare_pointers=True)
    parameters = lambda ptx: ptx.split(".entry matmul(")[1].split(")")[0].count(".param")
    assert parameters(described.ptx) == 3 * 7        # a descriptor per memref: 3 + 2 * rank values
    assert parameters(bare.ptx) == 3                 # a pointer per memref
    # Dynamic shapes cannot pass as bare pointers.
    with pytest.raises(mg.CompileError, match="stage failed"):
        mg.HostProgram(PROGRAM, format="ptx", kernel_bare_pointers=True)


def test_host_bare_pointers_lower():
    prog = mg.HostProgram(two_matmuls_program(32, 64, 32), format="ptx", host_bare_pointers=True)
    assert "mgpuLaunchKernel" in declared(prog)


def test_a_pipeline_maps_linalg_to_the_gpu():
    with pytest.raises(mg.CompileError, match="'linalg.generic' was not lowered"):
        mg.HostProgram(LINALG, format="ptx")             # nothing maps it to the GPU
    prog = mg.HostProgram(LINALG, format="ptx", pipeline=LINALG_TO_GPU)
    assert "gpu.launch_func" in prog.outlined and "mgpuLaunchKernel" in declared(prog)
    assert prog.functions == ("scale",)
    with pytest.raises(mg.CompileError, match="pipeline stage failed"):
        mg.HostProgram(LINALG, pipeline="func.func(no-such-pass)")
    with pytest.raises(TypeError, match="pipeline must be"):
        mg.HostProgram(LINALG, pipeline=["canonicalize"])


SPARSE = """
module attributes {gpu.container_module} {
  func.func @main(%n: index) {
    %t0 = gpu.wait async
    %x, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf64>
    %v, %t2 = gpu.create_dn_tensor async [%t1] %x, %n : index into memref<?xf64>
    %t3 = gpu.destroy_dn_tensor async [%t2] %v
    gpu.wait [%t3]
    return
  }
}
"""

DEFAULT_DEVICE = """
module attributes {gpu.container_module} {
  func.func @main() {
    %d = arith.constant 1 : i32
    gpu.set_default_device %d
    return
  }
}
"""


@pytest.mark.parametrize("text, op, function", [(SPARSE, "gpu.create_dn_tensor", "mgpuCreateDnVec"),
                                                (DEFAULT_DEVICE, "gpu.set_default_device", "mgpuSetDefaultDevice")])
def test_operations_without_a_runtime_function_are_refused(text, op, function):
    with pytest.raises(mg.CompileError, match=rf"loc\(.*\): '{op}' needs the GPU runtime function {function}, "
                                              "which mlirgpu does not provide"):
        mg.HostProgram(text, format="ptx")


def test_every_runtime_function_is_provided_or_refused():
    from mlirgpu.runtime.host_program import UNSUPPORTED
    provided = set(mg._mlirgpu.runtime_functions())
    assert not provided & set(UNSUPPORTED)
    # What the lowering of the gpu dialect declares for everything this guide's programs use.
    assert {"mgpuStreamCreate", "mgpuMemAlloc", "mgpuMemcpy", "mgpuMemset16", "mgpuMemset32", "mgpuMemFree",
            "mgpuEventCreate", "mgpuEventRecord", "mgpuStreamWaitEvent", "mgpuLaunchKernel",
            "mgpuLaunchClusterKernel", "mgpuModuleLoad", "mgpuModuleLoadJIT", "mgpuMemHostRegisterMemRef",
            "mgpuMemHostUnregisterMemRef", "mgpuTensorMapEncodeTiledMemref"} <= provided


def test_compiler_log_of_the_drivers_jit(fake_libcuda):
    from test_host_program_memory import run
    out = run('''
prog = mg.HostProgram(PROGRAM, format="ptx")
out["before"] = prog.compiler_log
prog("filled", 4, 1.0, 4)
out["after"] = prog.compiler_log
out["cubin"] = mg.HostProgram(PROGRAM).compiler_log
''', fake_libcuda)
    assert out["before"] == "" and out["cubin"] == ""
    assert "ptxas info" in out["after"] and "Used 12 registers" in out["after"]


def test_a_transform_schedule_runs_first():
    prog = mg.HostProgram(TRANSFORM, format="ptx", pipeline=TRANSFORM_TO_GPU)
    assert "transform." not in prog.outlined.replace("transform.with_named_sequence", "")   # the script is gone
    assert "gpu.launch_func" in prog.outlined and "mgpuLaunchKernel" in declared(prog)
