"""The sampling parameters SGLang honours, in the engine: penalties, min_new_tokens, logit_bias and
min_p against a direct computation on the model's logits (a full forward pass, no KV cache, and
the formulas written out here, not the engine's code), plain and under NEXTN; constrained
decoding against the grammar over many sampled requests, plain and under NEXTN."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
regex = pytest.importorskip("regex")

from sparkit.engines.embedded.api import LogprobRequest, SamplingParams  # noqa: E402

TOLERANCE = 1e-4
PROMPT = "count: one two three"


def never() -> bool:
    return False


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    # compact JSON (SGLang's --constrained-json-disable-any-whitespace): tiny-ling would pad with spaces
    plain = EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu",
                                        constrained_json_disable_any_whitespace=True))
    nextn = EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", speculative_algorithm="NEXTN",
                                        speculative_num_steps=3, constrained_json_disable_any_whitespace=True))
    return {"plain": plain, "nextn": nextn}


def generate(engine, ids, params, logprobs=None):
    steps = list(engine.generate(list(ids), params, never, logprobs))
    out = [t for s in steps for t in s.token_ids]
    lps = [v for s in steps if s.logprobs is not None for v in s.logprobs.logprobs]
    return out, steps[-1].finish_reason, lps, steps


def direct_logits(engine, ids: list[int]) -> torch.Tensor:
    """The target's next-token logits after `ids`: one full forward pass, no cache."""
    with torch.inference_mode():
        hidden = engine.model.forward_hidden(torch.tensor([ids]))
        return engine.model.logits(hidden)[0, -1, : engine.vocab_limit].float()


def sglang_processed(logits: torch.Tensor, generated: list[int], p: SamplingParams, stop_ids: set[int]) -> torch.Tensor:
    """SGLang's penalizers and bias over the generated tokens, written out (penaltylib/*.py)."""
    out = logits.clone()
    counts = torch.zeros_like(out)
    for t in generated:
        counts[t] += 1
    out -= p.frequency_penalty * counts
    out -= p.presence_penalty * (counts > 0).float()
    if len(generated) < p.min_new_tokens:
        out[sorted(stop_ids)] = float("-inf")
    seen = counts > 0
    rep = p.repetition_penalty
    out = torch.where(seen & (out < 0), out * rep, torch.where(seen, out / rep, out))
    for token, bias in p.logit_bias.items():
        out[token] += bias
    return out


PENALTIES = {
    "frequency": dict(frequency_penalty=0.5),
    "presence": dict(presence_penalty=1.0),
    "repetition": dict(repetition_penalty=1.3),
    "logit_bias": dict(logit_bias={ord("o"): -100.0, ord("e"): 2.5}),
    "all": dict(frequency_penalty=0.3, presence_penalty=0.4, repetition_penalty=1.2, logit_bias={ord(" "): -1.5}),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "nextn"])
@pytest.mark.parametrize("name", list(PENALTIES))
def test_greedy_penalties_and_bias_pick_the_argmax_of_the_directly_penalised_logits(engines, kind, name):
    engine = engines[kind]
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True, **PENALTIES[name])
    out, _, lps, steps = generate(engine, ids, params, LogprobRequest())
    unpenalised, *_ = generate(engine, ids, SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True))
    assert out != unpenalised  # the penalty changed what was generated: the check below has something to see
    eos = engine.model_config.eos_token_id
    for i, token in enumerate(out):
        row = sglang_processed(direct_logits(engine, ids + out[:i]), out[:i], params, {eos})
        assert token == int(row.argmax()), (i, out[:i])
        assert lps[i] == pytest.approx(float(row.log_softmax(-1)[token]), abs=TOLERANCE)  # logprobs of the processed logits
    if kind == "nextn":
        assert sum(s.verify_step for s in steps) < len(out) - 1  # drafts were accepted: several tokens per verify


@pytest.mark.parametrize("kind", ["plain", "nextn"])
def test_sampled_logprobs_are_of_the_penalised_logits_over_the_temperature(engines, kind):
    engine = engines[kind]
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    params = SamplingParams(temperature=0.7, max_new_tokens=40, ignore_eos=True, seed=5, **PENALTIES["all"])
    out, _, lps, _ = generate(engine, ids, params, LogprobRequest())
    eos = engine.model_config.eos_token_id
    for i, token in enumerate(out):
        row = sglang_processed(direct_logits(engine, ids + out[:i]), out[:i], params, {eos}) / 0.7
        assert lps[i] == pytest.approx(float(row.log_softmax(-1)[token]), abs=TOLERANCE)


@pytest.mark.parametrize("kind", ["plain", "nextn"])
def test_min_new_tokens_holds_back_eos_and_the_stop_tokens(engines, kind):
    engine = engines[kind]
    tok = engine.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)
    eos = engine.model_config.eos_token_id
    free, finish, *_ = generate(engine, ids, SamplingParams(temperature=0, max_new_tokens=200))
    assert finish == {"type": "stop", "matched": eos}
    floor = len(free) + 10
    space = ord(" ")
    held, finish, *_ = generate(engine, ids, SamplingParams(temperature=0, max_new_tokens=200, min_new_tokens=floor,
                                                            stop_token_ids=[space]))
    assert len(held) >= floor and eos not in held[:floor - 1] and space not in held[:floor - 1]
    assert finish["type"] == "stop"  # then a stop token ends it, as soon as it may
    for i in range(floor - 1):  # each token is the argmax with the stop tokens masked
        row = sglang_processed(direct_logits(engine, ids + held[:i]), held[:i],
                               SamplingParams(min_new_tokens=floor), {eos, space})
        assert held[i] == int(row.argmax())


def test_min_p_of_one_keeps_only_the_most_likely_token(engines):
    engine = engines["plain"]
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    greedy, *_ = generate(engine, ids, SamplingParams(temperature=0, max_new_tokens=30, ignore_eos=True))
    sampled, *_ = generate(engine, ids, SamplingParams(temperature=1.5, min_p=1.0, max_new_tokens=30, ignore_eos=True, seed=1))
    loose, *_ = generate(engine, ids, SamplingParams(temperature=1.5, max_new_tokens=30, ignore_eos=True, seed=1))
    assert sampled == greedy and loose != greedy


# -- constrained decoding --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _xgrammar_for_grammar_tests(request):
    if "grammar" in request.node.name or "regex" in request.node.name or "json" in request.node.name:
        pytest.importorskip("xgrammar")  # sparkit[embedded] installs it; without it grammars are a 400

REGEXES = {  # pattern: whether most samples should end within the token budget
    r"[-+]?[0-9]+[ \n]*": True,  # the sgl frontend's gen(dtype=int)
    r"(yes|no|maybe), [a-z]{1,6}\.": True,
    r"\"[\w\d\s]*\"": False,  # gen(dtype=str): tiny-ling rarely closes the string
}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                            "mood": {"enum": ["calm", "wild"]}},
          "required": ["name", "age", "mood"]}


def _matches_schema(value) -> bool:
    return (isinstance(value, dict) and set(value) == {"name", "age", "mood"} and isinstance(value["name"], str)
            and len(value["name"]) <= 8 and isinstance(value["age"], int) and 0 <= value["age"] <= 120
            and value["mood"] in ("calm", "wild"))


@pytest.mark.parametrize("kind", ["plain", "nextn"])
@pytest.mark.parametrize("pattern", list(REGEXES))
def test_sampled_outputs_match_the_regex(engines, kind, pattern):
    engine = engines[kind]
    grammar = engine.grammar_compiler.compile("regex", pattern)
    tok = engine.tokenizer
    finished = 0
    for seed in range(16):
        ids = tok.encode(f"Q{seed}: say something:", add_special_tokens=False)
        out, finish, *_ = generate(engine, ids, SamplingParams(temperature=1.0, max_new_tokens=24, grammar=grammar, seed=seed))
        text = tok.decode([t for t in out if t != engine.model_config.eos_token_id])
        if finish["type"] == "stop":
            finished += 1
            assert regex.fullmatch(pattern, text), (seed, text)
        else:  # cut by max_new_tokens: what there is must still be the start of a match
            assert regex.fullmatch(pattern, text, partial=True), (seed, text)
    assert finished >= (5 if REGEXES[pattern] else 0)
    unconstrained = [tok.decode(generate(engine, tok.encode(f"Q{s}: say something:", add_special_tokens=False),
                                         SamplingParams(temperature=1.0, max_new_tokens=24, seed=s))[0]) for s in range(5)]
    assert not all(regex.fullmatch(pattern, t, partial=True) for t in unconstrained)  # the grammar did the work


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "nextn"])
def test_sampled_outputs_are_json_matching_the_schema(engines, kind):
    engine = engines[kind]
    grammar = engine.grammar_compiler.compile("json_schema", json.dumps(SCHEMA))
    tok = engine.tokenizer
    for seed in range(12):
        ids = tok.encode(f"Person {seed}:", add_special_tokens=False)
        out, finish, *_ = generate(engine, ids, SamplingParams(temperature=1.0, max_new_tokens=200, grammar=grammar, seed=seed))
        assert finish == {"type": "stop", "matched": engine.model_config.eos_token_id}, seed
        value = json.loads(tok.decode(out[:-1]))
        assert _matches_schema(value), value


def test_a_grammar_ends_the_request_when_it_is_complete_even_with_ignore_eos(engines):
    engine = engines["nextn"]
    grammar = engine.grammar_compiler.compile("regex", r"(yes|no)")
    out, finish, *_ = generate(engine, engine.tokenizer.encode("Answer:", add_special_tokens=False),
                               SamplingParams(temperature=0, max_new_tokens=30, grammar=grammar, ignore_eos=True))
    assert engine.tokenizer.decode(out[:-1]) in ("yes", "no") and finish == {"type": "stop", "matched": out[-1]}


def test_greedy_constrained_nextn_output_equals_plain(engines):
    pattern = r"[a-z ]{4,40}\."
    outs = []
    for kind in ("plain", "nextn"):
        engine = engines[kind]
        grammar = engine.grammar_compiler.compile("regex", pattern)
        out, *_ = generate(engine, engine.tokenizer.encode(PROMPT, add_special_tokens=False),
                           SamplingParams(temperature=0, max_new_tokens=50, grammar=grammar, frequency_penalty=0.2))
        outs.append(out)
    assert outs[0] == outs[1]


@pytest.mark.parametrize(("kind", "source", "needle"), [
    ("regex", "(unclosed", "Failed to compile regex grammar"),
    ("json_schema", "{not json", "Failed to compile json grammar"),
    ("json_schema", json.dumps({"type": "integer", "multipleOf": 3}), "keyword(s) multipleOf would be ignored"),
    ("ebnf", "root ::= ", "Failed to compile ebnf grammar"),
])
def test_a_grammar_that_does_not_compile_is_named(engines, kind, source, needle):
    from sparkit.engines.embedded.grammar import GrammarError

    with pytest.raises(GrammarError, match=regex.escape(needle)):
        engines["plain"].grammar_compiler.compile(kind, source)


SCHEMAS_FOR_THE_PORT = [
    {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "credit-card"},
    {"type": "string", "pattern": "a+", "maxLength": 3},
    {"type": "array", "items": {"not": {"type": "null"}}},
    {"$defs": {"x": {"if": {}, "then": {}}}},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}},
    {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "integer"}]},
]


@pytest.mark.slow
@pytest.mark.parametrize("schema", SCHEMAS_FOR_THE_PORT)
def test_the_schema_check_agrees_with_sglangs(schema):
    """grammar.validate_xgrammar_json_schema is a port of SGLang 0.5.23's: both on the same schemas."""
    import importlib.util

    sglang = pytest.importorskip("sglang")
    from pathlib import Path

    path = Path(sglang.__file__).parent / "srt" / "constrained" / "json_schema_validation.py"
    spec = importlib.util.spec_from_file_location("_sglang_schema_validation", path)
    theirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs)
    from sparkit.engines.embedded.grammar import validate_xgrammar_json_schema

    def outcome(check):
        try:
            check(schema)
            return None
        except ValueError as exc:
            return str(exc)

    assert outcome(validate_xgrammar_json_schema) == outcome(theirs.validate_xgrammar_json_schema)
