"""The embedded engine's HTTP server: SGLang's HTTP surface over one EmbeddedEngine.

    python -m sparkit.engines.embedded --model-path DIR [--speculative-algorithm NEXTN ...]

Structure (one process):

    uvicorn event loop  ── Job (input ids, SamplingParams, cancel flag) ──>  FIFO queue
         ^                                                                      │
         └── RequestProgress snapshots (call_soon_threadsafe) ──  EngineWorker thread
                                                                  (loads the engine, warms up,
                                                                   then runs jobs one at a time)

The engine is called from that ONE worker thread only (batch 1, see api.py), so
concurrent clients queue and never share state. A client that goes away sets its
job's cancel flag; the engine checks it every step and frees the slot.

The HTTP port is bound before the model loads so that /health can answer 503
while starting, as SGLang does; a load failure stops the server with exit code 1
and a message naming the file.

Modules: settings.py (flags, validation), loading.py (checkpoint checks, engine loading),
worker.py (the worker thread), metrics.py (counters), routes.py (the app and its handlers),
grammar_pool.py (grammar compiles in child processes of a forkserver, killed past their time),
requests.py (request parsing), responses.py (response shapes); this module keeps `main`.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from sparkit.engines.embedded.loading import CheckpointError, check_checkpoint, checkpoint_parameters, load_engine
from sparkit.engines.embedded.routes import ServerState, create_app
from sparkit.engines.embedded.settings import build_arg_parser, validate_args
from sparkit.engines.embedded.worker import EngineWorker, log

READY_LINE = "The server is fired up and ready to roll!"


# -- main ---------------------------------------------------------------------------------------------------


def build_server(argv: list[str]) -> ServerState:
    """The server's state for a command line, its worker created but not started (main starts it
    once the port is bound; a test can start it and serve the app in-process). Exits 2 on bad
    flags (argparse); raises CheckpointError for an unusable checkpoint."""
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    problems = validate_args(args)
    if problems:
        parser.error("; ".join(problems))
    model_config = check_checkpoint(Path(args.model_path))
    if args.speculative_draft_model_path:
        check_checkpoint(Path(args.speculative_draft_model_path))
    state = ServerState(args, argv, model_config)

    def on_loaded(engine: Any) -> None:
        resolved = state.server_args()
        with state.metrics.lock:  # the engine's resolved values, not the flags' defaults
            state.metrics.context_length = state.context_length
            state.metrics.spec_steps = resolved.get("speculative_num_steps") or 0
            state.metrics.spec_draft_tokens = resolved.get("speculative_num_draft_tokens") or 0
        log("server_args=" + json.dumps(resolved, default=str))
        report = engine.activation_report()
        path = report.write()
        if path is not None:
            log(f"Activation report written to {path}")

    def on_ready() -> None:
        log(READY_LINE)

    def on_failed(exc: BaseException) -> None:
        from sparkit.errors import SparkitError

        if isinstance(exc, SparkitError):  # a user-facing message that names the file; no traceback
            print(f"error: {exc}", file=sys.stderr, flush=True)
        else:
            traceback.print_exception(exc, file=sys.stderr)
            print(f"error: the engine failed to start from {args.model_path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        state.exit_code = 1
        if state.uvicorn_server is not None:
            state.uvicorn_server.should_exit = True

    state.worker = EngineWorker(
        lambda: load_engine(args, state.served_name, checkpoint_parameters(Path(args.model_path))),
        speculative=state.speculative,
        metrics=state.metrics,
        max_queued=args.max_queued_requests,
        step_delay_s=args.debug_step_delay_ms / 1000.0,
        decode_log_interval=args.decode_log_interval,
        on_loaded=on_loaded,
        on_ready=on_ready,
        on_failed=on_failed,
    )
    return state


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        state = build_server(argv)
    except CheckpointError as exc:
        print(f"error: cannot load the checkpoint: {exc}", file=sys.stderr, flush=True)
        return 1
    args = state.args

    import logging

    import uvicorn

    from sparkit.engines.embedded.gate import BodyGate, Causes, Limits, RequestGate, protocol_class, raise_file_limit
    from sparkit.engines.embedded.settings import server_options

    options = server_options(args)
    files = raise_file_limit()
    limits = Limits(host=args.host, port=args.port, max_connections=max(1, min(options.max_connections, files - 64)),
                    header_timeout_s=options.header_timeout, body_timeout_s=options.body_timeout,
                    max_request_bytes=options.max_request_bytes, allowed_hosts=options.hosts(),
                    allowed_origins=options.origins(), causes=Causes(emit=log))
    state.causes = limits.causes
    app = RequestGate(create_app(state, inner=lambda inner: BodyGate(inner, limits, lambda: state.context_length)), limits)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        http=protocol_class(limits),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
        lifespan="off",
    )
    # After Config, which sets uvicorn's logging up: its per-request warnings, once per cause.
    logging.getLogger("uvicorn.error").addFilter(limits.causes.log_filter())

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful shutdown (exit status -15);
            # a requested, completed shutdown exits 0 so that callers can tell it from a crash.
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    server = Server(config)
    state.uvicorn_server = server

    original_startup = server.startup

    async def startup(sockets=None) -> None:
        import asyncio

        asyncio.get_running_loop().set_exception_handler(limits.causes.loop_handler)
        await original_startup(sockets=sockets)
        if not server.should_exit:
            log(f"Embedded engine HTTP server listening on http://{args.host}:{args.port} (at most "
                f"{limits.max_connections} connections; headers within {limits.header_timeout_s:g} s, bodies within "
                f"{limits.body_timeout_s:g} s)")
            state.worker.start()

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run()
    finally:
        if state.worker is not None:
            state.worker.stop()
            state.worker.thread.join(timeout=5) if state.worker.thread.is_alive() else None
        state.close_grammar_pool()
    for line in limits.causes.summary():
        log(line)
    if state.exit_code == 0 and not server.started:
        return 1
    if state.exit_code == 0:
        log("Shutdown complete.")
    return state.exit_code
