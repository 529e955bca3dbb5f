"""Shared engine fixtures: a built tiny-ling and real embedded-server processes.

Re-exported by tests/conftest.py, so any test can ask for them by name.

Fixtures
--------
tiny_model_dir (session) -> Path
    tiny-ling, seed 0: the checkpoint shipped with the package (what `sparkit up` serves;
    no training in the tests).
wrong_draft_model_dir (session) -> Path
    tiny-ling, seed 1, WRONG_DRAFT_STEPS steps (the recipes' `sparkit:tiny-ling:seed=1:steps=40`),
    built once into a persistent test cache ($SPARKIT_TEST_MODEL_CACHE, default
    ~/.cache/sparkit-tests): a checkpoint whose NextN layer is a *wrong* draft for
    tiny_model_dir's target (accept length near 1).
dspark_draft_dir (session) -> Path
    the DSpark draft shipped for tiny-ling (sparkit:tiny-ling-dspark; no training in the tests).
random_draft_dir (session) -> Path
    an untrained DSpark draft for tiny-ling (sparkit:tiny-ling-dspark:steps=0: its seeded
    initialisation), built once into the persistent test cache (no training: seconds).
start_embedded_server (function) -> callable(**flags) -> RunningServer
    Factory: launches `python -m sparkit.engines.embedded` as a real subprocess in its
    own process group on a free 127.0.0.1 port, waits for /health == 200 (timeout
    SERVER_START_TIMEOUT seconds; on failure the test fails showing the server log),
    and kills the process group at teardown. Keyword flags become launch flags:
    `speculative_num_steps=3` -> `--speculative-num-steps 3`, `enable_metrics=True` ->
    `--enable-metrics` (False/None are left out). `model_path` defaults to
    tiny_model_dir. Extra keywords (not flags): `env={...}` (added to the environment;
    e.g. {"SPARKIT_API_KEY": "k"}), `wait=False` (return at once, e.g. to watch a start
    fail), `report_dir=Path` (SPARKIT_REPORT_DIR; default a fresh tmp dir, as
    RunningServer.report_dir).
quant_model_dir (session) -> Path
    the shipped tiny-ling, whose expert widths (128) the quantised layouts tile (block 128, group
    32); the session fails naming the tensor if they do not.
quantized_exports (session) -> {"bf16" | "fp8" | "mxfp4" | "fp8-damaged": Path}
    quant_model_dir's Hugging Face exports in each layout (`sparkit model export-hf --weights`),
    and the FP8 one with its deliberately damaged scale.
embedded_server (module) -> RunningServer
    tiny-ling with NEXTN 3/1/4 and an fp8 lm_head, shared by every test of a module.
    Tests that share it must not depend on the absolute values of its counters.

RunningServer has `url`, `proc` (subprocess.Popen), `log_path`, `report_dir`,
`api_key`, `log()` (the log so far), `wait_healthy(timeout)`, `stop()`.

The servers run with OMP/MKL threads = 1 (the test machine is shared) unless
SPARKIT_TEST_TORCH_THREADS says otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = [
    "RunningServer",
    "tiny_model_dir",
    "wrong_draft_model_dir",
    "dspark_draft_dir",
    "random_draft_dir",
    "v3_model_dir",
    "v3_short_draft_dir",
    "v3_dspark_draft_dir",
    "start_embedded_server",
    "embedded_server",
    "model_cache_dir",
    "quant_model_dir",
    "quantized_exports",
    "free_port",
    "launch_embedded_server",
]

SERVER_START_TIMEOUT = float(os.environ.get("SPARKIT_TEST_SERVER_TIMEOUT", "180"))
WRONG_DRAFT_STEPS = 40


def model_cache_dir() -> Path:
    """Where test builds of tiny-ling persist between sessions."""
    value = os.environ.get("SPARKIT_TEST_MODEL_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "sparkit-tests"




def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    proc: subprocess.Popen
    log_path: Path
    report_dir: Path
    api_key: str | None = None
    argv: list[str] = field(default_factory=list)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout: float = SERVER_START_TIMEOUT) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the embedded server exited with code {self.proc.returncode} before becoming healthy; log:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the embedded server did not answer /health within {timeout:.0f} s; log:\n{self.log()}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it if it lingers; returns the exit code."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        _signal_group(self.proc.pid, signal.SIGKILL)  # strays of the group, if any
        return self.proc.returncode


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _flags_to_argv(flags: dict) -> list[str]:
    argv: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        else:
            argv.extend([flag, str(value)])
    return argv


def launch_embedded_server(
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    wait: bool = True,
    report_dir: Path | None = None,
    timeout: float = SERVER_START_TIMEOUT,
    **flags,
) -> RunningServer:
    """Start one server process (see the module docstring); the caller stops it."""
    port = flags.pop("port", None) or free_port()
    host = flags.pop("host", "127.0.0.1")
    argv = [sys.executable, "-m", "sparkit.engines.embedded", "--host", host, "--port", str(port), *_flags_to_argv(flags)]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = Path(tempfile.mkstemp(prefix="embedded-server-", suffix=".log", dir=log_dir)[1])
    report_dir = report_dir or Path(tempfile.mkdtemp(prefix="reports-", dir=log_dir))
    child_env = dict(os.environ)
    threads = os.environ.get("SPARKIT_TEST_TORCH_THREADS", "1")
    child_env.setdefault("OMP_NUM_THREADS", threads)
    child_env.setdefault("MKL_NUM_THREADS", threads)
    child_env["SPARKIT_REPORT_DIR"] = str(report_dir)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env.update(env or {})
    repo = Path(__file__).resolve().parent.parent
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), child_env.get("PYTHONPATH", "")) if p)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, start_new_session=True)
    server = RunningServer(
        url=f"http://{host}:{port}", proc=proc, log_path=log_path, report_dir=report_dir,
        api_key=(env or {}).get("SPARKIT_API_KEY") or flags.get("api_key"), argv=argv,
    )
    if wait:
        try:
            server.wait_healthy(timeout)
        except RuntimeError:
            server.stop()
            raise
    return server


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from sparkit.models.builder import BuildSpec, is_complete
    from sparkit.models.tiny_ling.family import SHIPPED_DIR

    shipped = SHIPPED_DIR / BuildSpec().dir_name
    if not is_complete(shipped, BuildSpec()):  # tests/embedded/test_builder.py says why
        pytest.fail(f"the shipped tiny-ling at {shipped} is missing or outdated: rebuild it with "
                    f"`sparkit model make-tiny {shipped}`", pytrace=False)
    return shipped


@pytest.fixture(scope="session")
def wrong_draft_model_dir() -> Path:
    from sparkit.models.builder import BuildSpec, ensure_model

    spec = BuildSpec("tiny-ling", 1, WRONG_DRAFT_STEPS)
    return ensure_model(spec.name, spec.seed, directory=model_cache_dir() / spec.dir_name, steps=spec.steps)


@pytest.fixture(scope="session")
def dspark_draft_dir() -> Path:
    from sparkit.models.dspark.builder import SHIPPED_DIR, DraftSpec, is_complete

    shipped = SHIPPED_DIR / DraftSpec().dir_name
    if not is_complete(shipped, DraftSpec()):  # tests/models/test_dspark_builder.py says why
        pytest.fail(f"the shipped DSpark draft at {shipped} is missing or outdated: rebuild it with "
                    f"`sparkit model make-dspark {shipped}`", pytrace=False)
    return shipped


@pytest.fixture(scope="session")
def random_draft_dir() -> Path:
    from sparkit.models.dspark.builder import DraftSpec, ensure_draft

    spec = DraftSpec("tiny-ling-dspark", 0, 0)
    return ensure_draft(spec.name, spec.seed, directory=model_cache_dir() / spec.dir_name, steps=0)


@pytest.fixture(scope="session")
def v3_model_dir() -> Path:
    from sparkit.models.builder import BuildSpec, is_complete

    spec = BuildSpec("tiny-ling-v3")
    shipped = spec.family.shipped_dir / spec.dir_name
    if not is_complete(shipped, spec):
        pytest.fail(f"the shipped tiny-ling-v3 at {shipped} is missing or outdated", pytrace=False)
    return shipped


@pytest.fixture(scope="session")
def v3_dspark_draft_dir() -> Path:
    from sparkit.models.dspark.builder import SHIPPED_DIR, DraftSpec, is_complete

    spec = DraftSpec("tiny-ling-v3-dspark")
    shipped = SHIPPED_DIR / spec.dir_name
    if not is_complete(shipped, spec):  # tests/models/test_dspark_builder.py says why
        pytest.fail(f"the shipped DSpark draft at {shipped} is missing or outdated: rebuild it with "
                    f"`sparkit model make-dspark --draft tiny-ling-v3-dspark {shipped}`", pytrace=False)
    return shipped


V3_SHORT_DRAFT_STEPS = 4  # a few steps: it drafts, and most of its blocks are rejected


@pytest.fixture(scope="session")
def v3_short_draft_dir() -> Path:
    """A DSpark draft for the shipped tiny-ling-v3 after a few training steps (built once, cached)."""
    from sparkit.models.dspark.builder import DraftSpec, ensure_draft

    spec = DraftSpec("tiny-ling-v3-dspark", 0, V3_SHORT_DRAFT_STEPS)
    return ensure_draft(spec.name, spec.seed, directory=model_cache_dir() / spec.dir_name, steps=spec.steps)


@pytest.fixture(scope="session")
def quant_model_dir(tiny_model_dir) -> Path:
    from sparkit.models.checkpoint import load_checkpoint
    from sparkit.models.tiny_ling.hf_checkpoint import layout_error

    cfg, _ = load_checkpoint(tiny_model_dir)
    for weights in ("fp8", "mxfp4"):  # the shipped build's widths are what the layouts need
        problem = layout_error(cfg, weights)
        if problem:
            pytest.fail(f"the shipped tiny-ling cannot be exported in the {weights} layout: {problem}", pytrace=False)
    return tiny_model_dir


@pytest.fixture(scope="session")
def quantized_exports(quant_model_dir, tmp_path_factory) -> dict:
    from sparkit.models.checkpoint import export_hf

    root = tmp_path_factory.mktemp("quantized-exports")
    out = {}
    for label, weights, damaged in (("bf16", "bf16", False), ("fp8", "fp8", False), ("mxfp4", "mxfp4", False),
                                    ("fp8-damaged", "fp8", True)):
        out[label] = root / f"tiny-ling-hf-{label}"
        export_hf(quant_model_dir, out[label], "bfloat16", weights, damaged)
    return out


@pytest.fixture
def start_embedded_server(tiny_model_dir, tmp_path_factory):
    servers: list[RunningServer] = []
    log_dir = tmp_path_factory.mktemp("embedded-servers")

    def start(**flags) -> RunningServer:
        flags.setdefault("model_path", tiny_model_dir)
        try:
            server = launch_embedded_server(log_dir, **flags)
        except RuntimeError as exc:
            pytest.fail(str(exc), pytrace=False)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def embedded_server(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("embedded-server-shared")
    try:
        server = launch_embedded_server(
            log_dir,
            model_path=tiny_model_dir,
            speculative_algorithm="NEXTN",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            lm_head_dtype="fp8",
        )
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()
