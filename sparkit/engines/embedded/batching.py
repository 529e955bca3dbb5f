"""Whether the embedded engine may compute several requests in one forward, measured at load.

A request decoded among others must get exactly the bits it gets alone (greedy output byte for
byte, logprobs to the last bit). On CPU a matmul's row depends on how many rows the product has:
with torch 2.13's MKL on a 2-core AMD EPYC, products of 1 to 3 rows give a row one set of bits and
products of 4 rows or more another (the first reads the weights as matrix-vector products, the
second packs them), so the row of a request decoded alone (a 1-row product) differs in its last
bits from the same row decoded beside 7 others. Batched matmuls (bmm) keep each item's bits, but
read the weights once per item: on tiny-ling no faster than one request after another.

So a batched forward (model.RowBatch, FastDecoderLayer.rows) pads every product to at least
`min_rows` rows: the smallest count from which a row's bits no longer depend on the count. This
module measures it on the model's own weights for every count up to the most rows a step can have
(max_running_requests x the verify width), then checks whole forwards: requests computed alone and
together, decode and verify steps, the draft's chained and last-row steps, their logits. Where a
check fails (another BLAS, a device the fast path does not cover) the engine computes each request
in a forward of its own with the batch-1 kernels: slower, and still exact. With
max_running_requests 1 it does that always (the batch-1 kernels are the fastest single stream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MAX_MIN_ROWS = 8  # pad a lone request to at most this many rows; beyond, padding costs more than batching gains


@dataclass(frozen=True)
class RowsPlan:
    """How a batched forward is computed: products padded to min_rows (checked up to max_rows),
    and whether the MoE's gate/up products of all experts run as one matmul."""

    min_rows: int
    max_rows: int
    fused_moe: bool

    def describe(self) -> str:
        return (f"requests decoded together in one forward, every product padded to {self.min_rows} rows "
                f"(a row's bits independent of the row count from {self.min_rows} to {self.max_rows}: checked at load)")


@dataclass(frozen=True)
class RowsCheck:
    plan: RowsPlan | None
    why: str  # with no plan: why each request gets a forward of its own

    def describe(self) -> str:
        if self.plan is not None:
            return self.plan.describe()
        return f"each request computed in a forward of its own with the batch-1 kernels ({self.why})"


def check_rows(engine: Any, max_running: int) -> RowsCheck:
    """The plan for `engine` (an EmbeddedEngine after prepare_inference), or why there is none."""
    model, draft = engine.model, engine.draft
    if max_running == 1:
        return RowsCheck(None, "--max-running-requests 1")
    if getattr(engine, "dspark", None) is not None:
        return RowsCheck(None, "DSpark verifies each sequence's block in a forward of its own")
    if getattr(model, "row_batches", True) is False:
        return RowsCheck(None, f"{type(model).__name__} runs one forward per sequence (no row-batched path)")
    if getattr(model, "_fast", None) is None or (draft is not None and getattr(draft.nextn, "_fast", None) is None):
        return RowsCheck(None, "the fast path does not apply: float32 with experts decoded at load only")
    width = engine.num_steps + 1 if draft is not None else 1
    max_rows = max_running * width
    generator = torch.Generator(device=engine.device).manual_seed(0)
    with torch.inference_mode():
        min_rows, where = _min_rows(_row_functions(engine), max_rows, generator)
        if min_rows is None:
            return RowsCheck(None, f"{where}: a row's bits depend on the row count up to {max_rows} rows")
        fused = _fused_moe_exact(model, draft, min_rows, max_rows, generator)
        plan = RowsPlan(min_rows, max_rows, fused)
        problem = _forwards_differ(engine, plan, max_running, generator)
    if problem:
        return RowsCheck(None, problem)
    return RowsCheck(plan, "")


def _fast_layers(model: Any, draft: Any) -> list[Any]:
    layers = list(model._fast)
    if draft is not None:
        layers.append(draft.nextn._fast)
    return layers


def _row_functions(engine: Any) -> dict[str, tuple[int, Callable]]:
    """Every kind of product a batched forward runs, as (input width, f(x [M, K]) -> [M, N]): one
    per weight shape (a kernel's path depends on the shapes and layouts, which the layers share)."""
    model, draft = engine.model, engine.draft
    out: dict[str, tuple[int, Callable]] = {}
    seen: set[tuple] = set()
    for i, layer in enumerate(_fast_layers(model, draft)):
        weights = {"qkv": layer.qkv_t, "o": layer.o_t, "router": layer.router_t,
                   "gate_up": layer.gate_up_t[0], "down": layer.down_t_each[0],
                   "shared_gate_up": layer.gate_up_t[-1], "shared_down": layer.down_t_each[-1]}
        if layer.gate_up_all_t is not None:
            weights["gate_up_all"] = layer.gate_up_all_t
        for name, w in weights.items():
            if (tuple(w.shape), w.stride(), w.dtype) in seen:
                continue
            seen.add((tuple(w.shape), w.stride(), w.dtype))
            out[f"layer {i} {name}"] = (w.shape[0], lambda x, w=w: torch.mm(x, w))
            # the residual added inside the product (addmm), as the layers do
            out[f"layer {i} {name} (accumulated)"] = (w.shape[0], lambda x, w=w: torch.addmm(
                x[:, : w.shape[1]].repeat(1, -(-w.shape[1] // x.shape[1]))[:, : w.shape[1]] * 0.5, x, w))
        if i == 0:
            out["norm"] = (layer.in_norm.shape[0], lambda x, layer=layer: torch.nn.functional.rms_norm(
                x, layer.in_norm.shape, layer.in_norm, layer.eps))
    hidden = model.config.hidden_size
    if draft is not None:
        eh = draft.nextn._eh_t[hidden:]
        out["draft input projection"] = (hidden, lambda x: torch.addmm(x * 0.5, x, eh))
        out["draft lm_head"] = (hidden, lambda x: draft.lm_head(x).float())
    out["lm_head"] = (hidden, lambda x: model.lm_head(x).float())
    return out


def _min_rows(functions: dict[str, tuple[int, Callable]], max_rows: int, generator) -> tuple[int | None, str]:
    """The smallest m (at most MAX_MIN_ROWS) such that for every function, every row count M in
    [m, max_rows] gives the first M rows of the max_rows product exactly; else (None, the culprit)."""
    need = 1
    for name, (width, f) in functions.items():
        x = torch.randn(max_rows, width, generator=generator)
        reference = f(x)
        for rows in range(max_rows - 1, 0, -1):
            if not torch.equal(f(x[:rows]), reference[:rows]):
                need = max(need, rows + 1)
                break
        if need > MAX_MIN_ROWS:
            return None, name
    return need, ""


def _fused_moe_exact(model: Any, draft: Any, min_rows: int, max_rows: int, generator) -> bool:
    """Whether one matmul over every expert's gate/up gives each expert's columns exactly as that
    expert's own product does, for every row count a batched forward has."""
    seen: set[tuple] = set()
    for layer in _fast_layers(model, draft):
        if layer.gate_up_all_t is None:
            return False
        shape = (tuple(layer.gate_up_all_t.shape), tuple(layer.gate_up_t[0].shape))
        if shape in seen:  # the same products as a layer already checked
            continue
        seen.add(shape)
        x = torch.randn(max_rows, layer.gate_up_all_t.shape[0], generator=generator)
        for rows in range(min_rows, max_rows + 1):
            fused = torch.mm(x[:rows], layer.gate_up_all_t)
            for e, w in enumerate(layer.gate_up_t):
                width = w.shape[1]
                if not torch.equal(fused[:, e * width : (e + 1) * width], torch.mm(x[:rows], w)):
                    return False
    return True


# -- a batched forward: what the engine runs, and what the load-time check compares ------------------


def target_rows(model: Any, plan: RowsPlan, caches: list, starts: list[int], ids: list[list[int]]) -> list:
    """The target's hidden states (normed) for each request's ids at its positions: [n_i, H] each."""
    from sparkit.models.tiny_ling.model import RowBatch

    counts = [len(x) for x in ids]
    flat = torch.tensor([t for x in ids for t in x], device=caches[0].kv.device)
    hidden = model.forward_rows(flat, RowBatch(caches, starts, counts, plan.min_rows), plan.fused_moe)
    return list(hidden.split(counts))


def draft_rows(draft: Any, plan: RowsPlan, caches: list, starts: list[int], hiddens: list, ids: list[list[int]],
               last_only: bool = False) -> list:
    """The NextN draft's hidden states for each request (its target hidden rows and the ids that follow
    them): [n_i, H] each, or [1, H] with last_only."""
    from sparkit.models.tiny_ling.model import RowBatch

    counts = [len(x) for x in ids]
    flat = torch.tensor([t for x in ids for t in x], device=caches[0].kv.device)
    out = draft.forward_rows(torch.cat(hiddens), flat, RowBatch(caches, starts, counts, plan.min_rows), last_only,
                             plan.fused_moe)
    return list(out.split([1] * len(counts) if last_only else counts))


def logits_rows(head: Any, plan: RowsPlan, hiddens: list) -> list:
    """float32 logits [n_i, V] of each request's hidden rows, through one product padded to min_rows."""
    counts = [h.shape[0] for h in hiddens]
    x = torch.cat(hiddens)
    rows = x.shape[0]
    if rows < plan.min_rows:
        x = torch.cat((x, x.new_zeros(plan.min_rows - rows, x.shape[1])))
    return list(head(x)[:rows].float().split(counts))


def _forwards_differ(engine: Any, plan: RowsPlan, max_running: int, generator) -> str:
    """Requests computed alone and together, through the forwards the engine runs: '' when every
    request's hidden states and logits are the same bits both ways, else what differed."""
    from sparkit.models.tiny_ling.model import KVPool

    model, draft, cfg = engine.model, engine.draft, engine.model_config
    length = 48
    shape = (cfg.num_attention_heads, cfg.head_dim, length + 16, engine.dtype, engine.device)
    caches = [c for pool in [KVPool(max_running, cfg.num_hidden_layers, *shape)] for c in (pool.acquire() for _ in range(max_running))]
    draft_caches = [c for pool in [KVPool(max_running, 1, *shape)] for c in (pool.acquire() for _ in range(max_running))]
    for cache in caches + draft_caches:
        cache.kv.copy_(torch.randn(cache.kv.shape, generator=generator))
    starts = [int(s) for s in torch.randint(1, length, (max_running,), generator=generator)]
    width = engine.num_steps + 1 if draft is not None else 1

    def ids(counts: list[int]) -> list[list[int]]:
        return [torch.randint(0, cfg.vocab_size, (n,), generator=generator).tolist() for n in counts]

    for together in sorted({2, max_running} & set(range(2, max_running + 1))):
        for n in sorted({1, width}):
            tokens = ids([n] * together)
            problem = _compare(lambda idx: target_rows(model, plan, [caches[i] for i in idx], [starts[i] for i in idx],
                                                       [tokens[i] for i in idx]),
                               model.lm_head, plan, together, f"target, {together} requests x {n} rows")
            if problem:
                return problem
        if draft is None:
            continue
        counts = [1 + i % width for i in range(together)]
        tokens = ids(counts)
        hiddens = [torch.randn(n, cfg.hidden_size, generator=generator) for n in counts]
        for last_only in (False, True):
            problem = _compare(lambda idx, last_only=last_only: draft_rows(
                draft, plan, [draft_caches[i] for i in idx], [starts[i] for i in idx], [hiddens[i] for i in idx],
                [tokens[i] for i in idx], last_only), draft.lm_head, plan, together,
                f"draft, {together} requests of {counts} rows{', last rows' if last_only else ''}")
            if problem:
                return problem
    return ""


def _compare(forward: Callable[[list[int]], list], head: Any, plan: RowsPlan, together: int, what: str) -> str:
    """The batch's first, middle and last request alone against the same requests together (a
    row's bits either depend on the rows beside it or they do not: three rows answer it)."""
    everyone = list(range(together))
    rows = forward(everyone)
    logits = logits_rows(head, plan, rows)
    for i in sorted({0, together // 2, together - 1}):
        alone = forward([i])
        if not torch.equal(alone[0], rows[i]):
            return f"{what}: request {i}'s hidden states differ alone and together"
        if not torch.equal(logits_rows(head, plan, alone)[0], logits[i]):
            return f"{what}: request {i}'s logits differ alone and together"
    return ""
