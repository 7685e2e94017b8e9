"""Exports the kernels of examples/export/sgemm.py (the worklog's naive SGEMM)
and attention.py (attention's forward pass) into one C library, builds main.c
against it with the system C compiler and runs it.

    python examples/export/build.py [out_dir]      # default: ./export_out

The directory gets libkernels.so, kernels.h and README.md (what mg.export
writes) and the program `main`. On a GPU the program runs the cubins (or
PTX) of the library; without one (or with MLIRGPU_BACKEND=cpu) the library's
CPU builds, which attention has none of. Building needs a C compiler (CC,
else cc); so does exporting.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlirgpu as mg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import attention  # noqa: E402  (the kernels, next to this script)
import sgemm  # noqa: E402


def main(out_dir):
    out = Path(out_dir)
    library = mg.export([sgemm.sgemm, attention.attention_forward], out, name="kernels", chips=["sm_80", "sm_90a"],
                        launch={**sgemm.LAUNCH, **attention.LAUNCH})
    print(f"exported {library}")
    program = out / "main"
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise SystemExit(f"no C compiler: {compiler!r} is not found (set CC)")
    subprocess.run([compiler, "-std=c11", "-O2", "-Wall", "-Werror", str(HERE / "main.c"), f"-I{out}", f"-L{out}",
                    "-lkernels", "-lm", "-Wl,-rpath,$ORIGIN", "-o", str(program)], check=True)
    done = subprocess.run([str(program)], capture_output=True, text=True)
    print(done.stdout, end="")
    if done.returncode != 0:
        raise SystemExit(f"{program} failed:\n{done.stderr}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "export_out")
