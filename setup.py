"""Builds the C extension mlirgpu._mlirgpu against Debian's MLIR 22 C API.

MLIR_PREFIX (default /usr/lib/llvm-22) holds include/mlir-c, include/llvm-c,
the static archives lib/libMLIR*.a and lib/libLLVM*.a, and the shared
libMLIR.so and libLLVM.so. CUDA_HOME (default /usr/local/cuda) gives cuda.h
only: libcuda is opened with dlopen at run time.

MLIRGPU_LINK chooses how MLIR and LLVM get into the extension:
  static  every MLIR and LLVM piece the extension uses, linked in from the
          static archives with libstdc++ and libgcc, unused sections dropped,
          only PyInit__mlirgpu exported, stripped: a self-contained module
          (about 100 MB) that needs no LLVM at run time. The default for
          wheels (`pip wheel .`, `python -m build`, `pip install .`).
  shared  the C API archives with libMLIR.so and libLLVM.so: links in a
          second, for development. The default for `build_ext --inplace` and
          `pip install -e .`.
"""
import glob
import os
import subprocess

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

MLIR_PREFIX = os.environ.get("MLIR_PREFIX", "/usr/lib/llvm-22")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
LIBDIR = os.path.join(MLIR_PREFIX, "lib")

capi = sorted(glob.glob(os.path.join(LIBDIR, "libMLIRCAPI*.a")))
if not capi:
    raise SystemExit(f"no libMLIRCAPI*.a under {LIBDIR}: install libmlir-22-dev or set MLIR_PREFIX")
if not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda.h")):
    raise SystemExit(f"no cuda.h under {CUDA_HOME}/include: install the CUDA toolkit or set CUDA_HOME")

# Compiled into the static build only: what Debian's archives expect from a
# newer glibc or from LLVM backends the extension leaves out.
STATIC_ONLY = "csrc/base/static_link.c"

# The LLVM backends the extension runs: NVPTX for kernels, X86 for the CPU
# backend's JIT (the host).
BACKENDS = ("NVPTX", "X86")
LLVM_COMPONENTS = ("nvptx", "x86", "orcjit", "mcjit", "executionengine", "interpreter", "perfjitevents",
                   "passes", "ipo", "instrumentation", "objcarcopts", "coroutines", "vectorize", "asmprinter",
                   "linker", "irreader", "bitreader", "bitwriter", "option", "targetparser", "frontendopenmp",
                   "frontendoffloading")
# MLIR's test passes, tools and tablegen: nothing the C API reaches.
MLIR_TOOLS = ("Test", "MlirOptMain", "OptLib", "Lsp", "Reduce", "TableGen", "Tblgen")


def llvm_config(*args):
    command = [os.path.join(MLIR_PREFIX, "bin", "llvm-config"), *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()


def shared_link_args():
    # The C API lives only in static archives; a group lets them refer to each other.
    return ["-Wl,--start-group", *capi, "-Wl,--end-group",
            f"-L{LIBDIR}", "-lMLIR", "-lLLVM", f"-Wl,-rpath,{LIBDIR}", "-ldl", "-lpthread"]


def static_link_args(build_temp):
    mlir = [path for path in sorted(glob.glob(os.path.join(LIBDIR, "libMLIR*.a")))
            if not any(tool in os.path.basename(path) for tool in MLIR_TOOLS)]
    # MLIR's generic target code (the llvm-target-to-* passes, the ROCDL and
    # SPIR-V GPU targets) initialises every backend Debian's LLVM was built
    # with; this build has NVPTX and X86 only, and the others' initialisers do
    # nothing, as in an LLVM configured with just those two.
    absent = [target for target in llvm_config("--targets-built") if target not in BACKENDS]
    defsyms = [f"-Wl,--defsym=LLVMInitialize{target}{part}=mg_static_backend_absent"
               for target in absent
               for part in ("TargetInfo", "Target", "TargetMC", "AsmPrinter", "AsmParser", "Disassembler")]
    exports = os.path.join(build_temp, "exports.map")
    with open(exports, "w") as file:
        file.write("{ global: PyInit__mlirgpu; local: *; };\n")
    return ["-Wl,--start-group", *mlir, f"-L{LIBDIR}", *llvm_config("--link-static", "--libs", *LLVM_COMPONENTS),
            "-Wl,--end-group", *defsyms,
            # zlib and zstd stay shared: auditwheel copies them into the wheel.
            "-lz", "-l:libzstd.so.1", "-static-libstdc++", "-l:libstdc++.a", "-static-libgcc",
            "-lrt", "-ldl", "-lm", "-lpthread",
            "-Wl,--gc-sections", "-Wl,--exclude-libs,ALL", f"-Wl,--version-script={exports}", "-Wl,-O1", "-s"]


class BuildExt(build_ext):
    def build_extensions(self):
        link = os.environ.get("MLIRGPU_LINK") or ("static" if "bdist_wheel" in self.distribution.commands
                                                  else "shared")
        if link not in ("static", "shared"):
            raise SystemExit(f"MLIRGPU_LINK={link!r}: expected 'static' or 'shared'")
        os.makedirs(self.build_temp, exist_ok=True)
        # A module built the other way is not up to date, however new it is.
        stamp = os.path.join(self.build_temp, "link-mode")
        if not os.path.exists(stamp) or open(stamp).read() != link:
            self.force = True
        for extension in self.extensions:
            if link == "static":
                extension.extra_link_args = static_link_args(self.build_temp)
                # A wheel travels: the build machine's toolkit path means
                # nothing where it lands, the conventional one may.
                extension.define_macros = [macro for macro in extension.define_macros if macro[0] != "MG_CUDA_HOME"]
                extension.define_macros.append(("MG_CUDA_HOME", '"/usr/local/cuda"'))
            else:
                extension.sources = [source for source in extension.sources if source != STATIC_ONLY]
                extension.extra_link_args = shared_link_args()
        super().build_extensions()
        with open(stamp, "w") as file:
            file.write(link)


extension = Extension(
    "mlirgpu._mlirgpu",
    # Every .c and .h under csrc/, in its layer's folder (docs/design/csrc.md).
    sources=sorted(glob.glob("csrc/**/*.c", recursive=True)),
    depends=sorted(glob.glob("csrc/**/*.h", recursive=True)) + ["python/mlirgpu/export/cpu_tma.h"],
    # Files include each other by folder: "base/state.h", "cuda/driver.h".
    # python/mlirgpu/export: cpu_tma.h, which the CPU backend shares with exported libraries.
    include_dirs=["csrc", "python/mlirgpu/export", os.path.join(MLIR_PREFIX, "include"),
                  os.path.join(CUDA_HOME, "include"), numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                   ("MG_CUDA_HOME", '"%s"' % CUDA_HOME)],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-fvisibility=hidden",
                        "-ffunction-sections", "-fdata-sections"],
)

setup(ext_modules=[extension], cmdclass={"build_ext": BuildExt})
