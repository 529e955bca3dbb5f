"""NEXTN speculative decoding: greedy equality with plain decoding, rejection sampling keeps the
target distribution, and the generation rules (stop ids, EOS, max_new_tokens, cancel, seeds)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
scipy_stats = pytest.importorskip("scipy.stats")

from sparkit.engines.embedded.api import SamplingParams  # noqa: E402
from sparkit.engines.embedded.speculative import logits_to_probs, verify_greedy, verify_rejection  # noqa: E402


def never() -> bool:
    return False


def run(engine, ids, params, cancelled=never):
    steps = list(engine.generate(list(ids), params, cancelled))
    return [t for s in steps for t in s.token_ids], steps


def random_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[256] + [rng.randrange(32, 127) for _ in range(rng.randint(1, 40))] for _ in range(count)]


# ---------------------------------------------------------------- pure functions


def test_verify_greedy_accepts_the_longest_matching_prefix_plus_the_bonus():
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert verify_greedy([5, 6, 7], [4, 6, 7, 1]) == (0, 4)
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]) == (3, 1)


@pytest.mark.slow
def test_rejection_sampling_reproduces_the_target_distribution():
    """Drafts sampled from q, verified against p: the first emitted token follows p0 and the second
    (when emitted in the same step) follows p1, even though q is far from p."""
    p = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05], [0.05, 0.05, 0.1, 0.1, 0.2, 0.5], [1 / 6] * 6])
    q = torch.tensor([[0.1, 0.1, 0.2, 0.2, 0.2, 0.2], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]])
    gen = torch.Generator().manual_seed(0)
    n = 6000
    first, second = [0] * 6, [0] * 6
    drafts_all = torch.stack([torch.multinomial(q[j], n, replacement=True, generator=gen) for j in range(2)], dim=1).tolist()
    for drafts in drafts_all:
        accepted, token = verify_rejection(drafts, q, p, gen)
        emitted = drafts[:accepted] + [token]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    assert scipy_stats.chisquare(first, [x * n for x in p[0].tolist()]).pvalue > 1e-3
    m = sum(second)
    assert m > 1000
    assert scipy_stats.chisquare(second, [x * m for x in p[1].tolist()]).pvalue > 1e-3
    # the test has power: the drafts' own distribution is clearly rejected
    assert scipy_stats.chisquare(first, [x * n for x in q[0].tolist()]).pvalue < 1e-6


def test_top_k_and_top_p_truncate_the_distribution():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs[0, 2:] == 0).all() and abs(probs.sum().item() - 1) < 1e-6
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs[0, 0] == 1.0  # the top token alone already has more than half the mass
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.9))
    assert (probs[0, :3] > 0).all() and (probs[0, 3:] == 0).all()


# ---------------------------------------------------------------- engine: greedy equality


@pytest.mark.slow
@pytest.mark.parametrize("num_steps", [1, 2, 3, 4])
def test_greedy_speculative_output_is_token_for_token_plain_greedy(untrained_model_dir, make_engine, num_steps):
    plain = make_engine(untrained_model_dir)
    spec = make_engine(untrained_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=num_steps)
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    for ids in random_prompts(10, seed=num_steps):
        expected, _ = run(plain, ids, params)
        got, steps = run(spec, ids, params)
        assert got == expected
        assert len(got) == 24
        assert all(1 <= len(s.token_ids) <= num_steps + 1 for s in steps if s.verify_step)


@pytest.mark.slow
@pytest.mark.parametrize("experts, head", [("fp8", "fp8"), ("mxfp4", "bf16"), ("bf16", "fp32")])
def test_greedy_equality_holds_with_quantised_weights_and_a_draft_that_often_hits(tiny_model_dir, make_engine, experts, head):
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts

    kw = dict(expert_weights=experts, lm_head_dtype=head)
    plain = make_engine(tiny_model_dir, **kw)
    spec = make_engine(tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, **kw)
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    multi_token_steps = 0
    for prompt in sample_prompts(8, seed=7):
        ids = prompt_ids(plain.tokenizer, prompt)
        expected, _ = run(plain, ids, params)
        got, steps = run(spec, ids, params)
        assert got == expected
        multi_token_steps += sum(1 for s in steps if s.verify_step and len(s.token_ids) > 1)
    assert multi_token_steps > 10  # the accept path (not only rejections) was exercised


# ---------------------------------------------------------------- engine: sampling


@pytest.mark.slow
def test_speculative_sampling_keeps_the_target_distribution_end_to_end(untrained_model_dir, make_engine):
    """The second generated token (the first one decided by a verify step) has the same
    distribution with and without speculation (two-sample chi-square)."""
    plain = make_engine(untrained_model_dir)
    spec = make_engine(untrained_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=2)
    ids = [256, 72, 105]
    n = 300
    counts = []
    for engine in (plain, spec):
        c: dict[int, int] = {}
        for seed in range(n):
            params = SamplingParams(temperature=0.8, top_k=4, max_new_tokens=2, ignore_eos=True, seed=seed)
            out, _ = run(engine, ids, params)
            c[out[1]] = c.get(out[1], 0) + 1
        counts.append(c)
    keys = sorted(set(counts[0]) | set(counts[1]))
    table = [[counts[0].get(k, 0) for k in keys], [counts[1].get(k, 0) for k in keys]]
    assert len(keys) >= 3
    assert scipy_stats.chi2_contingency(table).pvalue > 1e-3


def test_a_request_seed_makes_sampling_reproducible(untrained_model_dir, make_engine):
    spec = make_engine(untrained_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, ignore_eos=True, seed=42)
    a, _ = run(spec, [256, 65, 66], params)
    b, _ = run(spec, [256, 65, 66], params)
    c, _ = run(spec, [256, 65, 66], SamplingParams(temperature=1.0, max_new_tokens=16, ignore_eos=True, seed=43))
    assert a == b and a != c


# ---------------------------------------------------------------- engine: finish rules


@pytest.mark.parametrize("spec", [False, True])
def test_max_new_tokens_is_exact_even_when_a_verify_step_accepts_more(untrained_model_dir, make_engine, spec):
    kw = dict(speculative_algorithm="NEXTN", speculative_num_steps=4) if spec else {}
    engine = make_engine(untrained_model_dir, **kw)
    for n in (0, 1, 3, 7):
        out, steps = run(engine, [256, 70, 71], SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True))
        assert len(out) == n
        assert steps[-1].finished and steps[-1].finish_reason == {"type": "length", "length": n}


@pytest.mark.parametrize("spec", [False, True])
def test_generation_stops_at_the_first_stop_token_id(untrained_model_dir, make_engine, spec):
    kw = dict(speculative_algorithm="NEXTN", speculative_num_steps=3) if spec else {}
    engine = make_engine(untrained_model_dir, **kw)
    ids = [256, 80, 81, 82]
    free, _ = run(engine, ids, SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True))
    stop = free[5]
    out, steps = run(engine, ids, SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True, stop_token_ids=[stop]))
    first = free.index(stop)
    assert out == free[: first + 1]
    assert steps[-1].finish_reason == {"type": "stop", "matched": stop}


def test_eos_stops_unless_ignore_eos(tiny_model_dir, make_engine):
    engine = make_engine(tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3)
    ids = engine.tokenizer.encode(
        engine.tokenizer.apply_chat_template([{"role": "user", "content": "Count from 3 to 8."}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    eos = engine.tokenizer.eos_token_id
    out, steps = run(engine, ids, SamplingParams(temperature=0.0, max_new_tokens=120))
    assert out[-1] == eos and eos not in out[:-1]
    assert steps[-1].finish_reason == {"type": "stop", "matched": eos}
    longer, _ = run(engine, ids, SamplingParams(temperature=0.0, max_new_tokens=len(out) + 5, ignore_eos=True))
    assert len(longer) == len(out) + 5


@pytest.mark.parametrize("spec", [False, True])
def test_cancel_aborts_and_frees_the_kv_cache(untrained_model_dir, make_engine, spec):
    kw = dict(speculative_algorithm="NEXTN", speculative_num_steps=3) if spec else {}
    engine = make_engine(untrained_model_dir, **kw)
    calls = {"n": 0}

    def cancel_after_two() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    out, steps = run(engine, [256, 90, 91], SamplingParams(temperature=0.0, max_new_tokens=50, ignore_eos=True), cancel_after_two)
    assert steps[-1].finish_reason == {"type": "abort"} and steps[-1].finished
    assert 0 < len(out) < 50
    assert engine.free_slots == engine.max_running  # the KV cache slot is back
    # the engine serves the next request normally
    again, _ = run(engine, [256, 90, 91], SamplingParams(temperature=0.0, max_new_tokens=5, ignore_eos=True))
    assert len(again) == 5


def test_bad_requests_are_refused_with_a_reason(untrained_model_dir, make_engine):
    engine = make_engine(untrained_model_dir, context_length=64)
    with pytest.raises(ValueError, match="context length is 64"):
        run(engine, [256] * 64, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        run(engine, [], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run(engine, [256, 100000], SamplingParams())
    # hitting the context limit finishes with "length" instead of failing
    out, steps = run(engine, [256] * 60, SamplingParams(temperature=0.0, max_new_tokens=50, ignore_eos=True))
    assert len(out) == 4 and steps[-1].finish_reason["type"] == "length"


def test_kv_cache_rollback_cannot_grow_the_cache():
    from sparkit.models.tiny_ling.model import KVCache

    cache = KVCache(1, 1, 4, 16, torch.float32, "cpu")
    cache.length = 10
    cache.truncate(7)
    assert cache.length == 7
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(9)


def test_engine_config_errors_name_the_setting(untrained_model_dir, make_engine):
    with pytest.raises(ValueError, match="expert_weights"):
        make_engine(untrained_model_dir, expert_weights="int4")
    with pytest.raises(ValueError, match="eagle_topk"):
        make_engine(untrained_model_dir, speculative_algorithm="NEXTN", speculative_eagle_topk=2)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        make_engine(untrained_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_num_draft_tokens=8)


@pytest.mark.slow
@pytest.mark.parametrize("experts", ["fp8", "mxfp4"])
def test_decoding_experts_per_forward_computes_the_same_tokens(tiny_model_dir, make_engine, experts):
    """expert_dequant "forward" (decode the picked experts from the quantised bytes each time) and
    "load" (decode once) compute with the same values; speculation stays exact with either."""
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts

    at_load = make_engine(tiny_model_dir, expert_weights=experts)
    per_forward = make_engine(tiny_model_dir, expert_weights=experts, expert_dequant="forward")
    spec = make_engine(tiny_model_dir, expert_weights=experts, expert_dequant="forward", speculative_algorithm="NEXTN", speculative_num_steps=3)
    assert per_forward.model.layers[0].mlp.experts_gate_up.decoded is None
    assert at_load.model.layers[0].mlp.experts_gate_up.decoded is not None
    params = SamplingParams(temperature=0.0, max_new_tokens=32)
    for prompt in sample_prompts(4, seed=3):
        ids = prompt_ids(at_load.tokenizer, prompt)
        expected, _ = run(at_load, ids, params)
        assert run(per_forward, ids, params)[0] == expected
        assert run(spec, ids, params)[0] == expected
