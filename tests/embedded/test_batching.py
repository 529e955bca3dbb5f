"""Several sequences decoded in one forward get exactly what each gets alone (engine.py, batching.py,
model.RowBatch): tokens and logprobs to the last bit, greedy and seeded, plain and NEXTN, whatever
joins or leaves the batch between two steps. The load-time check that allows it, and its teeth:
on a CPU whose matmul rows depend on the row count, fewer padding rows than it measured make the
same request differ alone and together."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparkit.engines.embedded.api import LogprobRequest, SamplingParams  # noqa: E402

NEXTN = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3}
PROMPTS = ["Once upon a time, there was a little", "count: one two three", "The capital of France is",
           "def add(a, b):", "Q: What is 12 + 7? A:", "hello", "user: tell me a joke", "1, 2, 3, 4, 5, 6, 7, 8,",
           "In the morning, the baker went to the market to buy flour and eggs for the bread."]


@pytest.fixture(scope="module", params=["plain", "nextn"])
def engine(request, tiny_model_dir):
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    torch.set_num_threads(1)  # what the server runs with (and what the load-time check measured)
    spec = NEXTN if request.param == "nextn" else {}
    return EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", expert_weights="fp8",
                                       lm_head_dtype="fp8", max_running_requests=6, chunked_prefill_size=16, **spec))


def _alone(engine, ids, params, logprobs):
    steps = list(engine.generate(ids, params, lambda: False, logprobs))
    return _result(steps)


def _result(steps) -> dict:
    tokens, values, top = [], [], []
    for step in steps:
        tokens += step.token_ids
        if step.logprobs is not None:
            values += step.logprobs.logprobs
            top += step.logprobs.top or []
    return {"tokens": tokens, "logprobs": values, "top": top, "finish": steps[-1].finish_reason}


def _together(engine, requests, arrive_every: int = 2) -> list[dict]:
    """The scheduler's calls with every request admitted a few steps after the one before (the
    batch changes as they join and finish), one prefill chunk per iteration, then a decode step of
    every sequence whose prompt is in."""
    steps: list[list] = [[] for _ in requests]
    waiting = list(range(len(requests)))
    running: list = []
    iteration = 0
    while waiting or running:
        if waiting and iteration % arrive_every == 0 and engine.free_slots:
            i = waiting.pop(0)
            running.append((i, engine.open(*requests[i])))
        for i, seq in running:
            if not seq.decoding and not seq.finished:
                out = engine.prefill(seq)
                if out is not None:
                    steps[i].append(out)
                break
        batch = [(i, seq) for i, seq in running if seq.decoding]
        for (i, _), out in zip(batch, engine.decode([seq for _, seq in batch])):
            steps[i].append(out)
        for i, seq in list(running):
            if steps[i] and steps[i][-1].finished:
                engine.release(seq)
                running.remove((i, seq))
        iteration += 1
    return [_result(s) for s in steps]


def test_the_load_check_batches_this_machine_s_requests(engine):
    plan = engine.rows_plan
    assert plan is not None, engine.rows_check.why
    assert 1 <= plan.min_rows <= 8 and plan.max_rows == 6 * (engine.num_steps + 1)
    assert engine.server_args()["batched_forward"]["together"] is True


@pytest.mark.slow
def test_greedy_sequences_decoded_together_get_the_bits_they_get_alone(engine):
    want = LogprobRequest(top=2)
    requests = []
    for i, prompt in enumerate(PROMPTS):
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        params = SamplingParams(temperature=0.0, max_new_tokens=[40, 9, 64, 23, 1, 50, 33, 64, 12][i],
                                ignore_eos=i % 2 == 0, stop_token_ids=[10] if i == 5 else [])
        requests.append((ids, params, want))
    alone = [_alone(engine, *r) for r in requests]
    together = _together(engine, requests)
    for i, (one, batched) in enumerate(zip(alone, together)):
        assert batched == one, f"request {i} ({PROMPTS[i]!r}) differs decoded beside others"
    assert engine.free_slots == engine.max_running


@pytest.mark.slow
def test_seeded_sampling_is_the_same_alone_and_together(engine):
    requests = [(engine.tokenizer.encode(prompt, add_special_tokens=False),
                 SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, ignore_eos=True, seed=7 + i),
                 LogprobRequest())
                for i, prompt in enumerate(PROMPTS[:6])]
    alone = [_alone(engine, *r) for r in requests]
    assert _together(engine, requests, arrive_every=1) == alone
    assert len({tuple(one["tokens"]) for one in alone}) == len(alone)


def test_a_prompt_longer_than_a_chunk_is_prefilled_a_chunk_at_a_time(engine):
    ids = engine.tokenizer.encode(PROMPTS[-1], add_special_tokens=False)
    assert len(ids) > 4 * 16
    seq = engine.open(ids, SamplingParams(temperature=0.0, max_new_tokens=3), LogprobRequest(input_start=0))
    try:
        chunks = 0
        out = None
        while out is None:
            assert seq.next_chunk(16) == min(16, len(ids) - seq.prefilled)
            out = engine.prefill(seq)
            chunks += 1
        assert chunks == -(-len(ids) // 16) and seq.prefilled == len(ids)
        # every prompt position's logprob, gathered chunk by chunk (the first has none)
        assert out.input_logprobs.token_ids == ids and out.input_logprobs.logprobs[0] is None
        assert all(v is not None for v in out.input_logprobs.logprobs[1:])
    finally:
        engine.release(seq)


def test_every_kv_slot_taken_refuses_another_and_a_released_one_serves_again(engine):
    params = SamplingParams(temperature=0.0, max_new_tokens=2)
    seqs = [engine.open([256, 65, 66], params) for _ in range(engine.max_running)]
    assert engine.free_slots == 0
    with pytest.raises(RuntimeError, match="every KV cache slot is in use"):
        engine.open([256, 65], params)
    for seq in seqs:
        engine.release(seq)
        engine.release(seq)  # twice: nothing happens
    assert engine.free_slots == engine.max_running
    assert len(_alone(engine, [256, 65, 66], params, None)["tokens"]) == 2


def test_fewer_padding_rows_than_measured_make_a_request_differ_alone_and_together(engine):
    """The check's teeth: the padding is what keeps the rows exact on this CPU."""
    from sparkit.engines.embedded.batching import RowsPlan, _forwards_differ

    plan = engine.rows_plan
    if plan.min_rows == 1:
        pytest.skip("this CPU's matmul rows do not depend on the row count: nothing to pad")
    short = RowsPlan(plan.min_rows - 1, plan.max_rows, plan.fused_moe)
    with torch.inference_mode():
        problem = _forwards_differ(engine, short, engine.max_running, torch.Generator().manual_seed(0))
        assert "differ alone and together" in problem
        assert _forwards_differ(engine, plan, engine.max_running, torch.Generator().manual_seed(0)) == ""


def test_one_running_request_uses_the_batch1_kernels(tiny_model_dir):
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    one = EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", max_running_requests=1))
    assert one.rows_plan is None and "--max-running-requests 1" in one.rows_check.why
    assert one.server_args()["batched_forward"] == {"together": False, "why": "--max-running-requests 1"}
    assert len(_alone(one, [256, 65, 66], SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True), None)["tokens"]) == 4
