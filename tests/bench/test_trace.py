"""The decode-step breakdown (sparkit.bench.trace) on real torch.profiler traces made here on the CPU
(no hand-written JSON), and `sparkit bench steps` against a real embedded server process, which
answers SGLang's /start_profile and writes its trace as SGLang does."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from sparkit.bench.trace import compare, load_trace, summarise, summarise_file, table
from sparkit.errors import DataError


def _decode_trace(path, *, head_rows: int, steps: int = 8, annotate: bool = True):
    """A real torch.profiler trace of a small model's decode loop: SGLang's step spans, a final norm,
    an lm_head of `head_rows` rows (annotated as the embedded engine does, or not), an argmax outside
    the step span as SGLang samples outside its forward."""
    torch.manual_seed(0)
    hidden = 64
    layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(3))
    head = nn.Linear(hidden, head_rows, bias=False)
    x = torch.randn(1, hidden)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("step[DECODE bs=1]"):
                h = x
                for layer in layers:
                    h = torch.nn.functional.rms_norm(h, (hidden,))
                    h = h + torch.nn.functional.silu(layer(h))
                h = torch.nn.functional.rms_norm(h, (hidden,))
                if annotate:
                    with record_function("lm_head"):
                        logits = head(h).float()
                else:
                    logits = head(h).float()
            with record_function("sampling"):
                logits.argmax(-1)
    prof.export_chrome_trace(str(path))
    return path


def test_a_cpu_trace_is_broken_down_by_step_and_category(tmp_path):
    b = summarise_file(_decode_trace(tmp_path / "small.json", head_rows=256))
    assert b.stage == "DECODE" and b.batch_size == 1 and b.source.startswith("cpu ops")
    assert b.steps + b.left_out == 7 and b.steps >= 1  # 8 steps, the last without a successor
    for category in ("dense_mlp", "lm_head", "sampling", "norm", "gaps"):
        assert b.categories[category]["us_per_step"] > 0, category
    # the categories and the gaps add up to the step (means over the same steps)
    assert sum(c["us_per_step"] for c in b.categories.values()) == pytest.approx(b.step_us["mean"], rel=0.02)
    names = {r["name"]: r for r in b.kernels}
    assert names["aten::argmax"]["category"] == "sampling"
    assert any(r["name"] == "aten::linear" and r["category"] == "lm_head" and r["per_step"] == 1 for r in b.kernels)
    assert any(r["name"] == "aten::silu" and r["category"] == "dense_mlp" and r["per_step"] == 3 for r in b.kernels)
    assert table(b)[0].startswith("DECODE bs=1:")


def test_without_annotations_the_head_is_the_last_block_s_largest_matmul(tmp_path):
    b = summarise_file(_decode_trace(tmp_path / "plain.json", head_rows=20000, annotate=False))
    heads = [r for r in b.kernels if r["category"] == "lm_head"]
    assert heads and heads[0]["name"] in ("aten::linear", "aten::matmul", "aten::mm") and heads[0]["per_step"] == 1
    assert b.categories["lm_head"]["us_per_step"] > 0


def test_a_larger_head_shows_where_the_step_grew(tmp_path):
    """Two real traces differing only in the head's rows: the comparison puts the difference on the
    lm_head (what the FP8-vs-bf16 profile on the H200 asks of it)."""
    small = summarise_file(_decode_trace(tmp_path / "a.json", head_rows=256))
    large = summarise_file(_decode_trace(tmp_path / "b.json", head_rows=200_000))
    rows = {r["category"]: r for r in compare(small, large)}
    assert rows["lm_head"]["delta_us"] > 0
    assert rows["lm_head"]["delta_us"] > 5 * abs(rows["dense_mlp"]["delta_us"])


def test_a_gzipped_trace_reads_and_bad_files_are_data_errors(tmp_path):
    raw = _decode_trace(tmp_path / "t.json", head_rows=256)
    gz = tmp_path / "t.trace.json.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    assert summarise_file(gz).steps == summarise_file(raw).steps
    (tmp_path / "junk.json").write_text("not json")
    with pytest.raises(DataError, match="junk.json: not a Chrome trace"):
        load_trace(tmp_path / "junk.json")
    doc = json.loads(raw.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("step[")]
    with pytest.raises(DataError, match="no step spans"):
        summarise(doc, trace="spanless")
    with pytest.raises(DataError, match="no VERIFY steps"):
        summarise(load_trace(raw), stage="VERIFY")


@pytest.mark.slow
def test_bench_steps_profiles_a_live_embedded_server(start_embedded_server, tmp_path):
    """`sparkit bench steps --url`: SGLang's /start_profile request to a real server process (the
    embedded engine), its trace written in a private directory, summarised; --keep-trace keeps it."""
    from typer.testing import CliRunner

    from sparkit.cli.main import app

    server = start_embedded_server()
    out, keep = tmp_path / "steps.json", tmp_path / "traces"
    result = CliRunner().invoke(app, ["bench", "steps", "--url", server.url, "--steps", "10", "--input-len", "16",
                                      "--out", str(out), "--keep-trace", str(keep), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    b = doc["breakdown"]
    assert b["stage"] == "DECODE" and b["steps"] >= 1 and b["source"].startswith("cpu ops")
    for category in ("attention", "moe", "lm_head", "sampling"):  # the engine's own spans
        assert b["categories"][category]["us_per_step"] > 0, category
    kept = list(keep.glob("sparkit-steps-*-TP-0.trace.json.gz"))
    assert len(kept) == 1 and summarise_file(kept[0]).steps == b["steps"]
    assert b["steps"] + b["left_out"] >= 7  # 10 forward passes: a prefill, then decode steps
    assert doc["profiled"]["request"]["num_steps"] == 10
    # a second profile while none runs is fine; stop without a profile is SGLang's error
    again = CliRunner().invoke(app, ["bench", "steps", "--url", server.url, "--steps", "6", "--input-len", "8"])
    assert again.exit_code == 0, again.output
    import httpx

    stopped = httpx.post(f"{server.url}/stop_profile", timeout=30)
    assert stopped.status_code == 400 and "not in progress" in stopped.text


def test_bench_steps_on_a_trace_file_and_its_errors(tmp_path, sparkit_home):
    """Real `sparkit` processes: a trace file summarised; a missing one is exit 8 naming it; a server
    that is not there is exit 7, one `error:` line each."""
    import os
    import subprocess
    import sys

    def sparkit(*args):
        env = {**os.environ, "SPARKIT_HOME": str(sparkit_home), "COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "sparkit", "bench", "steps", *args], env=env,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    trace = _decode_trace(tmp_path / "t.json", head_rows=256)
    shown = sparkit("--trace", str(trace))
    assert shown.returncode == 0 and "lm_head" in shown.stdout and "gaps between kernels" in shown.stdout
    missing = sparkit("--trace", str(tmp_path / "missing.json"))
    assert missing.returncode == 8 and missing.stderr.startswith("error: ") and "missing.json" in missing.stderr
    nobody = sparkit()
    assert nobody.returncode == 7 and nobody.stderr.startswith("error: no running server found")
    assert "Traceback" not in missing.stderr + nobody.stderr


def test_a_nextn_cycle_is_a_verify_step_and_the_draft_steps_after_it(tmp_path):
    """SGLang's NEXTN: step[VERIFY] then step[DRAFT] spans; a VERIFY step's period runs to the next
    VERIFY and the draft steps' work counts as `draft`."""
    torch.manual_seed(0)
    target, draft = nn.Linear(64, 64), nn.Linear(64, 64)
    x = torch.randn(4, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(6):
            with record_function("step[VERIFY bs=1]"):
                target(x).relu()
            for _ in range(2):
                with record_function("step[DRAFT bs=1]"):
                    draft(x[:1]).relu()
    path = tmp_path / "nextn.json"
    prof.export_chrome_trace(str(path))
    b = summarise_file(path, stage="VERIFY")
    assert b.stage == "VERIFY" and b.steps + b.left_out == 5
    assert b.categories["draft"]["us_per_step"] > 0
    assert sum(r["per_step"] for r in b.kernels if r["category"] == "draft" and r["name"] == "aten::linear") == 2
    # with no --stage, a speculative server's trace (no DECODE step) is read as its VERIFY steps
    assert summarise_file(path).to_dict() == b.to_dict()


def test_every_triton_kernel_of_the_fp8_head_is_named_lm_head():
    """The FP8 head's kernels (sparkit/kernels/fp8_gemv_triton.py) land in lm_head by their names,
    whichever the tuner picked: a kernel added there without a pattern fails this."""
    import re
    from pathlib import Path

    from sparkit.bench.trace import _named_category

    source = (Path(__file__).resolve().parents[2] / "sparkit" / "kernels" / "fp8_gemv_triton.py").read_text()
    kernels = re.findall(r"@triton\.jit[^\n]*\ndef (\w+_kernel)\(", source)
    assert len(kernels) >= 6
    for name in kernels:
        assert _named_category(name) == "lm_head", name


def test_real_sglang_traces_at_ling_widths_put_the_head_and_the_blocks_where_they_are():
    """Two torch.profiler traces SGLang 0.5.23 wrote on the H200 through /start_profile (Ling widths,
    6 layers, dummy weights, decode CUDA graphs; benchmarks/ling_width.py, H200 session 7): the same
    model with sparkit's FP8 head and with the bf16 head. flashinfer's FusedAddRMSNorm is a norm (the
    blocks' separator), so the bf16 head's cuBLAS GEMM after the final norm is the lm_head, not MoE;
    and `sglang::` kernels are not KDA because "sglang" contains "gla"."""
    from sparkit.bench.trace import summarise_file

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23-h200" / "traces"
    fp8 = summarise_file(fixtures / "ling-L6-fp8head-decode.trace.json.gz")
    bf16 = summarise_file(fixtures / "ling-L6-bf16head-decode.trace.json.gz")
    head = {name: b.categories["lm_head"]["us_per_step"] for name, b in (("fp8", fp8), ("bf16", bf16))}
    assert 100 < head["fp8"] < 140 and 170 < head["bf16"] < 200, head  # the kernel's ~100 us + re-scoring vs F.linear's ~184
    for category in ("moe", "kda_attention", "mla_attention", "dense_mlp"):
        ours, theirs = fp8.categories[category]["us_per_step"], bf16.categories[category]["us_per_step"]
        assert ours == pytest.approx(theirs, rel=0.03), category  # the head is the only difference between the two
    assert not any("sglang::act_and_mul" in k["name"] and k["category"] == "kda_attention" for k in bf16.kernels)
