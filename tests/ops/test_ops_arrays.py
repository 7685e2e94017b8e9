"""The ops' reading of array arguments: dtypes of every library, and the
check of an output the caller gives."""
import functools
import threading
import time

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu.ops import arrays

from support.backends import current_backend


class TorchDtype:
    """Stands in for a torch dtype: torch is not installed where this runs,
    and its dtypes are neither NumPy dtypes nor names mlirgpu takes as they
    print ("torch.bfloat16")."""
    __module__ = "torch"

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class TorchTensor:
    __module__ = "torch"

    def __init__(self, shape, name):
        self.shape, self.dtype = shape, TorchDtype(name)

    def is_contiguous(self):
        return True


@pytest.mark.parametrize("name, kind", [("bfloat16", mg.bf16), ("float16", mg.f16), ("float32", mg.f32),
                                        ("int32", mg.i32), ("float8_e4m3fn", mg.f8e4m3)])
def test_dtype_of_reads_torch_dtypes(name, kind):
    assert arrays.dtype_of(TorchTensor((2, 3), name)) == kind


def test_dtype_of_is_none_for_a_dtype_mlirgpu_has_not():
    assert arrays.dtype_of(TorchTensor((2, 3), "complex64")) is None


def test_a_torch_output_of_the_right_dtype_and_shape_is_taken():
    out = TorchTensor((1, 4096), "bfloat16")
    assert arrays.output(None, out, (1, 4096), mg.bf16, "matmul") is out


def test_a_torch_output_of_another_dtype_is_refused():
    with pytest.raises(mg.LaunchError, match="matmul's out is a C-contiguous bf16 array of shape"):
        arrays.output(None, TorchTensor((1, 4096), "float16"), (1, 4096), mg.bf16, "matmul")


def test_workspaces_are_kept_per_shape_and_stream_with_a_lock_each():
    workspaces = arrays.Workspaces(kept=2)
    shapes = ((3, 4, mg.f32), (5, mg.i32))
    with current_backend("cpu"):
        (partials, counters), lock = workspaces.get(shapes, None)
        assert partials.shape == (3, 4) and partials.dtype == np.float32 and not partials.any()
        assert counters.shape == (5,) and counters.dtype == np.int32 and not counters.any()
        # The legacy default stream by any of its names: the same arrays and lock.
        for stream in (None, 0, 1):
            again, same_lock = workspaces.get(shapes, stream)
            assert again[0] is partials and again[1] is counters and same_lock is lock
        # Another stream's launches may overlap these: arrays and a lock of its own.
        other, other_lock = workspaces.get(shapes, 7)
        assert other[0] is not partials and other_lock is not lock
        assert workspaces.get(((3, 4, mg.f32),), None)[0][0] is not partials
        # Only the 2 most recent are kept.
        assert workspaces.get(shapes, None)[0][0] is not partials


def test_workspaces_outside_a_capture_are_the_kept_ones():
    # NumPy arrays and CPU tensors are never captured in a CUDA graph.
    workspaces = arrays.Workspaces(kept=1)
    with current_backend("cpu"):
        first = workspaces.get(((2, mg.f32),), None, like=np.zeros(1))
        assert workspaces.get(((2, mg.f32),), None, like=np.zeros(1))[0][0] is first[0][0]
    assert not arrays.capturing(np.zeros(1))


def test_threads_missing_at_once_get_one_workspace_and_lock(monkeypatch):
    # Each thread's first call finds nothing kept; making a set takes long enough that the others
    # arrive meanwhile: they must wait for it, not make sets of their own.
    workspaces = arrays.Workspaces(kept=2)
    make = workspaces._make

    def slow(*key):
        time.sleep(0.05)
        return make(*key)

    monkeypatch.setattr(workspaces, "_kept", functools.lru_cache(maxsize=2)(slow))
    got = []
    with current_backend("cpu"):
        threads = [threading.Thread(target=lambda: got.append(workspaces.get(((4, mg.f32),), None)))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(got) == 4 and all(g[0][0] is got[0][0][0] and g[1] is got[0][1] for g in got)
