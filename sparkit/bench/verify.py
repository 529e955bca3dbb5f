"""`sparkit verify`: the correctness gate for an optimisation (docs/protocols.md).

Against a baseline recipe, on a fixed prompt set, greedy, 256 new tokens, ignore_eos:

1. Byte-exact outputs: the candidate's greedy text equals the baseline's, prompt by prompt.
2. Accept length within 0.05 of the baseline's when both speculate.
3. State pollution: the candidate's greedy requests are re-run after interleaved
   temperature-sampled requests and must reproduce its own first pass byte for byte.

Changes that legitimately change rounding (lm_head fp8/fp32 vs bf16, weight
formats, dtype) are declared as such (detected from the two recipes, or
declared with --rounding-changing) and judged instead by token agreement and
accept length: agreement is reported; accept length must stay within 5% of
the baseline's (the study's break-even for a depth step), and the
state-pollution re-run must still be byte-exact (it compares a configuration
with itself).

Two agreement figures are reported:
- prefix agreement: over all prompts, the tokens before the first divergence
  divided by the tokens generated (after a divergence the contexts differ);
- teacher-forced agreement: the candidate is given the baseline's own output as
  context at every TEACHER_STRIDE-th position and asked for one greedy token;
  the share that equals the baseline's next token. This is the per-token
  agreement rate of a rounding change, unaffected by where a first divergence
  happens to fall. It needs the served tokenizer (prompts are sent as ids).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkit.contract.checks import CheckResult, Status
from sparkit.recipes.schema import rounding_keys

ACCEPT_TOLERANCE = 0.05  # absolute, for rounding-preserving changes
ROUNDING_ACCEPT_TOLERANCE = 0.05  # relative, for declared rounding-changing changes
MAX_NEW_TOKENS = 256
TEACHER_STRIDE = 16
TOP_LOGPROBS = 10  # candidates asked for at a divergence
# Below this logprob margin between the two tokens a divergence is a near-tie (bf16 vs FP8
# rounding of a logit moves it by a few hundredths; sparkit.kernels.rescoring).
NEAR_TIE_MARGIN = 0.1

# Recipe keys whose change alters floating-point rounding of the logits: the schema's fields marked
# CHANGES_ROUNDING (tp and ep among them: each rank sums its shard and the all-reduce adds the partial
# sums in another order than one GPU would).
ROUNDING_KEYS = rounding_keys()

VERIFY_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "Question: A farmer has 17 sheep and buys 5 more. How many sheep does he have?\nAnswer:",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "The three primary colours are",
    "Write a short note to a colleague about tomorrow's meeting:\n",
    "1, 2, 3, 5, 8, 13,",
    "In the beginning the engineers measured everything twice, because",
]


@dataclass
class GreedyOutput:
    prompt_index: int
    text: str
    output_ids: list[int] | None
    completion_tokens: int
    spec_verify_ct: int | None

    @property
    def accept_length(self) -> float | None:
        return self.completion_tokens / self.spec_verify_ct if self.spec_verify_ct else None


@dataclass
class Divergence:
    """Where a candidate's greedy output first leaves the baseline's, and the candidate's own
    log-probabilities of both tokens there (given the baseline's text up to that point): a near-tie
    (a small margin) is where a change of rounding picks the other token."""

    prompt_index: int
    token: int  # position in the output, in tokens
    character: int  # position in the output text
    baseline_token: str
    candidate_token: str
    candidate_logprob: float | None = None  # of the token the candidate chose
    baseline_logprob: float | None = None  # of the baseline's token, under the candidate (None: not in its top list)
    top_checked: int = 0

    @property
    def margin(self) -> float | None:
        if self.candidate_logprob is None or self.baseline_logprob is None:
            return None
        return self.candidate_logprob - self.baseline_logprob

    def sentence(self) -> str:
        where = f"prompt {self.prompt_index} diverges at token {self.token} (character {self.character})"
        chose = f"baseline {self.baseline_token!r}, candidate {self.candidate_token!r}"
        if self.candidate_logprob is None:
            return f"{where}: {chose}"
        if self.margin is None:
            return (f"{where}: {chose}; the baseline's token is not among the candidate's top {self.top_checked} "
                    "there: not a near-tie")
        kind = "a near-tie, where a change of rounding picks the other token" if self.margin < NEAR_TIE_MARGIN \
            else "not a near-tie"
        return (f"{where}: {chose}; the candidate's logprobs there: {self.candidate_token!r} {self.candidate_logprob:.3f}, "
                f"{self.baseline_token!r} {self.baseline_logprob:.3f} (margin {self.margin:.3f}: {kind})")


@dataclass
class SideResult:
    """One configuration's outputs."""

    recipe: str
    speculative: bool
    greedy: list[GreedyOutput]
    rerun: list[GreedyOutput] = field(default_factory=list)  # after interleaved sampled requests
    server_accept_length: float | None = None
    prompt_ids: list[list[int]] | None = None  # the prompts as sent, when the tokenizer was available
    teacher_forced: dict[str, int] | None = None  # {"agree": n, "total": m} against a baseline's outputs
    divergences: list[Divergence] = field(default_factory=list)  # where its outputs first leave a baseline's

    @property
    def accept_length(self) -> float | None:
        values = [g.accept_length for g in self.greedy if g.accept_length is not None]
        return sum(values) / len(values) if values else None


async def collect_outputs(
    url: str,
    *,
    api_key: str | None = None,
    prompts: list[str] = VERIFY_PROMPTS,
    max_new_tokens: int = MAX_NEW_TOKENS,
    pollution_rerun: bool = True,
    recipe: str = "",
    speculative: bool = False,
    prompt_ids: list[list[int]] | None = None,
    teacher: list[GreedyOutput] | None = None,
    teacher_forcing: bool = True,
) -> SideResult:
    """Greedy outputs of one server; optionally the state-pollution re-run, and against `teacher`
    (a baseline's outputs) where each output first leaves it, explained, and (`teacher_forcing`)
    the teacher-forced agreement."""
    from sparkit.bench.runner import internal_state
    from sparkit.bench.workload import tokenizer_from_server
    from sparkit.client import EngineClient

    greedy = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    sampled = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": max(16, max_new_tokens // 4), "ignore_eos": True}

    def as_output(index: int, gen: Any) -> GreedyOutput:
        return GreedyOutput(index, gen.text, gen.output_ids, gen.completion_tokens, gen.spec_verify_ct)

    async with EngineClient(url, api_key=api_key) as client:
        if prompt_ids is None:
            try:
                tokenizer = tokenizer_from_server(await client.model_info(), await client.server_info())
            except Exception:
                tokenizer = None
            if tokenizer is not None:
                prompt_ids = [tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]

        async def ask(i: int, params: dict[str, Any], prompt_index: int | None = None) -> Any:
            j = i if prompt_index is None else prompt_index
            if prompt_ids is not None:
                return await client.generate(input_ids=prompt_ids[j], sampling_params=params)
            return await client.generate(prompts[j], sampling_params=params)

        first = [as_output(i, await ask(i, greedy)) for i in range(len(prompts))]
        again: list[GreedyOutput] = []
        if pollution_rerun:
            for i in range(len(prompts)):
                # A sampled request on the same prompt and one on another, then the greedy one again.
                await ask(i, sampled)
                await ask(i, sampled, (i + 1) % len(prompts))
                again.append(as_output(i, await ask(i, greedy)))
        forced = None
        if teacher is not None and teacher_forcing and prompt_ids is not None:
            forced = {"agree": 0, "total": 0}
            one = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
            for out in teacher:
                ids = out.output_ids or []
                for position in range(0, len(ids), TEACHER_STRIDE):
                    gen = await client.generate(input_ids=prompt_ids[out.prompt_index] + ids[:position], sampling_params=one)
                    forced["total"] += 1
                    forced["agree"] += int(bool(gen.output_ids) and gen.output_ids[0] == ids[position])
        divergences = []
        if teacher is not None and prompt_ids is not None:
            for base, mine in zip(teacher, first):
                found = first_divergence(base, mine)
                if found is not None:
                    divergences.append(await explain_divergence(client, prompt_ids[base.prompt_index], base, mine, *found))
        server_accept = internal_state(await client.server_info()).get("avg_spec_accept_length")
    return SideResult(recipe, speculative, first, again, server_accept, prompt_ids, forced, divergences)


def first_divergence(baseline: GreedyOutput, candidate: GreedyOutput) -> tuple[int, int] | None:
    """(token, character) where `candidate` first differs from `baseline`; None when identical or
    when the server returned no output ids."""
    if baseline.text == candidate.text or baseline.output_ids is None or candidate.output_ids is None:
        return None
    token = next((i for i, (a, b) in enumerate(zip(baseline.output_ids, candidate.output_ids)) if a != b),
                 min(len(baseline.output_ids), len(candidate.output_ids)))
    character = next((i for i, (a, b) in enumerate(zip(baseline.text, candidate.text)) if a != b),
                     min(len(baseline.text), len(candidate.text)))
    return token, character


async def explain_divergence(client: Any, prompt: list[int], baseline: GreedyOutput, candidate: GreedyOutput,
                             token: int, character: int) -> Divergence:
    """Ask the candidate for its top log-probabilities at the divergence, given the baseline's
    output up to it (SGLang's return_logprob with top_logprobs_num)."""
    ids_a, ids_b = baseline.output_ids or [], candidate.output_ids or []
    if token >= len(ids_a) or token >= len(ids_b):
        return Divergence(baseline.prompt_index, token, character, "(end)" if token >= len(ids_a) else "?",
                          "(end)" if token >= len(ids_b) else "?")
    one = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    gen = await client.generate(input_ids=prompt + ids_a[:token], sampling_params=one,
                                extra={"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS,
                                       "return_text_in_logprobs": True})
    top = (gen.meta.get("output_top_logprobs") or [[]])[0] or []
    by_id = {int(entry[1]): (float(entry[0]), entry[2] if len(entry) > 2 else None) for entry in top
             if isinstance(entry, (list, tuple)) and len(entry) >= 2 and entry[0] is not None}
    a, b = ids_a[token], ids_b[token]
    text_a = by_id.get(a, (None, None))[1] or _token_text(baseline.text, character)
    text_b = by_id.get(b, (None, None))[1] or _token_text(candidate.text, character)
    return Divergence(baseline.prompt_index, token, character, text_a, text_b,
                      by_id.get(b, (None,))[0], by_id.get(a, (None,))[0], len(top))


def _token_text(text: str, at: int) -> str:
    return text[at:at + 8] or "(end)"


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def rounding_changes(baseline: dict[str, Any], candidate: dict[str, Any], declared: list[str] = ()) -> list[str]:
    """Rounding-changing differences between two resolved recipes, as 'key: a -> b'."""
    a, b = _flatten(baseline), _flatten(candidate)
    found = [f"{k}: {a.get(k)} -> {b.get(k)}" for k in ROUNDING_KEYS if a.get(k) != b.get(k)]
    found += _speculative_rounding(a, b)
    return found + [f"declared: {d}" for d in declared]


def _speculative_rounding(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Speculative decoding turned on, off or changed is rounding-changing on an engine whose
    verify pass does not replay one-token decoding exactly (its adapter says: exact_speculative)."""
    from sparkit.engines.base import get_adapter

    key = "stack.speculative.method"
    if a.get(key) == b.get(key):
        return []
    engines = {a.get("engine"), b.get("engine")}
    inexact = sorted(e for e in engines if e and not getattr(get_adapter(e), "exact_speculative", False))
    if not inexact:
        return []
    return [f"{key}: {a.get(key)} -> {b.get(key)} (on {', '.join(inexact)} the verify pass rounds differently "
            "from one-token decoding)"]


def token_agreement(baseline: list[GreedyOutput], candidate: list[GreedyOutput]) -> tuple[float | None, str]:
    """Tokens before the first divergence / tokens generated; characters when ids are missing."""
    unit = "tokens"
    matched = total = 0
    for a, b in zip(baseline, candidate):
        if a.output_ids is not None and b.output_ids is not None:
            x, y = a.output_ids, b.output_ids
        else:
            unit = "characters (the server returned no output_ids)"
            x, y = a.text, b.text
        prefix = 0
        for u, v in zip(x, y):
            if u != v:
                break
            prefix += 1
        matched += prefix
        total += max(len(x), len(y))
    return (matched / total if total else None), unit


def _first_mismatch(a: list[GreedyOutput], b: list[GreedyOutput]) -> list[str]:
    evidence = []
    for x, y in zip(a, b):
        if x.text != y.text:
            at = next((i for i, (u, v) in enumerate(zip(x.text, y.text)) if u != v), min(len(x.text), len(y.text)))
            evidence.append(f"prompt {x.prompt_index}: differs at character {at}: {x.text[at:at + 30]!r} vs {y.text[at:at + 30]!r}")
    return evidence


def _paired_noise(a: list[GreedyOutput], b: list[GreedyOutput]) -> float | None:
    diffs = [y.accept_length - x.accept_length for x, y in zip(a, b)
             if x.accept_length is not None and y.accept_length is not None]
    if len(diffs) < 2:
        return None
    m = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1))
    return 2.0 * sd / math.sqrt(len(diffs))


def judge(baseline: SideResult, candidate: SideResult, rounding: list[str], max_new_tokens: int = MAX_NEW_TOKENS) -> list[CheckResult]:
    results: list[CheckResult] = []
    identical = sum(1 for a, b in zip(baseline.greedy, candidate.greedy) if a.text == b.text)
    n = len(candidate.greedy)
    agreement, unit = token_agreement(baseline.greedy, candidate.greedy)
    agreement_text = f"prefix agreement {agreement:.1%} ({unit} before the first divergence)" if agreement is not None else "prefix agreement n/a"
    forced = candidate.teacher_forced
    forced_rate = forced["agree"] / forced["total"] if forced and forced["total"] else None
    if forced_rate is not None:
        agreement_text += f", teacher-forced {forced_rate:.1%} of {forced['total']} positions"
    data = {"identical": identical, "prompts": n, "agreement_rate": agreement, "agreement_unit": unit,
            "teacher_forced_agreement": forced_rate, "teacher_forced_positions": forced["total"] if forced else 0}
    mismatches = _first_mismatch(baseline.greedy, candidate.greedy)
    if candidate.divergences:
        # Each difference explained: where it starts in tokens, and whether the candidate's two
        # tokens there were a near-tie (the teacher-forced figure samples every TEACHER_STRIDE-th
        # position, so an early divergence can fall between its samples).
        mismatches = [d.sentence() for d in candidate.divergences]
        data["divergences"] = [asdict(d) | {"margin": d.margin} for d in candidate.divergences]
        near = sum(1 for d in candidate.divergences if d.margin is not None and d.margin < NEAR_TIE_MARGIN)
        agreement_text += (f"; {near} of the {len(candidate.divergences)} divergences start at a near-tie "
                           f"(margin < {NEAR_TIE_MARGIN} in the candidate's logprobs)")
        if forced_rate == 1.0:
            agreement_text += (f": teacher-forced agreement samples positions 0, {TEACHER_STRIDE}, {2 * TEACHER_STRIDE}, ... "
                               "of the baseline's outputs, and no divergence falls on one")
    if rounding:
        results.append(CheckResult(
            "greedy_outputs", "greedy outputs vs baseline", Status.PASS if identical == n else Status.WARN,
            f"rounding-changing ({'; '.join(rounding)}): not judged by bit equality; "
            f"{identical}/{n} outputs identical, {agreement_text}",
            evidence=mismatches[:8], data=data,
            cause=None if identical == n else "expected for a change of rounding; judged by accept length and task accuracy",
        ))
    else:
        results.append(CheckResult(
            "greedy_outputs", "greedy outputs byte-exact vs baseline", Status.PASS if identical == n else Status.FAIL,
            f"{identical}/{n} greedy {max_new_tokens}-token outputs byte-identical ({agreement_text})",
            evidence=mismatches[:8], data=data,
            fix=None if identical == n else "the change alters greedy output: find the op that changes numerics, or declare it rounding-changing (--rounding-changing)",
        ))

    a_acc, b_acc = baseline.accept_length, candidate.accept_length
    acc_data = {"baseline": a_acc, "candidate": b_acc, "baseline_server": baseline.server_accept_length, "candidate_server": candidate.server_accept_length}
    if baseline.speculative and candidate.speculative and a_acc is not None and b_acc is not None:
        delta = b_acc - a_acc
        if rounding:
            # Different outputs are different texts with their own accept lengths: allow the
            # prompt-to-prompt noise of that difference, and at least 5%.
            noise = _paired_noise(baseline.greedy, candidate.greedy)
            tolerance = max(ROUNDING_ACCEPT_TOLERANCE * a_acc, noise or 0.0)
            label = f"max(5% of baseline, 2 x paired standard error = {noise if noise is not None else math.nan:.3f})"
        else:
            tolerance, label = ACCEPT_TOLERANCE, f"{ACCEPT_TOLERANCE}"
        ok = abs(delta) <= tolerance
        results.append(CheckResult(
            "accept_length", "accept length vs baseline", Status.PASS if ok else Status.FAIL,
            f"accept length {b_acc:.3f} vs baseline {a_acc:.3f} (delta {delta:+.3f}, tolerance {label})",
            data={**acc_data, "delta": delta, "tolerance": tolerance},
            fix=None if ok else "the draft no longer matches the target as before: check that the draft shares the lm_head",
        ))
    else:
        why = _accept_not_compared_because(baseline, candidate)
        results.append(CheckResult("accept_length", "accept length vs baseline", Status.SKIP, f"not compared: {why}",
                                   data={**acc_data, "skipped_because": why}))

    if candidate.rerun:
        same = sum(1 for a, b in zip(candidate.greedy, candidate.rerun) if a.text == b.text)
        m = len(candidate.rerun)
        results.append(CheckResult(
            "state_pollution", "greedy re-run after sampled requests", Status.PASS if same == m else Status.FAIL,
            f"{same}/{m} greedy outputs reproduced after interleaved temperature-sampled requests",
            evidence=_first_mismatch(candidate.greedy, candidate.rerun)[:3],
            data={"reproduced": same, "prompts": m},
            fix=None if same == m else "state leaks between requests (KV cache / draft state not reset)",
        ))
    else:
        results.append(CheckResult("state_pollution", "greedy re-run after sampled requests", Status.SKIP,
                                   "not run (--greedy-only: no sampled request was sent)"))
    return results


def _accept_not_compared_because(baseline: SideResult, candidate: SideResult) -> str:
    if not baseline.speculative and not candidate.speculative:
        return "neither configuration has speculative decoding"
    if not baseline.speculative:
        return "the baseline has no speculative decoding"
    if not candidate.speculative:
        return "the candidate has no speculative decoding"
    silent = [name for name, side in (("baseline", baseline), ("candidate", candidate)) if side.accept_length is None]
    return f"the {' and the '.join(silent)} server reported no spec_verify_ct"


def startup_gate(startup: dict[str, list[CheckResult]]) -> CheckResult:
    """Both servers' startup checks: outputs equal to the baseline's prove an optimisation lossless
    only when it is the one running (an inactive FP8 head or a draft accepting nothing would pass
    the output gates trivially)."""
    failed = {side: [r.name for r in results if r.status == Status.FAIL] for side, results in startup.items()}
    failed = {side: names for side, names in failed.items() if names}
    data = {side: [r.to_dict() for r in results] for side, results in startup.items()}
    if not failed:
        return CheckResult("startup_checks", "optimisations active", Status.PASS,
                           "every startup check passed on both servers: what ran is what the recipes ask for",
                           data=data)
    named = "; ".join(f"{side}: {', '.join(names)}" for side, names in failed.items())
    return CheckResult("startup_checks", "optimisations active", Status.FAIL, f"startup checks failed ({named})",
                       data=data, cause="what ran is not what the recipe asks for, so equal outputs prove nothing about it",
                       fix="`sparkit up RECIPE` shows the failed checks with their causes and fixes")


def describe_judgement(rounding: list[str], checks: list[CheckResult]) -> str:
    """What the gate judged by, in words, from the checks that ran: byte-exactness, or (for a
    rounding-changing optimisation) token agreement and accept length; a skipped gate says why."""
    by_name = {c.name: c for c in checks}
    accept = by_name.get("accept_length")
    accept_compared = accept is not None and accept.status != Status.SKIP
    if rounding:
        basis = "token agreement" + (" and accept length" if accept_compared else "")
        text = f"judged by {basis}, not byte-exactness ({'; '.join(rounding)} changes rounding)"
    else:
        basis = "byte-exact greedy outputs" + (" and accept length within 0.05" if accept_compared else "")
        text = f"judged by {basis}"
    if accept is not None and not accept_compared:
        text += f"; accept length not compared: {accept.data.get('skipped_because') or accept.detail}"
    pollution = by_name.get("state_pollution")
    if pollution is not None and pollution.status != Status.SKIP:
        text += "; the greedy re-run after sampled requests must be byte-exact"
    if "startup_checks" in by_name:
        text += "; both servers' startup checks must pass"
    return text


@dataclass
class VerifyReport:
    recipe: str
    baseline: str
    rounding_changes: list[str]
    checks: list[CheckResult]
    candidate: dict[str, Any]
    reference: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(c.status != Status.FAIL for c in self.checks)

    @property
    def judged_by(self) -> str:
        return describe_judgement(self.rounding_changes, self.checks)

    @property
    def summary(self) -> str:
        """The one line a reader needs: the verdict and what it was judged by."""
        return f"verify {'passed' if self.passed else 'failed'} ({self.recipe} against {self.baseline}): {self.judged_by}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "baseline": self.baseline,
            "passed": self.passed,
            "summary": self.summary,
            "judged_by": self.judged_by,
            "rounding_changes": self.rounding_changes,
            "checks": [c.to_dict() for c in self.checks],
            "candidate": self.candidate,
            "reference": self.reference,
        }


def _side_summary(side: SideResult) -> dict[str, Any]:
    return {
        "recipe": side.recipe,
        "speculative": side.speculative,
        "accept_length": side.accept_length,
        "server_accept_length": side.server_accept_length,
        "outputs": [asdict(g) for g in side.greedy],
    }


def run_verify(
    recipe_ref: str,
    against_ref: str,
    *,
    recipe_overrides: list[str] | None = None,
    against_overrides: list[str] | None = None,
    declared_rounding: list[str] | None = None,
    num_prompts: int | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    on_progress: Any = None,
    launch_timeout: float = 600,
    greedy_only: bool = False,
) -> VerifyReport:
    """Start the baseline, collect; stop; start the candidate, collect; stop; judge.
    `greedy_only` sends no sampled request (no state-pollution re-run): SGLang's NEXTN verify step
    without flashinfer dies on the first request with temperature > 0."""
    import asyncio

    from sparkit import runs
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    prompts = VERIFY_PROMPTS[: num_prompts or len(VERIFY_PROMPTS)]
    baseline_loaded = load_recipe(against_ref, against_overrides or [])
    candidate_loaded = load_recipe(recipe_ref, recipe_overrides or [])
    rounding = rounding_changes(
        baseline_loaded.recipe.model_dump(mode="json"), candidate_loaded.recipe.model_dump(mode="json"), declared_rounding or []
    )
    sides: list[SideResult] = []
    startup: dict[str, list[CheckResult]] = {}
    for step, (loaded, pollution) in enumerate(((baseline_loaded, False), (candidate_loaded, not greedy_only))):
        reference = sides[0] if sides else None
        if on_progress:
            on_progress(f"verify {loaded.name}", step, 2)
        plan = compile_plan(loaded, port=runs.free_port())  # transient server: never clash with a running one
        with runs.transient_server(plan, timeout=launch_timeout, checks=True) as started:
            startup["baseline" if step == 0 else "candidate"] = started.checks
            target = started.server
            sides.append(asyncio.run(collect_outputs(
                target.url, api_key=target.api_key, prompts=prompts, max_new_tokens=max_new_tokens,
                pollution_rerun=pollution, recipe=loaded.name, speculative=loaded.recipe.stack.speculative.enabled,
                prompt_ids=reference.prompt_ids if reference else None,
                teacher=reference.greedy if reference else None, teacher_forcing=bool(rounding),
            )))
    if on_progress:
        on_progress("verify", 2, 2)
    baseline, candidate = sides
    return VerifyReport(
        recipe=candidate_loaded.name,
        baseline=baseline_loaded.name,
        rounding_changes=rounding,
        checks=[startup_gate(startup), *judge(baseline, candidate, rounding, max_new_tokens)],
        candidate=_side_summary(candidate),
        reference=_side_summary(baseline),
    )
