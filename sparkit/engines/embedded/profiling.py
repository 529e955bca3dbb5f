"""SGLang's `/start_profile` and `/stop_profile` for the embedded engine: a torch.profiler trace of
its forward passes, written where and as SGLang writes one (`{output_dir}/{profile_id}-TP-0.trace.json.gz`,
each forward a `step[STAGE bs=1]` span), so that `sparkit bench steps` reads either engine's.

torch.profiler records the ops of the thread that started it, so the worker thread starts and
stops it, at a step boundary or when it wakes idle (EngineWorker.poll_profile). With `num_steps`
it stops by itself after that many forward passes; `/stop_profile` otherwise.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTIVITIES = ("CPU", "GPU")


def span(name: str):
    """A profiler span named `name` while a profile runs; nothing otherwise (a check per call)."""
    import torch

    if not torch.autograd._profiler_enabled():
        return contextlib.nullcontext()
    return torch.profiler.record_function(name)


@dataclass
class ProfileRequest:
    """The fields of SGLang's ProfileReq the embedded engine acts on (the others are accepted)."""

    output_dir: str | None = None
    num_steps: int | None = None
    activities: list[str] | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_id: str | None = None
    profile_prefix: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "ProfileRequest":
        from sparkit.engines.embedded.requests import ApiError

        req = cls(**{k: body.get(k) for k in cls.__dataclass_fields__ if body.get(k) is not None})
        if req.num_steps is not None and (not isinstance(req.num_steps, int) or isinstance(req.num_steps, bool)
                                          or req.num_steps < 1):
            raise ApiError(400, f"num_steps: a positive integer, not {req.num_steps!r}")
        for activity in req.activities or []:
            if activity not in ACTIVITIES + ("MEM", "RPD"):
                raise ApiError(400, f"activities: {activity!r} is not one of CPU, GPU, MEM, RPD")
        return req


@dataclass
class ProfileControl:
    """What the routes ask and the worker does (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: ProfileRequest | None = None
    stop_requested: bool = False
    active: Any = None  # the torch.profiler.profile
    request: ProfileRequest | None = None
    steps: int = 0
    written: list[str] = field(default_factory=list)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    # route side
    def start(self, req: ProfileRequest) -> None:
        from sparkit.engines.embedded.requests import ApiError

        with self.lock:
            if self.active is not None or self.pending is not None:
                raise ApiError(400, "Profiling is already in progress. Call /stop_profile first.")
            self.pending, self.stop_requested, self.error = req, False, None
            self.written = []
            self.done.clear()

    def stop(self) -> None:
        from sparkit.engines.embedded.requests import ApiError

        with self.lock:
            if self.active is None and self.pending is None:
                raise ApiError(400, "Profiling is not in progress. Call /start_profile first.")
            self.stop_requested = True

    # worker side
    def poll(self) -> None:
        """At a step boundary (or idle): start a pending profile, finish a stopped one."""
        with self.lock:
            if self.pending is not None and self.active is None:
                if self.stop_requested:  # stopped before it started
                    self.pending, self.stop_requested = None, False
                    self.done.set()
                    return
                self._begin(self.pending)
                self.pending = None
            elif self.active is not None and self.stop_requested:
                self._finish()

    def step_done(self) -> None:
        with self.lock:
            if self.active is None:
                return
            self.steps += 1
            if self.request and self.request.num_steps and self.steps >= self.request.num_steps:
                self._finish()

    def _begin(self, req: ProfileRequest) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        wanted = req.activities or ["CPU", "GPU"]
        activities = [ProfilerActivity.CPU] if "CPU" in wanted else []
        if "GPU" in wanted and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities or [ProfilerActivity.CPU],
                       with_stack=bool(req.with_stack) if req.with_stack is not None else False,
                       record_shapes=bool(req.record_shapes))
        prof.start()
        self.active, self.request, self.steps = prof, req, 0

    def _finish(self) -> None:
        prof, req = self.active, self.request
        self.active, self.request, self.stop_requested = None, None, False
        try:
            prof.stop()
            out = Path(req.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or tempfile.gettempdir())
            out.mkdir(parents=True, exist_ok=True)
            name = "-".join(p for p in (req.profile_prefix, req.profile_id or str(time.time()), "TP-0") if p)
            path = out / f"{name}.trace.json.gz"
            prof.export_chrome_trace(str(path))
            self.written = [str(path)]
        except Exception as exc:  # noqa: BLE001 - reported to /stop_profile, the server keeps serving
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()


__all__ = ["ProfileControl", "ProfileRequest", "span"]
