"""Rendering of the bandwidth roofline (sparkit.roofline) for `plan` and `bench`: a few lines by
default, the arithmetic as a table with --verbose. Works from the roofline's JSON document, so a
saved bench result renders the same way."""

from __future__ import annotations

from typing import Any

from sparkit.roofline.published import HOST_TERM_PREFIX


def gb(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e9:
        return f"{value / 1e9:.2f} GB"
    if value >= 1e6:
        return f"{value / 1e6:.1f} MB"
    return f"{value / 1e3:.1f} kB"


def tok_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def headline_parts(step: dict[str, float]) -> str:
    """The step's bytes grouped the way users think about them."""
    groups = {
        "attention": ("attention weights",),
        "routed experts": ("routed experts",),
        "lm_head": ("lm_head", "lm_head exact re-scoring"),
        "KV/state": ("KV cache", "linear-attention state"),
    }
    shown, used = [], set()
    for label, keys in groups.items():
        total = sum(step.get(k, 0.0) for k in keys)
        used.update(keys)
        if total:
            shown.append(f"{label} {gb(total)}")
    rest = sum(v for k, v in step.items() if k not in used)
    if rest:
        shown.append(f"other weights {gb(rest)}")
    return ", ".join(shown)


def roofline_lines(doc: dict[str, Any]) -> list[str]:
    """The default plan view: what a step reads, the bandwidth, the limit, and where MTP pays."""
    if doc.get("error"):
        return [f"no bandwidth roofline: {doc['error']}"]
    layout = doc["layout"]
    lines = [f"model: {layout['name']}, {layout['source']}"
             + (" (no local checkpoint)" if layout["source"] == "declared profile" else "")]
    tp = f" per GPU (TP{doc['tp']})" if doc.get("tp", 1) > 1 else ""
    lines.append(f"a decode step reads {gb(doc['step_bytes'])}{tp}: {headline_parts(doc['step_bytes_by_component'])}"
                 f" (context {doc['context_tokens']:,} tokens)")
    bw = doc["bandwidth"]
    if bw["gb_s"] is None:
        lines.append(f"bandwidth unknown: {bw['detail']}" + (f"; {bw['notes'][0]}" if bw.get("notes") else ""))
    else:
        lines.append(f"bandwidth {bw['detail']} -> at most {tok_s(doc['limit_tok_s'])} tok/s "
                     f"({doc['step_time_ms_at_limit']:.3g} ms per step) without speculative decoding")
        lines.extend(n for n in doc.get("notes", []) if n.startswith(HOST_TERM_PREFIX))
    spec = doc.get("speculative")
    if spec:
        lines.append(spec_line(doc))
    return lines


def spec_line(doc: dict[str, Any]) -> str:
    spec = doc["speculative"]
    grid = spec["by_accept_length"]
    ceiling = grid[-1]
    ratio = ceiling["cycle_over_step"]
    verify_ratio = spec["verify_bytes"] / doc["step_bytes"]
    experts = doc.get("routed_experts")
    distinct = spec.get("verify_distinct_experts_per_layer")
    why = (f": {distinct:.1f} of {experts['num_experts']} experts per layer instead of {experts['top_k']}"
           if experts and distinct else "")
    parts = [f"{spec['label']}: a cycle reads {ratio:.2f}x a step (verify {verify_ratio:.2f}x{why}; "
             + (f"draft {ratio - verify_ratio:.2f}x)" if spec["draft_counted"] else "draft not counted)")]
    if ceiling["limit_tok_s"] is not None:
        mid = next((g for g in grid if g["accept_length"] == 3.0), None) if ceiling["accept_length"] > 3 else None
        speeds = ([f"{tok_s(mid['limit_tok_s'])} tok/s at accept 3.0"] if mid else []) + [
            f"{tok_s(ceiling['limit_tok_s'])} at {ceiling['accept_length']:g} (every draft accepted)"]
        parts.append(" -> " + ", ".join(speeds))
    even = spec.get("break_even_accept_length")
    who = "MTP" if spec["method"] == "nextn" else "DSpark"
    parts.append(f"; {who} pays above accept {even:.2f}" if even is not None
                 else f"; {who} cannot pay: even accepting every draft costs more than plain decoding")
    return "".join(parts)


def render_roofline(out: Any, doc: dict[str, Any], *, verbose: bool = False, title: str | None = None) -> None:
    from rich.markup import escape

    out.print(f"\n[bold]{escape(title or 'expected decode speed (bandwidth roofline, batch 1)')}[/]")
    for line in roofline_lines(doc):
        out.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    if doc.get("error") or not verbose:
        return
    from rich.table import Table

    spec = doc.get("speculative")
    table = Table(title="bytes per device, by component", title_justify="left")
    table.add_column("component")
    table.add_column("decode step", justify="right")
    if spec:
        table.add_column(f"verify ({spec['verify_tokens']} tokens)", justify="right")
    keys = list(doc["step_bytes_by_component"]) + [k for k in (spec or {}).get("verify_bytes_by_component", {})
                                                    if k not in doc["step_bytes_by_component"]]
    for key in keys:
        row = [key, gb(doc["step_bytes_by_component"].get(key))]
        if spec:
            row.append(gb(spec["verify_bytes_by_component"].get(key)))
        table.add_row(*row)
    total = ["total", gb(doc["step_bytes"])] + ([gb(spec["verify_bytes"])] if spec else [])
    table.add_row(*total, style="bold")
    out.print(table)
    if spec:
        if spec.get("draft_forward_bytes"):
            out.print(f"  one draft forward (NextN layer + lm_head): {gb(spec['draft_forward_bytes'])}; "
                      f"{spec['draft_forwards_per_cycle']} per cycle", highlight=False)
        grid = Table(title=f"{spec['label']} by accept length", title_justify="left")
        for column in ("accept length", "cycle / step", "limit tok/s"):
            grid.add_column(column, justify="right")
        for g in spec["by_accept_length"]:
            grid.add_row(f"{g['accept_length']:g}", f"{g['cycle_over_step']:.2f}", tok_s(g["limit_tok_s"]))
        out.print(grid)
        for note in spec.get("notes", []):
            out.print(f"  note: {escape(note)}", highlight=False, soft_wrap=True)
    for rule in doc.get("read_rules", []):
        out.print(f"  read: {escape(rule)}", highlight=False, soft_wrap=True)
    out.print(f"  layout: {escape(doc['layout']['detail'])}", highlight=False, soft_wrap=True)
    for note in doc.get("notes", []):
        out.print(f"  note: {escape(note)}", highlight=False, soft_wrap=True)
