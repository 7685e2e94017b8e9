"""The ops' reading of array arguments: dtypes of every library, and the
check of an output the caller gives."""
import pytest

import mlirgpu as mg
from mlirgpu.ops import arrays


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
