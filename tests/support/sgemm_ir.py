"""The naive SGEMM module of examples/sgemm_naive.py, built operation by
operation through mlirgpu.ir (nothing parsed), for the tests to compile."""
import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "examples" / "sgemm_naive.py"
_spec = importlib.util.spec_from_file_location("sgemm_naive", _path)
sgemm_naive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sgemm_naive)

build_sgemm_module = sgemm_naive.build_naive_sgemm

__all__ = ["build_sgemm_module", "sgemm_naive"]
