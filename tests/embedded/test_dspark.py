"""DSpark on the embedded engine: greedy output equals plain greedy output token for token, the
verify accounting SGLang's meta_info is computed from, the draft computing with the target's own
embedding and lm_head modules (the FP8 head included), the resolved args and activation report
SGLang gives for the same launch, and the trained draft against an untrained one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparkit.engines.embedded.api import SamplingParams  # noqa: E402
from sparkit.errors import LaunchError  # noqa: E402

# The startup probe's prompts (sparkit.checks.runner.PROBE_PROMPTS): prose tiny-ling never saw.
PROBE = ("The quick brown fox jumps over the lazy dog. The quick brown fox",
         "Once upon a time, in a small village by the sea, there lived", "1, 2, 3, 4, 5, 6, 7, 8,")
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=64, ignore_eos=True)


def never() -> bool:
    return False


def corpus_prompts(model_dir, count: int, seed: int) -> list[list[int]]:
    from sparkit.models.dspark.target import tiny_ling_prompts

    return tiny_ling_prompts(model_dir, count, seed)


def probe_prompts(engine) -> list[list[int]]:
    tok = engine.tokenizer
    return [[tok.bos_token_id] + tok.encode(p, add_special_tokens=False) for p in PROBE]


def generate(engine, prompt, params=GREEDY):
    steps = list(engine.generate(list(prompt), params, never))
    return [t for s in steps for t in s.token_ids], steps


def accept_length(engine, prompts) -> float:
    committed = verify = 0
    for prompt in prompts:
        for step in generate(engine, prompt)[1]:
            if step.verify_step:
                verify += 1
                committed += len(step.token_ids)
    return committed / verify


@pytest.fixture(scope="module")
def engines(tiny_model_dir, dspark_draft_dir):
    """(plain, DSpark) engines on bf16 experts and head, and on the default recipe's stack (fp8
    experts, FP8 head)."""
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    out = {}
    for stack, (experts, head) in {"bf16": ("bf16", "bf16"), "fp8": ("fp8", "fp8")}.items():
        common = dict(model_path=str(tiny_model_dir), device="cpu", expert_weights=experts, lm_head_dtype=head)
        out[stack] = (EmbeddedEngine(EngineConfig(**common)),
                      EmbeddedEngine(EngineConfig(**common, speculative_algorithm="DSPARK",
                                                  speculative_draft_model_path=str(dspark_draft_dir))))
    return out


def assert_lossless(plain, dspark, prompts) -> None:
    for prompt in prompts:
        expected, _ = generate(plain, prompt)
        got, steps = generate(dspark, prompt)
        assert got == expected, f"prompt {prompt[:12]}...: DSpark diverged at token " + str(
            next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b))
        assert [s.verify_step for s in steps[1:]] == [True] * (len(steps) - 1)


def test_greedy_dspark_output_equals_plain_greedy_output(engines, tiny_model_dir):
    """Lossless: the target's own verify rule decides every token, so the same text comes out token
    for token (a tiny-ling prompt: long accepted blocks; prose it never saw: short ones, many
    rejections), with FP8 experts and the FP8 head."""
    plain, dspark = engines["fp8"]
    assert_lossless(plain, dspark, corpus_prompts(tiny_model_dir, 1, seed=777) + probe_prompts(plain)[1:2])


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["bf16", "fp8"])
def test_greedy_dspark_output_equals_plain_greedy_output_on_many_prompts(engines, tiny_model_dir, stack):
    """The same on 16 of tiny-ling's prompts and the startup probe's three, on both stacks."""
    plain, dspark = engines[stack]
    assert_lossless(plain, dspark, corpus_prompts(tiny_model_dir, 16, seed=777) + probe_prompts(plain))


@pytest.mark.slow
def test_greedy_dspark_equals_plain_on_many_prompts_with_stop_rules(engines, tiny_model_dir):
    """More prompts, EOS honoured and short max_new_tokens (a block cut by the length limit or by
    a stop token commits only up to it)."""
    plain, dspark = engines["fp8"]
    for i, prompt in enumerate(corpus_prompts(tiny_model_dir, 48, seed=4242)):
        params = SamplingParams(temperature=0.0, max_new_tokens=5 + i % 40, ignore_eos=i % 2 == 0)
        assert generate(dspark, prompt, params)[0] == generate(plain, prompt, params)[0], i


def test_each_verify_step_accounts_its_block_as_sglang_counts_it(engines, tiny_model_dir):
    """What meta_info's spec_verify_ct, spec_accept_length and spec_accept_rate are computed from:
    a step commits its accepted drafts and the bonus token, of block_size proposed."""
    _, dspark = engines["bf16"]
    block = dspark.dspark.block_size
    tokens, steps = generate(dspark, corpus_prompts(tiny_model_dir, 1, seed=99)[0])
    verify = [s for s in steps if s.verify_step]
    assert all(s.num_proposed_drafts == block for s in verify)
    assert all(len(s.token_ids) == s.num_accepted_drafts + 1 for s in verify[:-1])
    assert max(len(s.token_ids) for s in verify) <= block + 1
    assert sum(len(s.token_ids) for s in steps) == len(tokens) == GREEDY.max_new_tokens
    assert any(s.num_accepted_drafts >= 4 for s in verify)  # a trained draft gets long runs accepted


def test_the_draft_computes_with_the_targets_own_modules_and_the_report_says_so(engines):
    for stack in ("bf16", "fp8"):
        _, dspark = engines[stack]
        draft = dspark.dspark.draft
        assert draft.lm_head is dspark.model.lm_head and draft.embed_tokens is dspark.model.embed_tokens
        report = dspark.activation_report()
        target, drafted = report.target, report.draft
        assert drafted.model_class == "LingDSparkModel"
        assert drafted.lm_head.shared_with_target and drafted.lm_head.module_id == target.lm_head.module_id
        assert drafted.lm_head.weight_dtype == target.lm_head.weight_dtype
        assert drafted.embed_tokens.shared_with_target
        assert (report.speculative.algorithm, report.speculative.block_size, report.speculative.num_draft_tokens) == (
            "DSPARK", 8, 9)
    assert engines["fp8"][1].activation_report().draft.lm_head.weight_dtype == "float8_e4m3fn"


def test_resolved_args_are_sglangs_for_a_dspark_launch(engines, dspark_draft_dir):
    """SGLang's _handle_dspark: one step, topk 1, block + 1 tokens verified."""
    args = engines["bf16"][1].server_args()
    assert args["speculative_algorithm"] == "DSPARK"
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (1, 1, 9)
    assert args["speculative_dspark_block_size"] == 8
    assert args["speculative_draft_model_path"] == str(dspark_draft_dir)


@pytest.mark.slow
def test_the_trained_draft_is_accepted_far_more_than_an_untrained_one(engines, tiny_model_dir, random_draft_dir):
    """The floor the acceptance check uses for DSpark (2.0) lies between the two on the startup
    probe's prompts: the trained draft clears it, the untrained one does not."""
    from sparkit.contract.flag_table import DEFAULT_MIN_ACCEPT_LENGTH_DSPARK
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    plain, trained = engines["fp8"]
    untrained = EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", expert_weights="fp8",
                                            lm_head_dtype="fp8", speculative_algorithm="DSPARK",
                                            speculative_draft_model_path=str(random_draft_dir)))
    probe = probe_prompts(plain)
    good, bad = accept_length(trained, probe), accept_length(untrained, probe)
    assert bad < 1.2 < DEFAULT_MIN_ACCEPT_LENGTH_DSPARK < 3.0 < good
    assert generate(untrained, probe[0])[0] == generate(plain, probe[0])[0]  # still lossless


def test_sampling_verifies_by_rejection_and_keeps_the_targets_logprobs(engines, tiny_model_dir):
    """A sampled DSpark request: reproducible under its seed, every token's logprob the target's
    (as plain decoding would report it for that token)."""
    from sparkit.engines.embedded.api import LogprobRequest

    _, dspark = engines["bf16"]
    prompt = corpus_prompts(tiny_model_dir, 1, seed=5)[0]
    params = SamplingParams(temperature=0.8, max_new_tokens=40, seed=11, ignore_eos=True)
    want = LogprobRequest(input_start=None, top=0)
    first = list(dspark.generate(prompt, params, never, want))
    again = list(dspark.generate(prompt, params, never, want))
    tokens = [t for s in first for t in s.token_ids]
    assert tokens == [t for s in again for t in s.token_ids] and len(tokens) == 40
    logprobs = [lp for s in first for lp in s.logprobs.logprobs]
    model, seq = dspark.model, list(prompt)
    with torch.inference_mode():
        logits = model.logits(model.forward_hidden(torch.tensor([seq + tokens])))[0, len(seq) - 1:-1, :dspark.vocab_limit]
    expected = (logits.float() / 0.8).log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-3)


def test_a_draft_for_another_target_is_refused_naming_both(tiny_model_dir, dspark_draft_dir, tmp_path):
    import json
    import shutil

    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    other = tmp_path / "draft"
    shutil.copytree(dspark_draft_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["num_target_layers"] = 6
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(LaunchError, match="num_target_layers 6 .the target's: 4."):
        EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", speculative_algorithm="DSPARK",
                                    speculative_draft_model_path=str(other)))


def test_dspark_flags_are_validated_as_sglang_validates_them():
    from sparkit.engines.embedded.settings import build_arg_parser, validate_args

    parser = build_arg_parser()
    problems = validate_args(parser.parse_args(["--model-path", "x", "--speculative-algorithm", "DSPARK"]))
    assert problems == ["--speculative-algorithm DSPARK needs --speculative-draft-model-path"]
    problems = validate_args(parser.parse_args(["--model-path", "x", "--speculative-algorithm", "dspark",
                                                "--speculative-draft-model-path", "d", "--speculative-dspark-block-size",
                                                "8", "--speculative-num-draft-tokens", "4"]))
    assert problems == ["--speculative-num-draft-tokens must be --speculative-dspark-block-size + 1 under DSPARK "
                        "(the anchor and the drafted tokens)"]
    assert validate_args(parser.parse_args(["--model-path", "x", "--speculative-dspark-block-size", "8"]))


def test_the_target_hands_the_draft_its_residual_stream_after_the_chosen_layers(tiny_model_dir):
    """BailingMoeV3's set_dspark_layers_to_capture: the updated residual after layer i, before any
    norm (the last layer's before the final norm), concatenated in layer order; on the fast path
    (decode, verify) as on the modules' (training)."""
    from sparkit.models.checkpoint import load_checkpoint

    _, model = load_checkpoint(tiny_model_dir)
    ids = torch.tensor([corpus_prompts(tiny_model_dir, 1, seed=3)[0]])
    with torch.no_grad():
        x, after = model.embed_tokens(ids), []
        for layer in model.layers:
            x = layer(x, model.rope)
            after.append(x)
        hidden, captured = model.forward_hidden(ids, capture=(1, 3))
        assert torch.allclose(captured, torch.cat((after[1], after[3]), dim=-1), atol=1e-5)
        assert torch.allclose(hidden, model.norm(after[3]), atol=1e-5)  # the head reads the normed last one
        model.prepare_inference()
        cache = model.new_cache(ids.shape[1] + 1)
        _, fast = model.forward_hidden(ids, cache, 0, capture=(1, 3))
    assert torch.allclose(fast, captured, atol=1e-4)


def test_requests_decoded_together_each_get_what_they_get_alone(tiny_model_dir, dspark_draft_dir):
    """Continuous batching under DSpark: prompts prefilled in chunks, three requests running at once
    each take one verify step per decode, and each commits the very steps it commits alone (its own
    draft context: a shared one would draft from another request's text and accept less); no
    row-batched forward, and the startup note says why."""
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    engine = EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", lm_head_dtype="bf16",
                                         expert_weights="bf16", speculative_algorithm="DSPARK",
                                         speculative_draft_model_path=str(dspark_draft_dir),
                                         max_running_requests=3, chunked_prefill_size=5))
    assert engine.rows_plan is None and "DSpark" in engine.rows_check.why
    prompts = corpus_prompts(tiny_model_dir, 2, seed=31) + probe_prompts(engine)[2:]
    alone = [[s.token_ids for s in generate(engine, p)[1]] for p in prompts]
    seqs = [engine.open(list(p), GREEDY) for p in prompts]
    together: list[list[list[int]]] = [[] for _ in seqs]
    for i, seq in enumerate(seqs):
        out = None
        while out is None:
            out = engine.prefill(seq)
        together[i].append(out.token_ids)
    while any(not s.finished for s in seqs):
        running = [i for i, s in enumerate(seqs) if not s.finished]
        for i, out in zip(running, engine.decode([seqs[i] for i in running])):
            together[i].append(out.token_ids)
    for seq in seqs:
        engine.release(seq)
    assert together == alone
    assert max(len(step) for steps in alone for step in steps) > 2  # blocks were accepted, not only bonus tokens


@pytest.mark.parametrize("draft", ["v3_short_draft_dir", "v3_dspark_draft_dir"])
def test_greedy_dspark_on_tiny_ling_v3_equals_plain_greedy_with_the_kda_state_rolled_back(v3_model_dir, draft, request):
    """The Ling-3.0-shaped target (KDA x3 + gated MLA): a rejected block's positions leave the MLA
    cache by length and the KDA state by rollback to the last accepted token (HybridCache), so
    greedy DSpark is plain greedy token for token, on a corpus prompt and on prose it never saw;
    with a barely trained draft (blocks rejected at their first token) and the shipped one (blocks
    cut in their middle)."""
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    draft_dir = request.getfixturevalue(draft)

    common = dict(model_path=str(v3_model_dir), device="cpu", lm_head_dtype="bf16")
    plain = EmbeddedEngine(EngineConfig(**common))
    dspark = EmbeddedEngine(EngineConfig(**common, speculative_algorithm="DSPARK",
                                         speculative_draft_model_path=str(draft_dir)))
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    rejected = cut = 0
    for prompt in corpus_prompts(v3_model_dir, 1, seed=7) + probe_prompts(plain)[:1]:
        want, _ = generate(plain, prompt, params)
        got, steps = generate(dspark, prompt, params)
        assert got == want
        rejected += sum(1 for s in steps if s.verify_step and s.num_accepted_drafts < s.num_proposed_drafts)
        cut += sum(1 for s in steps if s.verify_step and 0 < s.num_accepted_drafts < s.num_proposed_drafts)
    assert rejected > 0  # blocks were rejected, so the rollback ran
    if draft == "v3_dspark_draft_dir":
        assert cut > 0  # and some inside a block: the state of a position the verify forward passed
