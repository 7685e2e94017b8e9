"""python -m mlirgpu.export: mg.export from a shell.

    python -m mlirgpu.export mypackage.kernels:sgemm mypackage.kernels:softmax -o out/ --chips sm_80,sm_90a

Each argument names a kernel, a specialization or a list of them as
module:attribute (the module imported as Python would); --launch takes a
JSON object of launch rules as mg.export's launch= does, --tensor-maps one
of tensor-map descriptions as its tensor_maps= does (dtypes by name).
"""
import argparse
import importlib
import json
import sys

from . import export


def _load(spec):
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise SystemExit(f"python -m mlirgpu.export: {spec!r} is not module:attribute")
    value = importlib.import_module(module)
    for part in attribute.split("."):
        value = getattr(value, part)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mlirgpu.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", nargs="+", help="module:attribute of a kernel, specialization or list of them")
    parser.add_argument("-o", "--out", required=True, help="the directory to write the library into")
    parser.add_argument("--chips", default="sm_80,sm_90a", help="comma-separated chips (default: sm_80,sm_90a)")
    parser.add_argument("--name", default="kernels", help="the library's name: lib<name>.so, <name>.h")
    parser.add_argument("--launch", default=None, help="JSON launch rules, {kernel: {grid, block, shared_mem}}")
    parser.add_argument("--tensor-maps", default=None,
                        help='JSON tensor maps, {kernel: {parameter: {"dtype": "bf16", "shape", "box", ...}}}')
    parser.add_argument("--no-cpu", action="store_true", help="leave the CPU builds out")
    args = parser.parse_args(argv)
    sys.path.insert(0, "")
    kernels = [k for spec in args.kernels for k in _load(spec)]
    library = export(kernels, args.out, chips=args.chips.split(","), name=args.name,
                     launch=json.loads(args.launch) if args.launch else None,
                     tensor_maps=json.loads(args.tensor_maps) if args.tensor_maps else None,
                     cpu=False if args.no_cpu else None)
    print(library)


if __name__ == "__main__":
    main()
