"""The type stub of the C extension (mlirgpu/_mlirgpu.pyi) ships beside it, type-checks under
mypy --strict, and matches the built module name for name: mypy's stubtest fails on a type,
function, method, attribute or constant the extension defines and the stub lacks, or the
other way round, and on one whose kind differs (a property against a method, a classmethod
against an instance method). Both run on the imported package, the source tree's or an
installed wheel's."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlirgpu import _mlirgpu

EXTENSION = Path(_mlirgpu.__file__)
STUB = EXTENSION.with_name("_mlirgpu.pyi")
# Beside the package, not in it: the cache survives the session, so later runs skip the
# minutes of reading NumPy's annotations again.
CACHE = Path(tempfile.gettempdir()) / f"mlirgpu-mypy-cache-{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory):
    """A search path holding only the shipped stub: mypy reads mlirgpu._mlirgpu from it
    without parsing the rest of the package (an editable install is invisible to mypy, and
    site-packages may not be put on MYPYPATH)."""
    root = tmp_path_factory.mktemp("stubs")
    package = root / "mlirgpu"
    package.mkdir()
    (package / "__init__.pyi").write_text("")
    shutil.copy(STUB, package / STUB.name)
    config = root / "mypy.ini"
    # One set of options for both runs, so each reuses what the other cached.
    config.write_text(f"[mypy]\nstrict = True\ncache_dir = {CACHE}\n")
    return root


def run_mypy(module, stub_path, *arguments):
    env = dict(os.environ, MYPYPATH=str(stub_path))
    # The subprocess imports the same mlirgpu as this one (stubtest imports the module).
    env["PYTHONPATH"] = os.pathsep.join([str(EXTENSION.parent.parent), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", module, "--mypy-config-file" if module == "mypy.stubtest"
                           else "--config-file", str(stub_path / "mypy.ini"), *arguments],
                          capture_output=True, text=True, env=env, cwd=stub_path, timeout=600)


def test_stub_ships_with_the_extension():
    assert STUB.is_file(), f"no {STUB.name} beside {EXTENSION}"
    assert EXTENSION.with_name("py.typed").is_file(), f"no py.typed beside {EXTENSION}"


def test_stub_type_checks(stub_path):
    result = run_mypy("mypy", stub_path, "-m", "mlirgpu._mlirgpu")
    assert result.returncode == 0, result.stdout + result.stderr


def test_stub_matches_the_extension(stub_path):
    result = run_mypy("mypy.stubtest", stub_path, "mlirgpu._mlirgpu")
    assert result.returncode == 0, result.stdout + result.stderr
