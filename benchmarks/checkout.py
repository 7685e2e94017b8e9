"""Imported first by the benchmarks that run from a checkout: `import mlirgpu`
then finds the installed package where there is one (the wheel, or the
editable install .ci/install makes), else this checkout's python/, built in
place with `python3 setup.py build_ext --inplace`."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("mlirgpu") is None:
    sys.path.insert(0, os.path.join(ROOT, "python"))
