"""Builds the C extension mlirgpu._mlirgpu against Debian's MLIR 22 C API.

MLIR_PREFIX (default /usr/lib/llvm-22) holds include/mlir-c, include/llvm-c,
lib/libMLIRCAPI*.a, libMLIR.so and libLLVM.so. CUDA_HOME (default
/usr/local/cuda) gives cuda.h only: libcuda is opened with dlopen at run time.
"""
import glob
import os

import numpy
from setuptools import Extension, setup

MLIR_PREFIX = os.environ.get("MLIR_PREFIX", "/usr/lib/llvm-22")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

capi = sorted(glob.glob(os.path.join(MLIR_PREFIX, "lib", "libMLIRCAPI*.a")))
if not capi:
    raise SystemExit(f"no libMLIRCAPI*.a under {MLIR_PREFIX}/lib: install libmlir-22-dev or set MLIR_PREFIX")
if not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda.h")):
    raise SystemExit(f"no cuda.h under {CUDA_HOME}/include: install the CUDA toolkit or set CUDA_HOME")

libdir = os.path.join(MLIR_PREFIX, "lib")
extension = Extension(
    "mlirgpu._mlirgpu",
    sources=sorted(glob.glob("csrc/*.c")),
    depends=sorted(glob.glob("csrc/*.h")),
    include_dirs=[os.path.join(MLIR_PREFIX, "include"), os.path.join(CUDA_HOME, "include"), numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                   ("MG_CUDA_HOME", '"%s"' % CUDA_HOME)],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-fvisibility=hidden"],
    # The C API lives only in static archives; a group lets them refer to each other.
    extra_link_args=["-Wl,--start-group", *capi, "-Wl,--end-group",
                     f"-L{libdir}", "-lMLIR", "-lLLVM", f"-Wl,-rpath,{libdir}", "-ldl", "-lpthread"],
)

setup(ext_modules=[extension])
