"""mlirgpu.ops.attention on torch tensors is the custom op
torch.ops.mlirgpu.attention: gradients through .backward() against torch
SDPA's math backend, torch.compile(fullgraph=True) (no graph break),
capture and replay in a CUDA graph (decoding's too), decoding on two
streams at once, and inference calls, which skip the op.
Needs torch and a GPU; without torch, mlirgpu.ops imports and registers
nothing, and it registers every op as soon as torch is imported, in either
order (checked with a stand-in for torch)."""
import os
import subprocess
import sys

import pytest

import mlirgpu.ops

from support.backends import current_backend


def test_ops_import_without_torch_registers_nothing():
    code = ("import sys, mlirgpu.ops, mlirgpu.ops.attention_torch as t; "
            "print('torch' in sys.modules, t.OPS is None)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["False", "True"]


# A stand-in for torch with what registering the ops touches: it records the op names.
STAND_IN_TORCH = """
import types
registered = []
class Tensor: pass
class dtype: pass
class _Op:
    def register_fake(self, fake): return fake
    def register_autograd(self, backward, setup_context=None): pass
def _custom_op(name, mutates_args):
    registered.append(name)
    return lambda fn: _Op()
library = types.SimpleNamespace(custom_op=_custom_op)
compiler = types.SimpleNamespace(is_compiling=lambda: False)
ops = types.SimpleNamespace(mlirgpu=types.SimpleNamespace(matmul=1, grouped_matmul=2, scaled_matmul=3,
                                                          scaled_grouped_matmul=4))
"""


@pytest.mark.parametrize("first", ["mlirgpu.ops", "torch"])
def test_the_torch_ops_register_whichever_is_imported_first(first, tmp_path):
    """torch.compile cannot trace an op's registration, so it happens as soon
    as both are imported: a model compiled before any eager call still finds
    the ops."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
    second = "torch" if first == "mlirgpu.ops" else "mlirgpu.ops"
    # A lookup without an import (as libraries probe for torch) must not use up the wait.
    code = (f"import importlib.util, {first}; importlib.util.find_spec('torch'); import {second}, torch; "
            f"print(sorted(torch.registered))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['mlirgpu::attention',", "'mlirgpu::attention_backward',",
                                  "'mlirgpu::grouped_matmul',", "'mlirgpu::matmul',",
                                  "'mlirgpu::scaled_grouped_matmul',", "'mlirgpu::scaled_matmul']"]


def sdpa(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return torch_module().nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal, enable_gqa=True).transpose(1, 2)


def torch_module():
    return pytest.importorskip("torch")


def leaves(torch, batch, length, hq, hk, d):
    torch.manual_seed(0)
    shapes = ((batch, length, hq, d), (batch, length, hk, d), (batch, length, hk, d))
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_() for shape in shapes]


def compare(got, expected, what):
    error = (got.float() - expected.float()).abs().max().item()
    assert error <= 3e-2 * max(1.0, expected.float().abs().max().item()), f"{what}: max |error| {error}"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd_against_sdpa(causal):
    torch = torch_module()
    with current_backend("cuda"):
        q, k, v = leaves(torch, 2, 300, 8, 2, 64)
        out = mlirgpu.ops.attention(q, k, v, causal=causal)
        dout = torch.randn_like(out)
        out.backward(dout)
        mine = [x.grad for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        expected = sdpa(q.float(), k.float(), v.float(), causal)
        expected.backward(dout.float())
    compare(out, expected, "out")
    for name, g, x in zip(("dq", "dk", "dv"), mine, (q, k, v)):
        compare(g, x.grad, name)


@pytest.mark.gpu
def test_torch_compile_fullgraph():
    torch = torch_module()

    def loss(q, k, v):
        return (mlirgpu.ops.attention(q, k, v, causal=True).float() ** 2).sum()

    with current_backend("cuda"):
        q, k, v = leaves(torch, 1, 200, 4, 4, 128)
        compiled = torch.compile(loss, fullgraph=True)
        value = compiled(q, k, v)
        value.backward()
        got = [x.grad.clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        loss(q, k, v).backward()
    torch.testing.assert_close(value, loss(q, k, v).detach(), rtol=1e-3, atol=1e-3)
    for g, x in zip(got, (q, k, v)):
        compare(g, x.grad, "compiled gradient")


def captured_and_replayed(torch, q, k, v):
    """Captures mlirgpu.ops.attention(q, k, v) in a CUDA graph, puts new values in q, k and v,
    and replays the graph without waiting for it. Returns the graph and the output it writes,
    which holds the new values' attention only if the graph reads its inputs where they are
    rather than as they were at the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):    # warm-up: compiles the kernels outside the capture
        mlirgpu.ops.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mlirgpu.ops.attention(q, k, v)
    for x in (q, k, v):
        x.copy_(torch.randn_like(x))
    graph.replay()
    return graph, out


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    torch = torch_module()
    with current_backend("cuda"):
        q, k, v = (x.detach() for x in leaves(torch, 2, 256, 4, 1, 64))
        _, out = captured_and_replayed(torch, q, k, v)
        torch.cuda.synchronize()
    compare(out, sdpa(q.float(), k.float(), v.float(), False), "replayed output")


def decoding_inputs(torch):
    """q (4, 1, 32, 128) and k, v (4, 8192, 4, 128), bf16: a decoding call, its keys split."""
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            for shape in ((4, 1, 32, 128), (4, 8192, 4, 128), (4, 8192, 4, 128))]


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_of_decoding():
    # The split keys' partial outputs of the captured call are the graph's own, apart from those
    # an eager call of the same shape keeps.
    torch = torch_module()
    with current_backend("cuda"):
        torch.manual_seed(0)
        q, k, v = decoding_inputs(torch)
        graph, out = captured_and_replayed(torch, q, k, v)
        eager = mlirgpu.ops.attention(q, k, v)
        graph.replay()
        torch.cuda.synchronize()
    expected = sdpa(q.float(), k.float(), v.float(), False)
    compare(out, expected, "replayed output")
    compare(eager, expected, "eager output")


@pytest.mark.gpu
def test_decoding_on_two_streams_at_once():
    # Each stream keeps its own partial outputs: the two calls' kernels may run at once.
    torch = torch_module()
    with current_backend("cuda"):
        torch.manual_seed(0)
        inputs = [decoding_inputs(torch) for _ in range(2)]
        streams = [torch.cuda.Stream() for _ in inputs]
        outs = []
        for stream, (q, k, v) in zip(streams, inputs):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                outs.append(mlirgpu.ops.attention(q, k, v))
        torch.cuda.synchronize()
    for out, (q, k, v) in zip(outs, inputs):
        compare(out, sdpa(q.float(), k.float(), v.float(), False), "output")


@pytest.mark.gpu
def test_inference_launches_the_kernels_without_the_op_and_gives_its_result(monkeypatch):
    torch = torch_module()
    attention_torch = sys.modules["mlirgpu.ops.attention_torch"]
    calls = []
    through_op = attention_torch.attention
    monkeypatch.setattr(attention_torch, "attention", lambda *args: calls.append(args) or through_op(*args))
    with current_backend("cuda"):
        q, k, v = (torch.randn(2, 300, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        direct = mlirgpu.ops.attention(q, k, v, causal=True)
        assert not calls
        q.requires_grad_()
        with torch.no_grad():
            mlirgpu.ops.attention(q, k, v, causal=True)
        assert not calls
        differentiable = mlirgpu.ops.attention(q, k, v, causal=True)
        assert len(calls) == 1 and differentiable.requires_grad
    assert torch.equal(direct, differentiable.detach())
