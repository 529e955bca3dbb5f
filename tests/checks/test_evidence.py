"""SGLang evidence parsing on real 0.5.23 log lines and /server_info bodies.

The log lines are written with the exact format strings of the installed sglang
0.5.23 (model_runner.py, cuda_graph_setup.py, metrics_reporter.py, humming.py,
bailing_moe_v3.py, http_server.py); the /server_info body is built the way
sglang builds it: `ServerArgs.resolved_dict()` + launch_command + internal_states
+ version, from a real ServerArgs returned by `prepare_server_args`.
"""

from __future__ import annotations

import pytest

from sparkit.checks.evidence import parse_server_info
from sparkit.engines.sglang.log import detect_phase, diagnose_failure, parse_log, parse_server_args_payload

LING_ARGV = [
    "--model-path", "inclusionAI/Ling-3.0-flash-fp4",
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
    "--moe-runner-backend", "humming",
    "--mem-fraction-static", "0.68",
]


@pytest.fixture(scope="module")
def server_args():
    """A real sglang 0.5.23 ServerArgs, parsed by sglang itself (CPU-only: unresolved)."""
    sglang_server_args = pytest.importorskip("sglang.srt.server_args")
    return sglang_server_args.prepare_server_args(list(LING_ARGV))


def server_info_body(server_args, **resolved):
    """The /server_info body shape of sglang 0.5.23 (http_server.server_info)."""
    body = dict(server_args.resolved_dict())
    body.update(resolved)  # what resolution changes on a GPU box
    body["launch_command"] = "sglang serve " + " ".join(LING_ARGV)
    body["internal_states"] = [{"avg_spec_accept_length": 3.9, "last_gen_throughput": 102.88}]
    body["version"] = "0.5.23"
    body["startup_time"] = 1764400000.0
    body["frontend"] = "python"
    return body


def ling_log(server_args, *, fp8_head=True, humming=True, graph_failed=False):
    p = "[2026-11-29 10:00:{:02d} TP0] "
    lines = [
        "[2026-11-29 10:00:00] server_args=" + repr(server_args.resolved_dict()),
        p.format(1) + "Detected mixed checkpoint layout: routed experts are MXFP4.",
        p.format(2) + "Load weight begin. avail mem=119.50 GB",
    ]
    if fp8_head:
        lines.append(p.format(3) + "Online FP8 quantization enabled for lm_head.")
    lines += [
        p.format(40) + "Load weight end. elapsed=38.21 s, type=BailingMoeV3ForCausalLM, quant=fp8, fmt=e4m3, avail mem=54.77 GB, mem usage=64.73 GB.",
        p.format(42) + "Load weight end. elapsed=1.90 s, type=BailingMoeForCausalLMNextN, quant=fp8, fmt=e4m3, avail mem=52.87 GB, mem usage=1.90 GB.",
        p.format(43) + "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=20.11 GB",
    ]
    if graph_failed:
        lines.append(p.format(44) + "Capture cuda graph failed: CUDA error: out of memory")
        return "\n".join(lines) + "\n"
    lines += [
        p.format(50) + "Capture target verify CUDA graph end. elapsed=6.50 s, mem usage=0.42 GB, avail mem=19.69 GB.",
        "[2026-11-29 10:00:51] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
    ]
    if humming:
        lines.append(p.format(52) + "Using indexed gemm for humming moe")
    lines += [
        "[2026-11-29 10:00:55] The server is fired up and ready to roll!",
        p.format(58) + "Decode batch, #running-req: 1, #token: 8512, token usage: 0.01, accept len: 3.90, accept rate: 0.72, "
        "cuda graph: True, gen throughput (token/s): 102.88, #queue-req: 0",
    ]
    return "\n".join(lines) + "\n"


def test_parses_every_startup_evidence_line(server_args):
    ev = parse_log(ling_log(server_args))
    assert ev.server_args["speculative_algorithm"] == "NEXTN"
    assert ev.server_args["moe_runner_backend"] == "humming"
    assert ev.server_args["mem_fraction_static"] == pytest.approx(0.68)
    assert [w.model_class for w in ev.weight_loads] == ["BailingMoeV3ForCausalLM", "BailingMoeForCausalLMNextN"]
    assert ev.target_load.quant == "fp8" and ev.target_load.elapsed_s == pytest.approx(38.21)
    assert ev.draft_load.model_class == "BailingMoeForCausalLMNextN"
    assert ev.mixed_mxfp4_experts
    assert ev.humming_gemm == "indexed"
    assert ev.fp8_lm_head
    assert ev.graph_captures == 1 and ev.graph_capture_failed is None
    assert ev.last_accept_length == pytest.approx(3.90)
    assert ev.last_gen_throughput == pytest.approx(102.88)
    assert ev.decode_stats[-1].graph is True
    assert ev.ready


def test_absent_lines_are_absent_not_guessed(server_args):
    ev = parse_log(ling_log(server_args, fp8_head=False, humming=False))
    assert not ev.fp8_lm_head
    assert ev.humming_gemm is None
    assert "fp8_lm_head" not in ev.lines


def test_bailing_auto_backend_override_line():
    ev = parse_log(
        "[2026-11-29 10:00:01] Bailing V3 mixed FP8/MXFP4 checkpoint: moe_runner_backend=flashinfer_mxfp4 for BailingMoeV3ForCausalLM.\n"
        "[2026-11-29 10:00:02] Using grouped gemm for humming moe\n"
    )
    assert ev.moe_backend_override == "flashinfer_mxfp4"
    assert ev.humming_gemm == "grouped"


def test_server_args_payload_forms():
    assert parse_server_args_payload('{"tp_size": 4}') == {"tp_size": 4}
    assert parse_server_args_payload("{'tp_size': 4, 'dtype': 'auto'}") == {"tp_size": 4, "dtype": "auto"}
    parsed = parse_server_args_payload("ServerArgs(model_path='m', tp_size=2, thing=<object at 0x1>)")
    assert parsed is None or parsed["tp_size"] == 2
    parsed = parse_server_args_payload("ServerArgs(model_path='m', tp_size=2, kind=Enum.A)")
    assert parsed == {"model_path": "m", "tp_size": 2, "kind": "Enum.A"}


def test_server_info_body_of_0_5_23_shape(server_args):
    info = parse_server_info(server_info_body(server_args, speculative_algorithm="EAGLE", moe_runner_backend="humming"))
    assert info.version == "0.5.23"
    assert info.args["speculative_algorithm"] == "EAGLE"
    assert info.args["speculative_num_draft_tokens"] == 4
    assert info.args["tp_size"] == 1
    assert "internal_states" not in info.args and "version" not in info.args
    assert info.avg_spec_accept_length == pytest.approx(3.9)
    assert "NEXTN" in info.launch_command


def test_phases_follow_the_log(server_args):
    text = ling_log(server_args)
    lines = text.splitlines()
    assert detect_phase("") == "starting"
    assert detect_phase("\n".join(lines[:3])) == "loading weights"
    assert detect_phase("\n".join(lines[:7])) == "capturing CUDA graphs"
    assert detect_phase("\n".join(lines[:9])) == "warming up"
    assert detect_phase(text) == "ready"


@pytest.mark.parametrize(
    "line, cause",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out of memory"),
        ("launch_server.py: error: unrecognized arguments: --cuda-graph-max-bs 8", "unknown flag"),
        ("launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill", "unknown flag"),
        ("OSError: inclusionAI/Ling-3.0-flashh is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'", "missing model"),
        ("OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use", "port in use"),
        ("[2026-11-29 10:00:44 TP0] Capture cuda graph failed: CUDA error: out of memory", "CUDA graph capture failed"),
        ("/usr/bin/python3: No module named sglang", "engine not installed"),
        ("ValueError: Unknown speculative algorithm name: MTP", "unknown speculative algorithm"),
        ("safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge", "broken checkpoint"),
    ],
)
def test_diagnoses_common_start_failures(line, cause):
    text = "[2026-11-29 10:00:00] starting\nTraceback (most recent call last):\n" + line + "\n"
    diagnosis = diagnose_failure(text, returncode=1)
    assert diagnosis.cause == cause
    assert diagnosis.line == line.strip()
    assert diagnosis.hint


def test_diagnosis_without_a_known_line_names_the_exit():
    assert diagnose_failure("nothing useful\n", returncode=3).cause == "process exited"
    killed = diagnose_failure("nothing useful\n", returncode=-9)
    assert killed.cause == "killed by SIGKILL" and "OOM" not in killed.detail  # a signal is no evidence of memory
    assert diagnose_failure("nothing useful\n", returncode=-15).cause == "killed by SIGTERM"
    assert diagnose_failure("nothing useful\n", returncode=None).cause == "not healthy in time"


def test_graph_capture_failure_is_evidence(server_args):
    ev = parse_log(ling_log(server_args, graph_failed=True))
    assert ev.graph_capture_failed == "CUDA error: out of memory"
    assert diagnose_failure(ling_log(server_args, graph_failed=True), 1).cause == "CUDA graph capture failed"
