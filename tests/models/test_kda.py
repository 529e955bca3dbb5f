"""tiny-ling-v3's KDA layer against SGLang 0.5.23's own kernels, run on the CPU by Triton's
interpreter (TRITON_INTERPRET=1, in a child process: the interpreter is chosen when triton is
imported): the decode/verify recurrence with the safe gate, the causal short convolution, and
the gated RMSNorm. Then the chunked form (training, prefill) against the recurrent one, and the
state a verify step keeps for rolling back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _shared import REPO_DIR

torch = pytest.importorskip("torch")

from sparkit.models.tiny_ling_v3 import kda  # noqa: E402


def _sglang_kernels_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("sglang") is not None


# What the child runs: SGLang's kernels and sparkit's KDA on the same random inputs; it prints the
# largest differences as JSON.
_AGAINST_SGLANG = textwrap.dedent('''
    import json, warnings
    import torch
    warnings.filterwarnings("ignore")
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import fused_sigmoid_gating_delta_rule_update
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    from sglang.kernels.ops.attention.fla.fused_norm_gate import rms_norm_gated
    from sparkit.models.tiny_ling_v3 import kda
    torch.manual_seed(0)
    T, H, K, lb = 5, 2, 16, -5.0
    q, k, v = torch.randn(1, T, H, K), torch.randn(1, T, H, K), torch.randn(1, T, H, K)
    f, b = torch.randn(1, T, H * K), torch.randn(1, T, H)
    layer = kda.KimiDeltaAttention(8, H, K, 4, lb)
    with torch.no_grad():
        layer.A_log.copy_(torch.randn(H) * 0.5)
        layer.dt_bias.copy_(torch.randn(H * K) * 0.5)
    state = torch.randn(3, H, K, K) * 0.1  # SGLang's pool: [slots, heads, V, K]; slot 1 is the request's
    out = fused_sigmoid_gating_delta_rule_update(
        A_log=layer.A_log.detach(), dt_bias=layer.dt_bias.detach(), q=q, k=k, v=v, a=f, b=b,
        initial_state_source=state.clone(), initial_state_indices=torch.tensor([1], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, T], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0, is_kda=True, lower_bound=lb)
    with torch.no_grad():
        g = layer._gate(f.view(1, T, H, K))
        mine, _ = kda.recurrent(kda.l2norm(q) * K ** -0.5, kda.l2norm(k), v, g, torch.sigmoid(b), state[1:2].clone())
    C, W = 8, 4
    x, w, window = torch.randn(1, 3, C), torch.randn(C, W), torch.randn(1, W - 1, C)
    conv_state = window.transpose(1, 2).contiguous()  # SGLang's [batch, channels, width - 1]
    conv = causal_conv1d_update(x.transpose(1, 2).contiguous(), conv_state, w, None, activation="silu")
    conv_mine, window_mine = kda.causal_conv(x, w, window)
    rows, gate, weight = torch.randn(6, 16), torch.randn(6, 16), torch.randn(16)
    normed = rms_norm_gated(rows.clone(), gate, weight, None, "sigmoid", eps=1e-6)  # writes into its input
    norm = kda.GatedRMSNorm(16, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(weight)
        normed_mine = norm(rows, gate)
    print(json.dumps({
        "recurrence": (out.reshape(mine.shape) - mine).abs().max().item(), "scale": mine.abs().max().item(),
        "conv": (conv.transpose(1, 2) - conv_mine).abs().max().item(),
        "conv_window": (conv_state.transpose(1, 2) - window_mine).abs().max().item(),
        "gated_norm": (normed - normed_mine).abs().max().item()}))
''')


@pytest.mark.slow
@pytest.mark.skipif(not _sglang_kernels_available(), reason="needs triton and sglang (the test environment has both)")
def test_kda_computes_what_sglangs_own_kernels_compute():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_DIR)}
    done = subprocess.run([sys.executable, "-c", _AGAINST_SGLANG], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    diff = json.loads(done.stdout.strip().splitlines()[-1])
    assert diff["scale"] > 0.1  # the state and inputs are not trivially zero
    assert diff["recurrence"] < 1e-5, diff
    assert diff["conv"] < 1e-5 and diff["conv_window"] == 0.0, diff
    assert diff["gated_norm"] < 1e-5, diff


@pytest.mark.parametrize("decay", [8.0, 0.0, -3.0])  # gates near the lower bound, mid-way, near 0
def test_the_chunked_form_is_the_recurrent_one(decay):
    torch.manual_seed(0)
    B, T, H, K = 2, 37, 2, 8  # 37: chunks of 16 and a padded last one
    q = kda.l2norm(torch.randn(B, T, H, K)) * K**-0.5
    k = kda.l2norm(torch.randn(B, T, H, K))
    v = torch.randn(B, T, H, K)
    g = -4.999 * torch.sigmoid(torch.randn(B, T, H, K) + decay)
    beta = torch.sigmoid(torch.randn(B, T, H))
    state = torch.randn(B, H, K, K)
    exact, _ = kda.recurrent(*(t.double() for t in (q, k, v, g, beta, state)))
    by_token, steps = kda.recurrent(q, k, v, g, beta, state)
    by_chunk, final = kda.chunked(q, k, v, g, beta, state)
    assert (by_token.double() - exact).abs().max() < 1e-6
    assert (by_chunk.double() - exact).abs().max() < 1e-6
    assert (final - steps[-1]).abs().max() < 1e-5


def test_a_layer_continues_from_its_state_and_keeps_the_state_after_each_verify_token():
    torch.manual_seed(1)
    layer = kda.KimiDeltaAttention(16, 2, 8, 4, -5.0).eval()
    x = torch.randn(1, 40, 16)
    with torch.no_grad():
        whole = layer(x)
        state = layer.new_state(torch.float32, "cpu")
        first = layer(x[:, :25], state)  # a prefill past one chunk: the chunked form
        verify = layer(x[:, 25:30], state, keep_steps=True)
        assert len(state.steps) == 5
        state.conv, state.ssm = state.steps[2]  # two drafts accepted and the bonus: position 28 committed
        rest = layer(x[:, 28:], state)
    assert (torch.cat((first, verify), 1) - whole[:, :30]).abs().max() < 1e-5
    assert (rest - whole[:, 28:]).abs().max() < 1e-5
