"""The correctness gate's judgement on collected outputs (the e2e tests collect real ones)."""

from __future__ import annotations

from sparkit.bench.verify import GreedyOutput, SideResult, VerifyReport, judge, rounding_changes, token_agreement
from sparkit.contract.checks import Status


def side(texts, ids=None, verify_ct=None, speculative=False, rerun_texts=None) -> SideResult:
    ids = ids or [None] * len(texts)
    greedy = [GreedyOutput(i, t, ids[i], 8, verify_ct) for i, t in enumerate(texts)]
    rerun = [GreedyOutput(i, t, None, 8, verify_ct) for i, t in enumerate(rerun_texts or [])]
    return SideResult("r", speculative, greedy, rerun)


def by_name(checks):
    return {c.name: c for c in checks}


def test_identical_outputs_pass_all_three_checks():
    base = side(["abc", "def"], verify_ct=4, speculative=True)
    cand = side(["abc", "def"], verify_ct=4, speculative=True, rerun_texts=["abc", "def"])
    checks = by_name(judge(base, cand, rounding=[]))
    assert checks["greedy_outputs"].status == Status.PASS
    assert checks["accept_length"].status == Status.PASS
    assert checks["state_pollution"].status == Status.PASS


def test_one_changed_byte_fails_the_byte_exact_check_with_the_place_it_differs():
    base = side(["abc", "def"])
    cand = side(["abc", "dXf"], rerun_texts=["abc", "dXf"])
    check = by_name(judge(base, cand, rounding=[]))["greedy_outputs"]
    assert check.status == Status.FAIL
    assert "1/2" in check.detail
    assert "character 1" in check.evidence[0]


def test_accept_length_drift_beyond_005_fails_when_both_speculate():
    base = side(["a"], verify_ct=4, speculative=True)  # 8/4 = 2.0
    cand = side(["a"], verify_ct=5, speculative=True)  # 8/5 = 1.6
    assert by_name(judge(base, cand, rounding=[]))["accept_length"].status == Status.FAIL
    # and is skipped when the baseline does not speculate
    assert by_name(judge(side(["a"]), cand, rounding=[]))["accept_length"].status == Status.SKIP


def test_state_pollution_is_caught():
    cand = side(["abc"], rerun_texts=["abd"])
    assert by_name(judge(side(["abc"]), cand, rounding=[]))["state_pollution"].status == Status.FAIL


def test_rounding_changing_change_is_judged_by_agreement_not_bits():
    base = side(["abcd"], ids=[[1, 2, 3, 4]], verify_ct=4, speculative=True)
    cand = side(["abXY"], ids=[[1, 2, 9, 9]], verify_ct=4, speculative=True, rerun_texts=["abXY"])
    rounding = rounding_changes({"stack": {"lm_head": "bf16"}}, {"stack": {"lm_head": "fp8"}})
    assert rounding == ["stack.lm_head: bf16 -> fp8"]
    checks = by_name(judge(base, cand, rounding))
    assert checks["greedy_outputs"].status == Status.WARN
    assert "rounding-changing" in checks["greedy_outputs"].detail
    assert checks["greedy_outputs"].data["agreement_rate"] == 0.5
    assert all(c.status != Status.FAIL for c in checks.values())


def test_speculation_settings_are_not_rounding_changes_on_an_engine_that_replays_decoding_exactly():
    a = {"engine": "embedded", "stack": {"lm_head": "bf16", "speculative": {"method": "none"}}}
    b = {"engine": "embedded", "stack": {"lm_head": "bf16", "speculative": {"method": "nextn", "num_steps": 3}}}
    assert rounding_changes(a, b) == []


def test_speculation_on_sglang_is_rounding_changing():
    """Real SGLang on the H200: NEXTN against plain greedy decoding of the same checkpoint gave 4/8
    byte-identical 256-token outputs (its verify forward rounds differently), so the gate judges
    the change by agreement and accept length there instead of failing it."""
    from sparkit.recipes.load import load_recipe

    base = load_recipe("tiny/tiny-sglang", ["stack.speculative=none"]).resolved()
    cand = load_recipe("tiny/tiny-sglang").resolved()
    (change,) = rounding_changes(base, cand)
    assert change.startswith("stack.speculative.method: none -> nextn (on sglang")
    assert rounding_changes(cand, cand) == []  # the same decoding on both sides: byte-exact still


def test_token_agreement_counts_tokens_before_first_divergence():
    a = [GreedyOutput(0, "", [1, 2, 3, 4], 4, None), GreedyOutput(1, "", [5, 6], 2, None)]
    b = [GreedyOutput(0, "", [1, 2, 0, 4], 4, None), GreedyOutput(1, "", [5, 6], 2, None)]
    rate, unit = token_agreement(a, b)
    assert rate == (2 + 2) / 6 and unit == "tokens"


def test_a_skipped_accept_length_gate_says_why():
    spec = side(["a"], verify_ct=4, speculative=True)
    plain = side(["a"])
    silent = side(["a"], speculative=True)  # speculates, but its server reported no spec_verify_ct
    cases = [
        (plain, spec, "not compared: the baseline has no speculative decoding"),
        (spec, plain, "not compared: the candidate has no speculative decoding"),
        (plain, plain, "not compared: neither configuration has speculative decoding"),
        (spec, silent, "not compared: the candidate server reported no spec_verify_ct"),
    ]
    for baseline, candidate, detail in cases:
        check = by_name(judge(baseline, candidate, rounding=[]))["accept_length"]
        assert check.status == Status.SKIP and check.detail == detail


def report(baseline, candidate, rounding) -> VerifyReport:
    return VerifyReport("tiny", "tiny-baseline", rounding, judge(baseline, candidate, rounding), {}, {})


def test_the_summary_says_a_rounding_change_was_judged_by_agreement_not_byte_exactness():
    rounding = ["stack.lm_head: bf16 -> fp8"]
    both = report(side(["abcd"], ids=[[1, 2, 3, 4]], verify_ct=4, speculative=True),
                  side(["abXY"], ids=[[1, 2, 9, 9]], verify_ct=4, speculative=True, rerun_texts=["abXY"]), rounding)
    assert both.summary == (
        "verify passed (tiny against tiny-baseline): judged by token agreement and accept length, not "
        "byte-exactness (stack.lm_head: bf16 -> fp8 changes rounding); the greedy re-run after sampled "
        "requests must be byte-exact")
    # The README's `verify tiny --against tiny-baseline`: an FP8 head against a baseline without MTP.
    no_mtp = report(side(["abcd"], ids=[[1, 2, 3, 4]]),
                    side(["abXY"], ids=[[1, 2, 9, 9]], verify_ct=4, speculative=True, rerun_texts=["abXY"]), rounding)
    assert no_mtp.to_dict()["judged_by"] == (
        "judged by token agreement, not byte-exactness (stack.lm_head: bf16 -> fp8 changes rounding); "
        "accept length not compared: the baseline has no speculative decoding; the greedy re-run after "
        "sampled requests must be byte-exact")
    exact = report(side(["abc"], verify_ct=4, speculative=True),
                   side(["abc"], verify_ct=4, speculative=True, rerun_texts=["abc"]), [])
    assert exact.summary.startswith("verify passed (tiny against tiny-baseline): judged by byte-exact greedy "
                                    "outputs and accept length within 0.05;")
    assert "not byte-exactness" not in exact.summary


def test_tensor_parallelism_is_rounding_changing():
    """TP2 against TP1 (issue 19's verify): the all-reduce adds partial sums in another order."""
    from sparkit.recipes.load import load_recipe

    tp1 = load_recipe("tiny/tiny-sglang").resolved()
    tp2 = load_recipe("tiny/tiny-sglang-tp2").resolved()
    assert "stack.tp: 1 -> 2" in rounding_changes(tp1, tp2)


def test_a_divergence_at_a_near_tie_is_explained_beside_a_perfect_teacher_forced_figure():
    from sparkit.bench.verify import NEAR_TIE_MARGIN, Divergence

    base = side(["0 You are welcome!", "same"], ids=[[1, 2, 3], [7, 8]])
    cand = side(["1 10 9 8", "same"], ids=[[4, 2, 3], [7, 8]], rerun_texts=["1 10 9 8", "same"])
    near = Divergence(0, 0, 0, "0", "1", candidate_logprob=-0.70, baseline_logprob=-0.72, top_checked=10)
    cand.divergences = [near]
    cand.teacher_forced = {"agree": 2, "total": 2}
    check = by_name(judge(base, cand, rounding=["stack.lm_head: bf16 -> fp8"]))["greedy_outputs"]
    assert near.margin < NEAR_TIE_MARGIN
    assert "1 of the 1 divergences start at a near-tie" in check.detail
    assert "teacher-forced agreement samples positions 0, 16, 32" in check.detail  # why 100% beside a difference
    assert check.evidence == ["prompt 0 diverges at token 0 (character 0): baseline '0', candidate '1'; the candidate's "
                              "logprobs there: '1' -0.700, '0' -0.720 (margin 0.020: a near-tie, where a change of "
                              "rounding picks the other token)"]
    assert check.data["divergences"][0]["margin"] == near.margin


def test_a_divergence_far_from_a_tie_says_so():
    from sparkit.bench.verify import Divergence

    assert "not a near-tie" in Divergence(2, 5, 9, "a", "b", -0.1, -3.0, 10).sentence()
    assert "not among the candidate's top 10" in Divergence(2, 5, 9, "a", "b", -0.1, None, 10).sentence()


def test_the_first_divergence_is_found_in_tokens_and_characters():
    from sparkit.bench.verify import first_divergence

    a, b = GreedyOutput(0, "abcdef", [1, 2, 3], 3, None), GreedyOutput(0, "abXdef", [1, 9, 3], 3, None)
    assert first_divergence(a, b) == (1, 2)
    assert first_divergence(a, a) is None
    assert first_divergence(a, GreedyOutput(0, "abX", None, 1, None)) is None  # no ids: not located in tokens
