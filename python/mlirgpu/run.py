"""Runs a GPU program written in MLIR, as mlir-runner does:

    python -m mlirgpu.run FILE.mlir [--entry main] [--pipeline PIPELINE] [--chip sm_90a]

The file is a module in the gpu dialect (or above it, with --pipeline to
bring it down to gpu ops); its entry function takes no arguments. What the
program prints (vector.print, printMemrefF32 and friends, gpu.printf in
kernels) goes to standard output; a value the entry function returns is
printed after it. Errors go to standard error and the exit status is 1.
"""
import argparse
import sys

from ._mlirgpu import Error
from .runtime.host_program import HostProgram

__all__ = ["main"]


def _parser():
    parser = argparse.ArgumentParser(prog="python -m mlirgpu.run", description="Runs a GPU program written in MLIR.")
    parser.add_argument("file", help="the .mlir file ('-' for standard input)")
    parser.add_argument("--entry", default="main", help="the function to call (default: main); it takes no arguments")
    parser.add_argument("--pipeline", help="a pass pipeline run first, e.g. to map linalg or parallel loops to the GPU")
    parser.add_argument("--chip", help="the GPU architecture, e.g. sm_90a (default: the current GPU's)")
    parser.add_argument("--format", choices=("cubin", "fatbin", "ptx"), default="cubin",
                        help="how kernels are compiled (default: cubin)")
    parser.add_argument("--ptxas-options", help="options for ptxas, e.g. '--maxrregcount=64'")
    parser.add_argument("--kernel-bare-pointers", action="store_true",
                        help="kernels take memrefs as bare pointers (static shapes only)")
    parser.add_argument("--host-bare-pointers", action="store_true", help="host calls pass memrefs as bare pointers")
    parser.add_argument("-O", dest="opt_level", type=int, choices=range(4), default=2,
                        help="the host JIT's optimization level (default: 2)")
    return parser


def main(argv=None):
    """Runs the program the arguments name; returns the exit status."""
    options = _parser().parse_args(argv)
    try:
        text = sys.stdin.read() if options.file == "-" else open(options.file, encoding="utf-8").read()
    except OSError as error:
        print(f"mlirgpu.run: {error}", file=sys.stderr)
        return 1
    try:
        program = HostProgram(text, options.chip, format=options.format, opt_level=options.opt_level,
                              pipeline=options.pipeline, ptxas_options=options.ptxas_options,
                              kernel_bare_pointers=options.kernel_bare_pointers,
                              host_bare_pointers=options.host_bare_pointers)
        if options.entry not in program.functions:
            print(f"mlirgpu.run: no public function @{options.entry} to call (the program has: "
                  f"{', '.join(program.functions) or 'none'})", file=sys.stderr)
            return 1
        result = program(options.entry)
    except (Error, ValueError, TypeError) as error:
        sys.stdout.flush()
        print(f"mlirgpu.run: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if result is not None:
        print(result)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
