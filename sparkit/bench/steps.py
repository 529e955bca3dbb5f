"""`sparkit bench steps`: the decode step of a live server, explained from its own profiler.

SGLang (and the embedded engine) profile their forward passes on request: POST /start_profile
with `num_steps` makes the engine trace that many forward passes with torch.profiler and write
`{output_dir}/{profile_id}-TP-0.trace.json.gz` (sglang/srt/utils/profile_utils.py). sparkit asks
for it in a private directory of its own (the embedded engine writes in its own profile directory
instead, and says which), sends one greedy request long enough to cover the steps,
waits for the file and summarises it (sparkit.bench.trace): time per step by category, the
device's busy time and the gaps. The trace is written by the server, on its machine: a server
elsewhere leaves it there (the error says so).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkit.bench.trace import StepBreakdown, summarise_file
from sparkit.errors import EngineError


@dataclass
class StepsConfig:
    num_steps: int = 32  # forward passes to trace (the prefill is one of them)
    input_len: int = 64
    output_len: int | None = None  # default: num_steps + 16, so that every traced step decodes
    stage: str | None = None  # DECODE for plain decoding, VERIFY with speculative decoding; None: whichever the trace has
    activities: tuple[str, ...] = ("CPU", "GPU")
    wait_s: float = 180.0  # for the trace file once the request finished
    keep_trace: Path | None = None  # copy the raw trace here


async def profile_steps(url: str, config: StepsConfig, *, api_key: str | None = None,
                        on_progress: Callable[[str], None] | None = None) -> tuple[StepBreakdown, dict[str, Any]]:
    """Profile `config.num_steps` forward passes of the server at `url` and summarise them.
    Returns (the breakdown, what was done: the request, the trace file, seconds)."""
    from sparkit.client import EngineClient

    say = on_progress or (lambda _msg: None)
    work = Path(tempfile.mkdtemp(prefix="sparkit-steps-"))  # 0700: the server (same user) writes here
    profile_id = f"sparkit-steps-{int(time.time() * 1000)}"
    request = {"output_dir": str(work), "num_steps": config.num_steps, "activities": list(config.activities),
               "with_stack": False, "record_shapes": False, "profile_id": profile_id}
    out_len = config.output_len or config.num_steps + 16
    t0 = time.perf_counter()
    try:
        async with EngineClient(url, api_key=api_key) as client:
            say(f"start_profile ({config.num_steps} forward passes)")
            chosen = await client.start_profile(request)  # the embedded engine writes where it chooses
            traces = Path(chosen) if chosen else work
            say(f"one greedy request: {config.input_len} tokens in, {out_len} out")
            ids = [(7 * i + 3) % 200 + 10 for i in range(config.input_len)]
            await client.generate(input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": out_len,
                                                                  "ignore_eos": True})
            path = await _wait_for_trace(traces, profile_id, config.wait_s, client, say)
        if config.keep_trace is not None:
            config.keep_trace.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, config.keep_trace / path.name)
        say(f"summarising {path.name}")
        breakdown = await asyncio.to_thread(summarise_file, path, stage=config.stage)
        breakdown.trace = str(config.keep_trace / path.name) if config.keep_trace else path.name
        return breakdown, {"url": url, "request": request, "output_len": out_len,
                           "trace_bytes": path.stat().st_size, "seconds": round(time.perf_counter() - t0, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _wait_for_trace(work: Path, profile_id: str, wait_s: float, client: Any, say: Callable[[str], None]) -> Path:
    """The trace file, once complete (SGLang writes it when the last step ends; the embedded engine
    before answering). A trace that never appears: ask the server to stop, then give up."""
    deadline = time.monotonic() + wait_s
    asked_stop = False
    while time.monotonic() < deadline:
        found = sorted(work.glob(f"*{profile_id}*.trace.json*"))
        if found:
            path = found[0]
            size = path.stat().st_size
            await asyncio.sleep(0.5)
            if path.stat().st_size == size and size > 0:
                return path
            continue
        if not asked_stop and time.monotonic() > deadline - wait_s / 2:
            say("no trace yet: stop_profile")
            asked_stop = True
            try:
                await client.stop_profile()
            except EngineError:
                pass
        await asyncio.sleep(0.5)
    local = os.path.exists(work)
    raise EngineError(f"the server wrote no trace to {work} within {wait_s:.0f} s",
                      hint=("a server on another machine writes its trace there (run `sparkit bench steps` where the "
                            "server runs, or summarise a trace you copied with --trace FILE)") if local else None)


__all__ = ["StepsConfig", "profile_steps"]
