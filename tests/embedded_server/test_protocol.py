"""Request parsing and response shaping of the embedded server (no server, no torch)."""

from __future__ import annotations

import json
import sys

import pytest

from sparkit.client import parse_prometheus
from sparkit.engines.embedded import requests, responses
from sparkit.engines.embedded.server_metrics import ServerMetrics
from sparkit.engines.embedded.settings import build_arg_parser, validate_args
from sparkit.engines.embedded.worker import find_stop, stable_text


def parse(body, model=requests.GenerateRequest):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.parse_body(raw, model, "/generate")


def test_generate_request_parses_sampling_params():
    req = parse({"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 5, "stop": "\n", "top_k": 3}, "stream": True})
    assert req.text == "hi" and req.stream
    assert req.sampling_params.max_new_tokens == 5
    assert req.sampling_params.stop_list() == ["\n"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "empty request body"),
        (b"[1, 2]", "the body must be a JSON object, got an array"),
        (b'"text"', "must be a JSON object"),
        ({"text": "a", "sampling_params": {"max_new_token": 3}}, "sampling_params.max_new_token: unknown field"),
        ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "input_ids": [1]}, "exactly one of"),
        ({}, "exactly one of"),
        ({"text": []}, "text: an empty batch"),
        ({"input_ids": []}, "input_ids cannot be empty."),
        ({"text": "a", "sampling_params": [{}, {}]}, "sampling_params: a list of 2 for a batch of 1 prompts"),
        ({"text": ["a", "b"], "sampling_params": [{"n": 2}, {"n": 3}]}, "The parallel_sample_num should be the same"),
        ({"text": "a", "sampling_params": {"n": 2}, "return_logprob": [True]}, "Cannot use list return_logprob with parallel_sample_num > 1"),
        ({"text": ["a", "b"], "top_logprobs_num": [1]}, "top_logprobs_num: a list of 1 for a batch of 2 prompts"),
        ({"text": ["a", "b"], "rid": ["x"]}, "The specified rids length mismatch"),
        ({"text": ["a", "b"], "rid": ["x", "x"]}, "Duplicate request IDs detected within the request"),
        ({"text": ["a"] * 300, "sampling_params": {"n": 2}}, "300 prompts x n=2 is 600 generations; at most 512"),
        ({"text": "a", "sampling_params": {"min_p": 1.5}}, "sampling_params.min_p: Input should be less than or equal to 1"),
        ({"text": "a", "sampling_params": {"frequency_penalty": 2.5}}, "sampling_params.frequency_penalty: Input should be less than or equal to 2"),
        ({"text": "a", "sampling_params": {"presence_penalty": -3}}, "sampling_params.presence_penalty: Input should be greater than or equal to -2"),
        ({"text": "a", "sampling_params": {"repetition_penalty": 0}}, "sampling_params.repetition_penalty: Input should be greater than or equal to 0.000001"),
        ({"text": "a", "sampling_params": {"repetition_penalty": 1e-308}}, "sampling_params.repetition_penalty: Input should be greater than or equal to 0.000001"),
        ({"text": "a", "sampling_params": {"logit_bias": {"5": 3.5e38}}}, "logit_bias values must be within [-1e+10, 1e+10]"),
        ({"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n: Input should be greater than or equal to 1"),
        ({"text": "a", "sampling_params": {"logit_bias": {"abc": 1.0}}}, "logit_bias keys are token ids, not 'abc'"),
        ({"text": "a", "sampling_params": {"regex": "a+", "json_schema": "{}"}}, "Only one of json_schema, regex, ebnf, or structural_tag can be set."),
        ({"text": "a", "sampling_params": {"max_new_tokens": 3, "min_new_tokens": 5}}, "min_new_tokens must be in [0, max_new_tokens(3)], got 5."),
        ({"text": "a", "sampling_params": {"structural_tag": "{}"}}, 'structural_tag="{}" is not supported by the embedded engine'),
        ({"text": "a", "sampling_params": {"stop_regex": "x+"}}, 'stop_regex="x+" is not supported by the embedded engine'),
        ({"text": "a", "lora_path": "adapter-1"}, 'lora_path="adapter-1" is not supported'),
        ({"text": "a", "return_routed_experts": True}, "return_routed_experts=true is not supported"),
        ({"text": "a", "logprob_start_len": -2}, "logprob_start_len"),
        ({"text": "a", "sampling_params": {"temperature": 1e308}}, "sampling_params.temperature: Input should be less than or equal to 100"),
        ({"text": "\ud800abc"}, "text: contains the unpaired UTF-16 surrogate \\ud800"),
        (b'{"text": "a", "sampling_params": {"temperature": Infinity}}', "Infinity is not a JSON number"),
        (b'{"text": "a", "sampling_params": {"temperature": NaN}}', "NaN is not a JSON number"),
        (b'{"text": "a", "sampling_params": {"temperature": 1e400}}', "sampling_params.temperature: inf is out of range"),
        (b"[" * 1000 + b"]" * 1000, "nested more than 32 levels"),
        (b"[" * 100000, "nested more than 32 levels"),
        (b'{"text": "a", "x": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}", "nested more than 32 levels"),
        ({"text": "a", "sampling_params": {"top_k": 0}}, "top_k must be -1"),
        ({"text": "a", "sampling_params": {"temperature": -0.5}}, "sampling_params.temperature"),
    ],
)
def test_bad_generate_bodies_are_400_naming_the_problem(body, needle):
    with pytest.raises(requests.ApiError) as info:
        parse(body)
    assert info.value.status == 400
    assert needle in info.value.message
    err = info.value.body()["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == 400


def test_unknown_field_lists_the_allowed_ones():
    with pytest.raises(requests.ApiError) as info:
        parse({"text": "a", "sampling_params": {"temprature": 0}})
    assert "allowed:" in info.value.message and "temperature" in info.value.message


def test_chat_request_accepts_what_the_openai_client_and_sparkit_send():
    req = requests.parse_body(
        json.dumps({
            "model": "tiny-ling", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stream": True, "stream_options": {"include_usage": True}, "return_spec_tokens_details": True,
            "temperature": 0, "top_k": 1, "max_tokens": 4, "seed": 3,
        }).encode(),
        requests.ChatCompletionRequest, "/v1/chat/completions",
    )
    assert req.include_usage and req.return_spec_tokens_details
    assert req.messages[1].text() == "hi"
    assert req.requested_max_tokens() == 4


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 200}, "n: Input should be less than or equal to 128"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "structural_tag", "structures": [], "triggers": []}},
         "response_format.type: Input should be 'text', 'json_object' or 'json_schema'"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
         "schema_ is required for json_schema response format request."),
        ({"messages": [{"role": "user", "content": "x"}], "regex": "a", "response_format": {"type": "json_object"}},
         "Only one of json_schema, regex, ebnf"),
        ({"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "alloy"}}, 'audio={"voice": "alloy"} is not supported by the embedded engine (it takes only null)'),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
         "Tools cannot be empty if tool choice is set to required."),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "Tool 'g' not found in tools list."),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}],
          "tool_choice": "required", "regex": "a+"}, "tool_choice 'required' or a named tool cannot be combined"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
         "messages.0.tool_calls.0.function.name"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": -1}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 2.5}, "frequency_penalty: Input should be less than or equal to 2"),
    ],
)
def test_bad_chat_bodies(body, needle):
    with pytest.raises(requests.ApiError) as info:
        requests.parse_body(json.dumps(body).encode(), requests.ChatCompletionRequest, "/v1/chat/completions")
    assert info.value.status == 400 and needle in info.value.message


def test_completion_prompt_forms():
    def prompts(body: bytes):
        return requests.parse_body(body, requests.CompletionRequest, "/v1/completions").prompts()

    assert prompts(b'{"prompt": "abc"}') == ["abc"]
    assert prompts(b'{"prompt": ["abc"]}') == ["abc"]
    assert prompts(b'{"prompt": [1, 2, 3]}') == [[1, 2, 3]]
    assert prompts(b'{"prompt": [[1, 2, 3]]}') == [[1, 2, 3]]  # one prompt as token ids, as an eval harness sends it
    assert prompts(b'{"prompt": ["a", "b"]}') == ["a", "b"]  # a batch, as lm-eval --batch_size sends it
    assert prompts(b'{"prompt": [[1], [2, 3]]}') == [[1], [2, 3]]
    for empty, needle in ((b'{"prompt": ""}', "Prompt cannot be empty"), (b'{"prompt": []}', "Prompt cannot be empty"),
                          (b'{"prompt": [[1], []]}', "a token-id prompt of the batch is empty")):
        with pytest.raises(requests.ApiError, match=needle):
            prompts(empty)


def test_generate_batches_normalise_as_sglangs():
    """GenerateReqInput.normalize_batch_and_arguments: a list of prompts (even of one) is a batch
    answered by a list; n samples of each prompt come together, in prompt order; a rid string
    becomes rid_i; per-item lists give each prompt its own value."""
    single = parse({"input_ids": [1, 2]})
    assert single.is_single and [i.prompt for i in single.items()] == [[1, 2]]
    for body in ({"input_ids": [[1, 2]]}, {"text": ["one"]}, {"text": "one", "sampling_params": {"n": 2}}):
        assert not parse(body).is_single
    req = parse({"text": ["a", "b"], "rid": "r", "sampling_params": [{"max_new_tokens": 3}, {"max_new_tokens": 4}],
                 "return_logprob": [True, False], "top_logprobs_num": 2})
    items = req.items()
    assert [(i.prompt, i.rid, i.sampling.max_new_tokens, i.return_logprob, i.top_logprobs_num) for i in items] == [
        ("a", "r_0", 3, True, 2), ("b", "r_1", 4, False, 2)]
    sampled = parse({"text": ["a", "b"], "rid": "r", "sampling_params": {"n": 3, "temperature": 0.7}}).items()
    assert [(i.prompt, i.sample, i.rid) for i in sampled] == [("a", 0, None), ("a", 1, None), ("a", 2, None),
                                                              ("b", 0, None), ("b", 1, None), ("b", 2, None)]
    assert parse({"text": ["a", "b"], "rid": ["x", "y"]}).items()[1].rid == "y"


def test_neutral_values_are_accepted_and_unknown_top_level_keys_ignored_as_sglang_does():
    ignored: list[str] = []
    # what sglang.bench_serving --backend sglang sends with every request
    req = requests.parse_body(json.dumps({
        "text": "hi", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "json_schema": None, "logit_bias": {},
                                          "min_p": 0.0, "regex": None, "n": 1},
        "stream": True, "lora_path": None, "return_routed_experts": False, "logprob_start_len": -1,
        "some_future_field": 1,
    }).encode(), requests.GenerateRequest, "/generate", ignored)
    assert req.sampling_params.max_new_tokens == 4 and req.logprob_start_len == -1
    assert ignored == ["some_future_field"]
    chat = requests.parse_body(json.dumps({
        "messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": True, "metadata": {"k": "v"},
        "store": False, "logit_bias": {}, "tool_choice": "auto", "response_format": {"type": "text"}, "n": 1,
    }).encode(), requests.ChatCompletionRequest, "/v1/chat/completions", ignored)
    assert chat.messages[0].text() == "x"


def test_unknown_sampling_params_are_rejected_as_sglang_rejects_them():
    with pytest.raises(requests.ApiError, match="sampling_params.temprature: unknown field"):
        parse({"text": "a", "sampling_params": {"temprature": 0.5}})


def _progress(**kw):
    base = dict(rid="r1", prompt_tokens=5, speculative=True, output_ids=[1, 2, 3, 4, 5, 6], text="abcdef",
                finish_reason={"type": "length", "length": 6}, spec_verify_ct=2, spec_num_correct_drafts=4,
                spec_num_proposed_drafts=6, e2e_latency=0.5)
    base.update(kw)
    return responses.RequestProgress(**base)


def test_meta_info_has_sglang_keys_and_accept_length():
    meta = responses.generate_response(_progress())["meta_info"]
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] == 5 and meta["cached_tokens"] == 0
    assert meta["spec_verify_ct"] == 2 and meta["spec_accept_length"] == 3.0
    assert meta["spec_accept_rate"] == pytest.approx(4 / 6)
    assert meta["e2e_latency"] == 0.5 and meta["id"] == "r1"
    plain = responses.meta_info(_progress(speculative=False))
    assert "spec_verify_ct" not in plain


def test_streamed_chunks_carry_output_ids_only_at_the_end():
    assert "output_ids" not in responses.generate_response(_progress(finish_reason=None), streaming=True)
    assert responses.generate_response(_progress(), streaming=True)["output_ids"] == [1, 2, 3, 4, 5, 6]
    assert "output_ids" in responses.generate_response(_progress(finish_reason=None))


def test_unfinished_meta_has_no_latency():
    meta = responses.meta_info(_progress(finish_reason=None))
    assert meta["finish_reason"] is None and "e2e_latency" not in meta


def test_chat_choice_usage_and_spec_details():
    choice = responses.chat_choice(_progress(), 1)
    assert choice["index"] == 1 and choice["message"]["content"] == "abcdef" and choice["finish_reason"] == "length"
    one = [_progress()]
    assert responses.total_usage(one, 1) == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11, "prompt_tokens_details": None}
    assert responses.sglext_of(one, True, 1)["spec_tokens_details"]["spec_accept_length"] == 3.0
    assert responses.sglext_of(one, False, 1) is None
    # n=2 samples of two prompts: each prompt's tokens once, every choice's completion; details per choice
    four = [_progress(prompt_tokens=5), _progress(prompt_tokens=5), _progress(prompt_tokens=7), _progress(prompt_tokens=7)]
    assert responses.total_usage(four, 2)["prompt_tokens"] == 12 and responses.total_usage(four, 2)["completion_tokens"] == 24
    assert len(responses.sglext_of(four, True, 2)["spec_tokens_details"]) == 4


def test_finish_reason_mapping():
    assert responses.openai_finish_reason({"type": "stop", "matched": 257}) == "stop"
    assert responses.openai_finish_reason({"type": "length", "length": 3}) == "length"
    assert responses.openai_finish_reason(None) is None
    assert responses.matched_stop({"type": "stop", "matched": "\n"}) == "\n"


def test_error_bodies_have_sglangs_two_shapes():
    exc = requests.ApiError(400, "bad", param="n")
    assert exc.body(nested=False) == {"object": "error", "message": "bad", "type": "BadRequestError", "param": "n", "code": 400}
    assert exc.body() == {"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400}}


def test_sse_framing():
    assert responses.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert responses.SSE_DONE == b"data: [DONE]\n\n"


def test_stable_text_holds_back_half_a_character():
    assert stable_text("ab\ufffd", finished=False) == "ab"
    assert stable_text("ab\ufffd", finished=True) == "ab\ufffd"


def test_find_stop_earliest_and_from_offset():
    assert find_stop("hello world. bye", [".", "world"]) == (6, "world")
    assert find_stop("a.b.c", ["."], search_from=2) == (3, ".")
    assert find_stop("abc", ["x"]) is None


def test_arg_parser_accepts_the_documented_flags_without_heavy_imports():
    args = build_arg_parser().parse_args([
        "--model-path", "m", "--speculative-algorithm", "nextn", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--lm-head-dtype", "fp8",
        "--expert-weights", "mxfp4", "--enable-metrics", "--context-length", "512", "--max-queued-requests", "8",
    ])
    assert args.speculative_algorithm == "NEXTN" and validate_args(args) == []


def test_settings_module_imports_without_torch_or_starlette():
    import subprocess

    code = "import sys, sparkit.engines.embedded.settings as s; s.build_arg_parser(); print(sorted(m for m in ('torch','starlette','uvicorn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--speculative-num-steps", "3"], "without --speculative-algorithm"),
        (["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "2"], "only 1"),
        (["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "3"], "num-steps + 1"),
    ],
)
def test_inconsistent_speculative_flags_are_reported(argv, needle):
    args = build_arg_parser().parse_args(["--model-path", "m", *argv])
    assert any(needle in p for p in validate_args(args))


def test_metrics_render_is_parsable_with_sglang_names():
    metrics = ServerMetrics(speculative=True, context_length=512, spec_steps=3, spec_draft_tokens=4)
    metrics.record_request(_progress(first_token_latency=0.1), queue_seconds=0.0, aborted=False)
    metrics.record_request(_progress(output_ids=[7, 8], spec_verify_ct=1, first_token_latency=0.2), queue_seconds=0.01, aborted=False)
    metrics.record_request(_progress(output_ids=[9]), queue_seconds=0.0, aborted=False, streaming=True, grammar=True)
    values = parse_prometheus(metrics.render("tiny-ling"))
    assert values["sglang:generation_tokens_total"] == 9
    assert values["sglang:prompt_tokens_total"] == 15
    assert values["sglang:num_requests_total"] == 3 and values["sglang:num_so_requests_total"] == 1
    tokenizer = 'model_name="tiny-ling",engine_type="unified"'  # SGLang's label sets
    assert values[f'sglang:num_requests_total{{{tokenizer},is_streaming="true"}}'] == 1
    assert values[f'sglang:generation_tokens_total{{{tokenizer},is_streaming="false"}}'] == 8
    assert values["sglang:spec_verify_calls_total"] == 5
    assert values["sglang:time_to_first_token_seconds_count"] == 2
    assert values[f'sglang:time_to_first_token_seconds_bucket{{{tokenizer},is_streaming="false",le="0.1"}}'] == 1
    assert values[f'sglang:context_len{{{tokenizer},tp_rank="0",pp_rank="0",moe_ep_rank="0"}}'] == 512
    assert metrics.avg_spec_accept_length == pytest.approx(9 / 5)


def test_launch_command_hides_the_api_key():
    from sparkit.engines.embedded.settings import redacted_argv

    assert redacted_argv(["--port", "1", "--api-key", "s3cret", "--api-key=x"]) == ["--port", "1", "--api-key", "<redacted>", "--api-key=<redacted>"]


def test_checkpoint_problems_name_the_file(tmp_path):
    from sparkit.engines.embedded.loading import CheckpointError, check_checkpoint

    with pytest.raises(CheckpointError, match="not a directory"):
        check_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match=str(tmp_path / "config.json")):
        check_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"vocab_size": 8}')
    with pytest.raises(CheckpointError, match=str(tmp_path / "model.safetensors") + ": missing"):
        check_checkpoint(tmp_path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)  # 8 of 16 data bytes
    with pytest.raises(CheckpointError, match="truncated"):
        check_checkpoint(tmp_path)
    weights.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    assert check_checkpoint(tmp_path) == {"vocab_size": 8}
