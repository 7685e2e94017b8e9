"""Line information: a kernel's PTX carries .file/.loc lines naming its
Python file and lines (as nvcc -lineinfo does), without the ", debug"
target that would make ptxas compile for a debugger; the cubin carries the
line table (what Nsight Compute's source view, nvdisasm -g and
compute-sanitizer read), and its machine code is the same as without."""
import re
import struct

import pytest

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx
from mlirgpu.compiler.nvvm import Compilation

N = mg.generics("N")


@mg.kernel
def axpy(a: mg.f32, x: mg.memref[N, mg.f32], y: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        y[i] = a * x[i] + y[i]   # AXPY-STORE


def source_line(marker):
    with open(__file__) as f:
        return next(n for n, line in enumerate(f, 1) if marker in line and "source_line" not in line)


def elf_sections(data):
    """{name: contents} of an ELF64 little-endian file (a cubin)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entry_size) for i in range(count)]
    names = headers[names_index]
    table = data[names[4]:names[4] + names[5]]
    return {table[h[0]:table.index(b"\0", h[0])].decode(): data[h[4]:h[4] + h[5]] for h in headers}


def test_ptx_has_the_kernels_python_lines():
    ptx = axpy[1024].ptx(chip="sm_90a")
    files = re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.MULTILINE)
    assert [path for _, path in files] == [__file__]
    number = files[0][0]
    lines = {int(n) for n in re.findall(rf"^\s*\.loc\s+{number}\s+(\d+)\s+\d+", ptx, re.MULTILINE)}
    assert source_line("AXPY-STORE") in lines
    assert source_line("i = block_idx.x * block_dim.x") in lines
    assert re.search(r"^\.target sm_90a$", ptx, re.MULTILINE), "line directives only: no ', debug' target"


def test_lineinfo_off_leaves_no_line_directives():
    ptx = Compilation(axpy[1024].module(), "sm_90a", lineinfo=False).ptx
    assert ".loc" not in ptx and ".file" not in ptx


def without_line_directives(ptx):
    return [line for line in ptx.splitlines()
            if not re.match(r"\s*(\.loc|\.file|\.section\s+\.debug|\$L__(func|tmp))", line)]


def test_line_information_changes_no_instruction():
    module = axpy[1024].module()
    on, off = Compilation(module, "sm_90a"), Compilation(module, "sm_90a", lineinfo=False)
    assert without_line_directives(on.ptx) == without_line_directives(off.ptx)
    with_lines, without = elf_sections(on.cubin), elf_sections(off.cubin)
    assert ".nv_debug_line_sass" in with_lines and ".debug_line" in with_lines
    assert ".debug_line" not in without
    assert with_lines[".text.axpy"] == without[".text.axpy"]    # the same SASS


@pytest.mark.gpu
def test_kernels_with_line_information_run():
    import numpy as np
    x = mg.to_device(np.arange(1024, dtype=np.float32))
    y = mg.zeros(1024, mg.f32)
    axpy(2.0, x, y, grid=4, block=256)   # a cubin with a line table loads and runs
    np.testing.assert_array_equal(y.get(), 2 * np.arange(1024, dtype=np.float32))



def test_line_info_example(tmp_path):
    """examples/line_info.py writes the cubin and PTX the GPU tools read, and its bad kernel is caught
    at its line on the CPU backend."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from support.checks import PYTHON_DIR

    example = Path(__file__).resolve().parents[2] / "examples" / "line_info.py"
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MLIRGPU_BACKEND="cpu")
    run = lambda *args: subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True,
                                       env=env, timeout=300)
    written = run("--out", str(tmp_path))
    assert written.returncode == 0, written.stderr
    assert f'"{example}"' in (tmp_path / "axpy.ptx").read_text()
    assert (tmp_path / "axpy.cubin").read_bytes()[:4] == b"\x7fELF"
    bad = run("--out-of-bounds")
    line = next(n for n, text in enumerate(example.read_text().splitlines(), 1) if "y[i] = x[i + 1]" in text)
    assert "out-of-bounds load from 'x'" in bad.stdout and f"line_info.py:{line}" in bad.stdout, bad.stderr
