"""SGLang's `/start_profile` and `/stop_profile` for the embedded engine: a torch.profiler trace of
its forward passes, written where and as SGLang writes one (`{output_dir}/{profile_id}-TP-0.trace.json.gz`,
each forward a `step[STAGE bs=1]` span), so that `sparkit bench steps` reads either engine's.

torch.profiler records the ops of the thread that started it, so the worker thread starts and
stops it, at a step boundary or when it wakes idle (EngineWorker.poll_profile). With `num_steps`
it stops by itself after that many forward passes; `/stop_profile` otherwise.

Unlike SGLang, a request does not choose where the trace goes (issue 40, item 4: `output_dir`
named any directory, created it, and the export followed a link planted there): traces go in the
server's own profile directory (`profile_dir`: `profiles/` in the run directory sparkit started it
with, else the operator's SGLANG_TORCH_PROFILER_DIR, else a private temporary directory), named
from `profile_prefix` and `profile_id` reduced to safe characters, each file created new
(O_EXCL, O_NOFOLLOW, 0600): nothing is overwritten and no link is followed.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTIVITIES = ("CPU", "GPU")
PROFILES_SUBDIR = "profiles"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
NAME_CHARS = 100


def safe_name(value: str | None) -> str | None:
    """A request's profile_id or profile_prefix as a file-name part: letters, digits, '.', '_', '-'
    (anything else becomes '_'), no leading dot, at most NAME_CHARS characters."""
    if not value:
        return None
    cleaned = _UNSAFE.sub("_", str(value)).lstrip(".")[:NAME_CHARS]
    return cleaned or None


def private_dir(path: Path) -> Path:
    """`path` as a directory of this user's only (0700), created if missing; refused (OSError) when
    it is a link, someone else's, or open to others: a trace must not land where another user steers it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OSError(f"{path} is not a private directory of this user (a link, another user's, or open to others)")
    return path


def profile_dir() -> Path:
    """Where this server writes its traces (see the module docstring)."""
    from sparkit.engines.activation_report import REPORT_DIR_ENV

    run_dir = os.environ.get(REPORT_DIR_ENV)
    if run_dir:
        return private_dir(Path(run_dir) / PROFILES_SUBDIR)
    chosen = os.environ.get("SGLANG_TORCH_PROFILER_DIR")
    if chosen:
        return private_dir(Path(chosen))
    global _TEMP_DIR
    if _TEMP_DIR is None:
        _TEMP_DIR = Path(tempfile.mkdtemp(prefix="sparkit-profiles-"))
    return private_dir(_TEMP_DIR)


_TEMP_DIR: Path | None = None


def write_new(path: Path, source: Path) -> None:
    """Gzip `source` into `path`, a file that must not exist yet (O_EXCL) and is not followed if a
    link (O_NOFOLLOW); 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as out, open(source, "rb") as src:
        shutil.copyfileobj(src, out)


@dataclass
class ProfileRequest:
    """The fields of SGLang's ProfileReq the embedded engine acts on (the others are accepted;
    output_dir is read and ignored: the server's profile_dir is where traces go)."""

    num_steps: int | None = None
    activities: list[str] | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_id: str | None = None
    profile_prefix: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ProfileRequest:
        from sparkit.engines.embedded.requests import ApiError

        req = cls(**{k: body.get(k) for k in cls.__dataclass_fields__ if body.get(k) is not None})
        for name in ("profile_id", "profile_prefix"):
            value = getattr(req, name)
            if value is not None and (not isinstance(value, (str, int)) or isinstance(value, bool)):
                raise ApiError(400, f"{name}: a string, not {value!r}"[:200], param=name)
        if req.activities is not None and not isinstance(req.activities, list):
            raise ApiError(400, "activities: a list of CPU, GPU, MEM, RPD", param="activities")
        if req.num_steps is not None and (not isinstance(req.num_steps, int) or isinstance(req.num_steps, bool)
                                          or req.num_steps < 1):
            raise ApiError(400, f"num_steps: a positive integer, not {req.num_steps!r}")
        for activity in req.activities or []:
            if activity not in ACTIVITIES + ("MEM", "RPD"):
                raise ApiError(400, f"activities: {activity!r} is not one of CPU, GPU, MEM, RPD"[:200], param="activities")
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
            out = profile_dir()
            parts = (safe_name(req.profile_prefix), safe_name(str(req.profile_id) if req.profile_id is not None else None)
                     or str(time.time()), "TP-0")
            path = out / ("-".join(p for p in parts if p) + ".trace.json.gz")
            fd, raw = tempfile.mkstemp(prefix=".trace-", suffix=".json", dir=out)  # 0600, a new file
            os.close(fd)
            try:
                prof.export_chrome_trace(raw)
                write_new(path, Path(raw))
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(raw)
            self.written = [str(path)]
        except Exception as exc:  # noqa: BLE001 - reported to /stop_profile, the server keeps serving
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()


__all__ = ["ProfileControl", "ProfileRequest", "profile_dir", "safe_name"]
