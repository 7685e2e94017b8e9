"""`import mlirgpu` in a new process, beside `import numpy` and, where
installed, the GPU libraries users import with it.

    python benchmarks/import_time.py [--repeats R] [--mlirgpu DIR ...]

Each row is the median over R new processes of the time the import statement
takes (the interpreter's own start is left out); the processes of all rows
take turns, so a machine that slows down mid-run slows every row alike.
--mlirgpu DIR (repeatable) adds a row for the mlirgpu package found in DIR
(a directory holding mlirgpu/, e.g. two builds side by side); without it the
row is the mlirgpu this interpreter imports.

`import mlirgpu` loads each public name's layer, and the C extension with
MLIR and LLVM inside, at the name's first use; the row "mlirgpu, every
public name" adds what touching all of them costs, the most a program can
pay on top of the import.
"""
import argparse
import os
import statistics
import subprocess
import sys

PROBE = "import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
EVERY_NAME = "import mlirgpu; [getattr(mlirgpu, name) for name in mlirgpu.__all__]"
PEERS = ("triton", "cupy", "torch")


def importable(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mlirgpu", action="append", default=[], metavar="DIR",
                        help="a directory holding an mlirgpu package to time (repeatable)")
    args = parser.parse_args()

    rows = [("numpy", "import numpy", None)]
    for path in args.mlirgpu or [None]:
        where = f" ({path})" if path else ""
        path = os.path.abspath(path) if path else None
        rows += [(f"mlirgpu{where}", "import mlirgpu", path),
                 (f"mlirgpu, every public name{where}", EVERY_NAME, path)]
    rows += [(peer, f"import {peer}", None) for peer in PEERS if importable(peer)]

    times = {label: [] for label, _, _ in rows}
    for _ in range(args.repeats):
        for label, statement, path in rows:
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
            out = subprocess.run([sys.executable, "-c", PROBE.format(statement=statement)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            times[label].append(float(out) * 1e3)

    numpy_ms = statistics.median(times["numpy"])
    width = max(len(label) for label in times)
    print(f"{'import':<{width}}  {'median ms':>9}  {'min ms':>7}  {'vs numpy':>8}")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"{label:<{width}}  {median:9.1f}  {min(values):7.1f}  {median / numpy_ms:7.2f}x")
    print(f"({args.repeats} processes per row; Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
