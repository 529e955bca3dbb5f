"""A benchmark's decode speed against its recipe's bandwidth limit (sparkit.roofline).

The limit is evaluated at the workload the benchmark ran: the mean context over its requests
(prompt tokens plus half the output) and the accept length it measured. Decode speed is
1 / mean TPOT (TTFT excluded, as the limit is a decode-step bound); the step-time estimate
(mean TPOT x accept length) is compared with the bound on a step (a speculative cycle).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlparse


def is_local_url(url: str) -> bool:
    """Whether the server runs on this machine (its bandwidth measurement applies)."""
    import platform

    host = (urlparse(url).hostname or "").lower()
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", platform.node().lower())


def workload_context(doc: dict[str, Any]) -> int | None:
    """Mean tokens of context a decode step saw: prompt + half the output, over measured requests."""
    contexts = []
    for repeat in doc.get("repeats", []):
        for request in repeat.get("requests", []):
            if request.get("error") or not request.get("output_tokens"):
                continue
            contexts.append(request.get("prompt_tokens", 0) + request["output_tokens"] / 2)
    return round(sum(contexts) / len(contexts)) if contexts else None


def against_limit(doc: dict[str, Any]) -> dict[str, Any] | None:
    """{decode_tok_s, limit_tok_s, fraction_of_limit, ...} for a bench document whose recipe is
    known; None without a recipe; {"error": why} when the limit cannot be computed."""
    recipe_data = doc.get("recipe")
    if not recipe_data:
        return None
    from pydantic import ValidationError

    from sparkit.recipes.schema import Recipe
    from sparkit.roofline.estimate import roofline_document

    try:
        recipe = Recipe.model_validate(recipe_data)
    except ValidationError as exc:
        return {"error": f"the recorded recipe does not validate ({exc.error_count()} error(s))"}
    figures = doc.get("summary", {}).get("figures", {})
    tpot = figures.get("tpot_mean_ms")
    if not tpot:
        return {"error": "no request measured a TPOT"}
    accept = figures.get("accept_length_mean") if recipe.stack.speculative.enabled else None
    context = workload_context(doc)
    host = None
    notes = []
    url = (doc.get("server") or {}).get("url") or ""
    if url and not is_local_url(url):
        from sparkit.host import Host

        host = Host()  # a remote server: this machine's GPUs and measurements say nothing about it
        notes.append("the server is not on this machine: the target's spec sheet, not a local measurement")
    roof = roofline_document(recipe, recipe_name=recipe_data.get("description") or "", context=context,
                             accepts=[round(accept, 4)] if accept else None, host=host)
    if roof.get("error"):
        return {"error": roof["error"], "roofline": roof}
    spec = roof.get("speculative")
    if accept and spec:
        at = spec["by_accept_length"][0]
        limit, cycle = at["limit_tok_s"], at["cycle_bytes"]
    else:
        limit, cycle = roof["limit_tok_s"], roof["step_bytes"]
    gb_s = roof["bandwidth"]["gb_s"]
    decode = 1000.0 / tpot
    step_limit_ms = cycle / (gb_s * 1e9) * 1e3 if gb_s else None
    return {
        "decode_tok_s": decode,
        "limit_tok_s": limit,
        "fraction_of_limit": decode / limit if limit else None,
        "accept_length": accept,
        "context_tokens": roof["context_tokens"],
        "step_time_estimate_ms": figures.get("step_time_estimate_ms"),
        "step_time_at_limit_ms": step_limit_ms,
        "bandwidth": roof["bandwidth"],
        "notes": notes,
        "roofline": roof,
    }


def limit_sentence(limit: dict[str, Any]) -> str:
    """"52.1 tok/s = 61% of the 85.0 tok/s bandwidth limit for this recipe at accept 2.70 ..."."""
    if limit.get("error"):
        return f"no bandwidth limit: {limit['error']}"
    decode = limit["decode_tok_s"]
    accept = f" at accept {limit['accept_length']:.2f}" if limit.get("accept_length") else ""
    context = f", context {limit['context_tokens']:,} tokens"
    if limit["limit_tok_s"] is None:
        return (f"decode {decode:.1f} tok/s (1/mean TPOT); the bandwidth limit is unknown: "
                f"{limit['bandwidth']['detail']} (`sparkit doctor --bandwidth` measures it)")
    text = (f"decode {decode:.1f} tok/s (1/mean TPOT) = {limit['fraction_of_limit']:.0%} of the "
            f"{_tok(limit['limit_tok_s'])} tok/s bandwidth limit for this recipe{accept}{context}")
    est, bound = limit.get("step_time_estimate_ms"), limit.get("step_time_at_limit_ms")
    if est and bound and math.isfinite(est):
        text += f"; step time {est:.3g} ms (est.) vs {bound:.3g} ms at the limit"
    return text + f" ({limit['bandwidth']['detail']})"


def _tok(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
