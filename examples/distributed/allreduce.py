"""A multi-GPU job in the torchrun style: one process per GPU. Each rank
runs an mlirgpu kernel on its GPU twice, once over torch tensors and once
over mlirgpu arrays that torch sees through DLPack (zero copy: the same
memory), and torch.distributed all-reduces both results over NCCL. Every
rank checks the sums against a reference computed in one process with NumPy.

    torchrun --nproc_per_node=2 examples/distributed/allreduce.py

NVLink multicast (NVLS) stays off: it can take GPUs that others share out of
service. The variables below are set before torch and NCCL start, and every
child process inherits them.
"""
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mlirgpu as mg  # noqa: E402

N = mg.generics("N")


@mg.kernel
def scale_add(a: mg.f32, X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32], Out: mg.memref[N, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < N:
        Out[i] = a * X[i] + Y[i]


def inputs(rank, n):
    """Rank `rank`'s inputs: every process can make any rank's, for the reference."""
    rng = np.random.default_rng(rank)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def reference(world, n, scale):
    """sum over ranks r of scale(r) * x_r + y_r, in float64, in this one process."""
    total = np.zeros(n)
    for r in range(world):
        x, y = inputs(r, n)
        total += scale(r) * x.astype(np.float64) + y
    return total


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    mg.cuda.set_device(local)          # mlirgpu allocates on this rank's GPU too
    stream = torch.cuda.current_stream()   # launches join torch's stream order: NCCL waits on it

    n = 1 << 20
    grid, block = (n + 255) // 256, 256
    x, y = inputs(rank, n)

    # 1. torch tensors: the kernel reads and writes torch's memory
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    t_out = torch.empty_like(tx)
    scale_add(float(rank + 1), tx, ty, t_out, grid=grid, block=block, stream=stream)

    # 2. mlirgpu arrays, which torch views through DLPack without a copy
    mx, my = mg.to_device(x, stream=stream), mg.to_device(y, stream=stream)
    m_out = mg.empty(n, mg.f32)
    scale_add(2.0 * (rank + 1), mx, my, m_out, grid=grid, block=block, stream=stream)
    shared = torch.from_dlpack(m_out)
    assert shared.data_ptr() == m_out.ptr and shared.device.index == m_out.device

    dist.all_reduce(t_out)
    dist.all_reduce(shared)            # reduces in place: m_out holds the sum too

    ok_torch = np.allclose(t_out.cpu().numpy(), reference(world, n, lambda r: r + 1), rtol=1e-5, atol=1e-4)
    ok_shared = np.allclose(m_out.get(stream=stream), reference(world, n, lambda r: 2.0 * (r + 1)),
                            rtol=1e-5, atol=1e-4)
    ok = ok_torch and ok_shared
    print(f"rank {rank}/{world} on GPU {local}: torch tensors and DLPack-shared mlirgpu arrays, all-reduced: "
          + ("matches the single-process reference" if ok else
             f"MISMATCH (torch tensors {ok_torch}, mlirgpu arrays {ok_shared})"), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
