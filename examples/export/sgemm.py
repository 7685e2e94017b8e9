"""The naive SGEMM of the worklog (examples/sgemm/k01_naive.py) with dynamic
sizes: one compile per variant serves every M, K, N, which is what a C
library exported from it needs.

    C = alpha * A @ B + beta * C        (any M, K, N: threads past the edge do nothing)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sgemm"))
import k01_naive  # noqa: E402  (the worklog's kernel, in examples/sgemm)

BLOCK = k01_naive.BLOCK
sgemm = k01_naive.naive(dynamic=True)

# The kernel's own launch shape, in C on its sizes: the library's function then takes no grid.
LAUNCH = {"sgemm": {"grid": (f"(M + {BLOCK - 1}) / {BLOCK}", f"(N + {BLOCK - 1}) / {BLOCK}"),
                    "block": (BLOCK, BLOCK)}}
