"""The embedded engine's settings, declared once: `EngineConfig` (what the engine is built with)
and `ServerOptions` (what the HTTP server around it uses). From these two declarations come the
launch flags (`build_arg_parser`; SGLang's names where one exists), their validation (`problems`,
`validate_args`: every rule in one place, "draft tokens = steps + 1" included) and the static part
of the resolved server args (`EngineConfig.resolved`). Below them, the engine's settings table
(SETTINGS: recipe key -> setting -> resolved-args name -> expectation), from which the adapter's
argv and expected server args come. Importable without torch, starlette or uvicorn: the recipe
compiler validates a plan's flags with it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from sparkit.api_key import KEY_ENV as API_KEY_ENV  # the variable the engine reads its key from
from sparkit.contract.flag_table import (
    ALIASES,
    DEFAULT_PORT,
    SPECULATIVE_DEFAULTS,
    SPECULATIVE_NUMBERS,
    Setting,
    chain_draft_tokens,
    expected_args,
    shared,
)
from sparkit.engines.embedded.grammar import MAX_GRAMMAR_CHARS
from sparkit.engines.embedded.tool_calls import TOOL_CALL_PARSERS
from sparkit.kernels.rescoring import DEFAULT_EXACT_TOP_K
from sparkit.models.formats import EXPERT_FORMATS, LM_HEAD_DTYPES  # what the model loads in

ORIGINS_ENV = "SPARKIT_ALLOWED_ORIGINS"  # like OLLAMA_ORIGINS
HOSTS_ENV = "SPARKIT_ALLOWED_HOSTS"

SPECULATIVE_ALGORITHMS = ("NEXTN", ALIASES["NEXTN"], "DSPARK")  # EAGLE is an alias of NEXTN, as in SGLang
LM_HEAD_SHARING = ("module", "tensor")
EXPERT_DEQUANT = ("load", "forward")
# Requests decoded together. On a 2-core CPU, 8 concurrent tiny-ling requests decode 3-4x the
# aggregate tok/s of 8 sequential ones and 16 a little more, at a longer step for each
# (benchmarks/embedded_batching.py); each slot's KV cache is context-length tokens.
DEFAULT_MAX_RUNNING_REQUESTS = 16
# Prompt tokens prefilled per scheduler step: a longer prompt is prefilled in chunks this long,
# each followed by a decode step of the running requests (SGLang's chunked prefill).
DEFAULT_CHUNKED_PREFILL_SIZE = 256


def setting(default: Any = MISSING, help: str = "", *, flag: bool = True, choices: tuple | None = None,
            flag_choices: tuple | None = None, flag_default: Any = MISSING, type: Any = None,
            metavar: str | None = None, upper: bool = False, store_true: bool = False):
    """A declared setting: its default, and how it reads as a flag (`--name-with-dashes`).
    `flag_choices` / `flag_default` where the flag offers less than the engine accepts, or leaves
    "unset" to the engine (None)."""
    metadata = {"help": help, "flag": flag, "choices": choices, "flag_choices": flag_choices,
                "flag_default": flag_default, "type": type, "metavar": metavar, "upper": upper,
                "store_true": store_true}
    if default is MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def flag_name(name: str) -> str:
    """The flag of a declared setting (raises KeyError for a name no declaration has)."""
    if name not in _DECLARED:
        raise KeyError(f"no embedded-engine setting named {name!r}")
    return "--" + name.replace("_", "-")


@dataclass
class EngineConfig:
    """What the engine is built with (sparkit.engines.embedded.engine.EmbeddedEngine)."""

    model_path: str = setting(help="a tiny-ling checkpoint directory (config.json, model.safetensors, tokenizer)")
    served_model_name: str | None = setting(None, "model name in the API (default: the directory name)")
    device: str = setting("auto", "auto = cuda when available", flag_choices=("auto", "cpu", "cuda"))
    dtype: str | None = setting(None, "activation dtype (auto: float32 on cpu, bfloat16 on cuda)",
                                choices=("bfloat16", "float32"), flag_choices=("bfloat16", "float32", "auto"),
                                flag_default="auto")
    expert_weights: str = setting("bf16", "routed/shared expert weight format (quantised at load)",
                                  choices=EXPERT_FORMATS, flag_choices=("bf16", "fp8", "mxfp4"))
    # "load": quantise at load, decode the quantised values once into the compute dtype (the
    # forward computes with exactly the quantised values; fast on CPU). "forward": decode the
    # picked experts from the quantised bytes in every forward (what a fused GPU kernel does; on
    # CPU the decoding dominates the step, so verify steps, which touch more experts, get slow).
    expert_dequant: str = setting("load", flag=False, choices=EXPERT_DEQUANT)
    lm_head_dtype: str = setting("bf16", "fp8 = online per-row e4m3 quantisation at load",
                                 choices=LM_HEAD_DTYPES, flag_choices=("bf16", "fp32", "fp8"))
    lm_head_exact_top_k: int = setting(DEFAULT_EXACT_TOP_K, "fp8 head: re-score the K best candidates per row "
                                       "exactly from a kept bf16 copy (0 = off)", type=int, metavar="K")
    speculative_algorithm: str | None = setting(None, "EAGLE is an alias of NEXTN; omitted = no speculation",
                                                choices=SPECULATIVE_ALGORITHMS, upper=True)
    speculative_num_steps: int = setting(SPECULATIVE_DEFAULTS["num_steps"], type=int, flag_default=None)
    speculative_eagle_topk: int = setting(SPECULATIVE_DEFAULTS["eagle_topk"], type=int, flag_default=None)
    speculative_num_draft_tokens: int | None = setting(None, "unset = num steps + 1", type=int)
    speculative_draft_model_path: str | None = setting(None, "NEXTN: take the NextN layer from another checkpoint; "
                                                       "DSPARK: the block draft (a LingDSparkModel checkpoint), required")
    # SGLang's flag: the tokens a DSpark block drafts (gamma); unset = the draft config's block_size
    speculative_dspark_block_size: int | None = setting(None, "DSPARK: tokens drafted per block (unset = the draft "
                                                        "config's block_size)", type=int, metavar="N")
    draft_lm_head_sharing: str = setting(
        "module", "how the NextN draft uses the target's lm_head: the same module (default) or a copy of its "
        "tensor (reproduces SGLang 0.5.23's shared-head trap)", choices=LM_HEAD_SHARING, flag_default=None)
    context_length: int | None = setting(None, "unset = the model's max_position_embeddings", type=int)
    max_running_requests: int = setting(DEFAULT_MAX_RUNNING_REQUESTS, "requests decoded together (one KV cache each); "
                                        "more wait in the queue, first come first served; 1 serves one at a time "
                                        "with the batch-1 kernels", type=int, metavar="N")
    chunked_prefill_size: int = setting(DEFAULT_CHUNKED_PREFILL_SIZE, "prompt tokens prefilled per scheduler step: a "
                                        "longer prompt is prefilled in chunks of N, a decode step of the running "
                                        "requests after each (-1: a prompt in one piece)", type=int, metavar="N")
    seed: int = setting(0, type=int)
    # SGLang's JSON-constraint knobs (xgrammar backend): a model that likes whitespace can pad a
    # constrained JSON answer with it until max_tokens; these bound it, as they do in SGLang.
    constrained_json_disable_any_whitespace: bool = setting(False, "compact JSON under a json_schema / response_format "
                                                            "constraint (no free whitespace)", store_true=True)
    constrained_json_max_whitespace_cnt: int | None = setting(None, "at most N consecutive whitespace characters in "
                                                              "constrained JSON (unset = unbounded)", type=int, metavar="N")
    # A deliberately broken kernel, for proving the known-answer check (recipes/tiny/tiny-broken-kernel.yaml):
    # fp8 experts 0 and 1 decoded from each other's weights (quant.Fp8ExpertWeights). Reported in the
    # resolved args and the activation report's notes.
    debug_corrupt_expert_dequant: bool = setting(False, "DEBUG: decode fp8 experts 0 and 1 from each other's weights "
                                                 "(a wrong-numbers kernel bug, for testing the known-answer check)",
                                                 store_true=True)

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def dspark(self) -> bool:
        return self.speculative and self.speculative_algorithm.upper() == "DSPARK"

    @property
    def num_draft_tokens(self) -> int:
        """Tokens verified per step: with eagle topk 1 (a chain), the steps plus the bonus token."""
        return self.speculative_num_draft_tokens or chain_draft_tokens(self.speculative_num_steps)

    def problems(self, name: Callable[[str], str] = lambda setting: setting) -> list[str]:
        """Every reason this configuration cannot run (empty = fine), naming each setting as
        `name` spells it (its field name; `flag_name` for a command line)."""
        out = _choice_problems(self, name)
        if self.dspark:
            out += self._dspark_problems(name)
        elif self.speculative:
            if self.speculative_num_steps < 1:
                out.append(f"{name('speculative_num_steps')} must be >= 1")
            if self.speculative_eagle_topk != 1:
                out.append(f"{name('speculative_eagle_topk')}: the embedded engine supports only 1")
            elif self.speculative_num_draft_tokens not in (None, chain_draft_tokens(self.speculative_num_steps)):
                out.append(f"{name('speculative_num_draft_tokens')} must be {name('speculative_num_steps')} + 1 "
                           "with eagle topk 1")
        if not isinstance(self.lm_head_exact_top_k, int) or self.lm_head_exact_top_k < 0:
            out.append(f"{name('lm_head_exact_top_k')} must be an integer >= 0")
        if self.context_length is not None and self.context_length < 2:
            out.append(f"{name('context_length')} must be >= 2")
        if not isinstance(self.max_running_requests, int) or self.max_running_requests < 1:
            out.append(f"{name('max_running_requests')} must be an integer >= 1")
        if not isinstance(self.chunked_prefill_size, int) or not (self.chunked_prefill_size >= 1 or self.chunked_prefill_size == -1):
            out.append(f"{name('chunked_prefill_size')} must be >= 1, or -1 (no chunking)")
        if self.constrained_json_max_whitespace_cnt is not None and self.constrained_json_max_whitespace_cnt < 0:
            out.append(f"{name('constrained_json_max_whitespace_cnt')} must be >= 0")
        if self.debug_corrupt_expert_dequant and self.expert_weights != "fp8":
            out.append(f"{name('debug_corrupt_expert_dequant')} corrupts fp8 expert decoding: it needs "
                       f"{name('expert_weights')} fp8")
        return out

    def _dspark_problems(self, name: Callable[[str], str]) -> list[str]:
        """SGLang's rules for DSpark (arg_groups/speculative_hook.py _handle_dspark): a draft model,
        a positive block size, and draft tokens = block size + 1 when both are given."""
        out = []
        if not self.speculative_draft_model_path:
            out.append(f"{name('speculative_algorithm')} DSPARK needs {name('speculative_draft_model_path')}")
        block = self.speculative_dspark_block_size
        if block is not None and block < 1:
            out.append(f"{name('speculative_dspark_block_size')} must be >= 1")
        elif block is not None and self.speculative_num_draft_tokens not in (None, block + 1):
            out.append(f"{name('speculative_num_draft_tokens')} must be {name('speculative_dspark_block_size')} + 1 "
                       "under DSPARK (the anchor and the drafted tokens)")
        return out

    def resolved(self) -> dict[str, Any]:
        """The resolved server args (SGLang's names) these settings decide; the engine adds what
        only the loaded model knows (device, dtype, context length)."""
        spec = self.speculative
        fmt = self.expert_weights
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name,
            "quantization": None if fmt in ("bf16", "fp32") else fmt,
            "expert_weights": fmt,
            "expert_dequant": self.expert_dequant,
            "lm_head_dtype": self.lm_head_dtype,
            "lm_head_exact_top_k": self.lm_head_exact_top_k if self.lm_head_dtype == "fp8" else None,
            "enable_fp32_lm_head": self.lm_head_dtype == "fp32",
            "moe_runner_backend": "embedded-torch",
            "attention_backend": "torch_sdpa",
            "tp_size": 1,
            "ep_size": 1,
            "dp_size": 1,
            "random_seed": self.seed,
            "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": self.chunked_prefill_size,
            "schedule_policy": "fcfs",
            "speculative_algorithm": self.speculative_algorithm.upper() if spec else None,
            "speculative_num_steps": self.speculative_num_steps if spec else None,
            "speculative_eagle_topk": self.speculative_eagle_topk if spec else None,
            "speculative_num_draft_tokens": self.num_draft_tokens if spec else None,
            "speculative_draft_model_path": self.speculative_draft_model_path if spec else None,
            "speculative_dspark_block_size": self.speculative_dspark_block_size if self.dspark else None,
            "draft_lm_head_sharing": self.draft_lm_head_sharing if spec else None,
            "debug_corrupt_expert_dequant": self.debug_corrupt_expert_dequant,
            "grammar_backend": "xgrammar",
            "constrained_json_disable_any_whitespace": self.constrained_json_disable_any_whitespace,
            "constrained_json_max_whitespace_cnt": self.constrained_json_max_whitespace_cnt,
        }


@dataclass
class ServerOptions:
    """What the HTTP server around the engine uses."""

    host: str = setting("127.0.0.1")
    port: int = setting(DEFAULT_PORT, type=int)
    api_key: str | None = setting(None, f"require 'Authorization: Bearer KEY' (everything but /health); env {API_KEY_ENV} also works")
    enable_metrics: bool = setting(False, "accepted for SGLang parity; /metrics is always on", store_true=True)
    max_queued_requests: int | None = setting(None, "queued requests beyond this get HTTP 503", type=int)
    decode_log_interval: int = setting(40, "decode steps between 'Decode batch.' log lines (and gauge updates)",
                                       type=int, metavar="N")
    debug_step_delay_ms: float = setting(0.0, "sleep this long after every decode step (tests of streaming and "
                                         "aborts: an upper bound on the engine's speed that no machine load can "
                                         "lift)", type=float, metavar="MS")
    torch_threads: int = setting(0, "intra-op threads for the engine (0 = auto: one per 20M parameters, at most "
                                 "the CPU count)", type=int, metavar="N")
    max_request_bytes: int = setting(4 * 1024 * 1024, "largest request body accepted (HTTP 413 beyond); read up "
                                     "to this, never further, before parsing", type=int, metavar="BYTES")
    # A template in a request is code the server runs: off unless the operator says so.
    allow_request_chat_template: bool = setting(False, "let chat_template_kwargs.chat_template replace the model's "
                                                "chat template for one request", store_true=True)
    # One client's share of the server (issue 40, items 2 and 9). SGLang's names where it has one:
    # SGLANG_MAX_NEW_TOKENS_LIMIT, SGLANG_REQ_RUNNING_TIMEOUT and SGLANG_REQ_WAITING_TIMEOUT are its
    # environment variables for the same caps (its running timeout is the request's: all of its n
    # samples and prompts together, from the start of the first).
    max_new_tokens_limit: int | None = setting(None, "cap every generation's max_new_tokens / max_tokens / "
                                               "num_predict at N (it then ends with finish_reason length); "
                                               "SGLang's SGLANG_MAX_NEW_TOKENS_LIMIT", type=int, metavar="N")
    request_running_timeout: float | None = setting(None, "abort a request still generating this many seconds after "
                                                    "it started (all its prompts and n samples together; 503 "
                                                    "'Request running timeout reached.', as SGLang's "
                                                    "SGLANG_REQ_RUNNING_TIMEOUT)", type=float, metavar="SECONDS")
    request_waiting_timeout: float | None = setting(None, "abort a request that waited this many seconds in the queue "
                                                    "without starting (503, as SGLang's SGLANG_REQ_WAITING_TIMEOUT)",
                                                    type=float, metavar="SECONDS")
    grammar_compile_workers: int = setting(0, "grammars compiled at once, each in a child process (0 = auto: one per "
                                           "four cores)", type=int, metavar="N")
    grammar_compile_timeout: float = setting(30.0, "kill a grammar compile still running after this many seconds; "
                                             "the request gets 'Grammar preprocessing timed out'", type=float,
                                             metavar="SECONDS")
    grammar_max_chars: int = setting(MAX_GRAMMAR_CHARS, "refuse a regex, ebnf or json_schema longer than this (400)",
                                     type=int, metavar="N")
    # SGLang's --tool-call-parser: the format the model's tool calls are read in (tool_calls.py).
    tool_call_parser: str | None = setting(None, "parse the model's tool calls in this format into the API's "
                                           "tool_calls (SGLang's flag; unset: a tools request gets the text as "
                                           "content)", choices=TOOL_CALL_PARSERS)
    # The gate in front of every endpoint (sparkit.engines.embedded.gate).
    max_connections: int = setting(1024, "open connections beyond this get a 503 and are closed at once (kept under "
                                   "the process's file limit)", type=int, metavar="N")
    header_timeout: float = setting(15.0, "close a connection whose request headers have not all arrived within this "
                                    "many seconds (408)", type=float, metavar="SECONDS")
    body_timeout: float = setting(60.0, "answer 408 to a request whose body has not all arrived within this many "
                                  "seconds of its headers", type=float, metavar="SECONDS")
    allowed_hosts: str | None = setting(None, "more names the Host header may give, comma-separated (the addresses "
                                        "the server listens on always work)", metavar="NAMES")
    allowed_origins: str | None = setting(None, f"web origins whose browser requests are served (with CORS headers), "
                                          f"comma-separated, * or patterns like http://localhost:*; env {ORIGINS_ENV} "
                                          "also works (the server's own origin always does)", metavar="ORIGINS")

    def problems(self) -> list[str]:
        out = []
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            out.append("--max-queued-requests must be >= 1")
        if self.debug_step_delay_ms < 0:
            out.append("--debug-step-delay-ms must be >= 0")
        if self.decode_log_interval < 1:
            out.append("--decode-log-interval must be >= 1")
        if self.torch_threads < 0:
            out.append("--torch-threads must be >= 0 (0 = auto)")
        if self.max_request_bytes < 1024:
            out.append("--max-request-bytes must be >= 1024")
        if self.max_connections < 1:
            out.append("--max-connections must be >= 1")
        if not 0 < self.header_timeout <= 3600 or not 0 < self.body_timeout <= 3600:
            out.append("--header-timeout and --body-timeout must be above 0 and at most 3600 seconds")
        if self.max_new_tokens_limit is not None and self.max_new_tokens_limit < 1:
            out.append("--max-new-tokens-limit must be >= 1")
        for name in ("request_running_timeout", "request_waiting_timeout", "grammar_compile_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                out.append(f"{flag_name(name)} must be above 0 seconds")
        if self.grammar_compile_workers < 0:
            out.append("--grammar-compile-workers must be >= 0 (0 = auto)")
        if self.grammar_max_chars < 1:
            out.append("--grammar-max-chars must be >= 1")
        return out

    def origins(self) -> tuple[str, ...]:
        """The allowed web origins: the flag's and the environment's."""
        import os

        listed = ",".join(v for v in (self.allowed_origins, os.environ.get(ORIGINS_ENV)) if v)
        return tuple(o.strip().rstrip("/") for o in listed.split(",") if o.strip())

    def hosts(self) -> tuple[str, ...]:
        import os

        listed = ",".join(v for v in (self.allowed_hosts, os.environ.get(HOSTS_ENV)) if v)
        return tuple(h.strip() for h in listed.split(",") if h.strip())


_DECLARED = {f.name: f for cls in (EngineConfig, ServerOptions) for f in fields(cls)}


def _choice_problems(config: Any, name: Callable[[str], str]) -> list[str]:
    out = []
    for f in fields(config):
        allowed = f.metadata.get("choices")
        value = getattr(config, f.name)
        if allowed and value is not None and (value.upper() if f.metadata.get("upper") else value) not in allowed:
            out.append(f"{name(f.name)} must be one of {', '.join(allowed)}, not {value!r}")
    return out


def build_arg_parser() -> argparse.ArgumentParser:
    """The launch flags, one per declared setting (`python -m sparkit.engines.embedded --help`)."""
    parser = argparse.ArgumentParser(
        prog="python -m sparkit.engines.embedded",
        description="sparkit's embedded engine: tiny-ling behind SGLang's HTTP API.",
    )
    for f in _DECLARED.values():
        meta = f.metadata
        if not meta["flag"]:
            continue
        kwargs: dict[str, Any] = {"help": meta["help"] or None}
        if meta["store_true"]:
            parser.add_argument(flag_name(f.name), action="store_true", **kwargs)
            continue
        if f.default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default if meta["flag_default"] is MISSING else meta["flag_default"]
        choices = meta["flag_choices"] or meta["choices"]
        if choices:
            kwargs["choices"] = list(choices)
        if meta["upper"]:
            kwargs["type"] = str.upper
        elif meta["type"] is not None:
            kwargs["type"] = meta["type"]
        if meta["metavar"]:
            kwargs["metavar"] = meta["metavar"]
        parser.add_argument(flag_name(f.name), **kwargs)
    return parser


def engine_config(args: argparse.Namespace, served_name: str | None = None) -> EngineConfig:
    """The EngineConfig the flags describe (a flag left unset keeps the engine's default)."""
    values = {}
    for f in fields(EngineConfig):
        value = getattr(args, f.name, None)
        if f.name == "dtype" and value == "auto":
            value = None
        if value is not None:
            values[f.name] = value
    if served_name is not None:
        values["served_model_name"] = served_name
    return EngineConfig(**values)


def server_options(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(**{f.name: getattr(args, f.name) for f in fields(ServerOptions)})


def validate_args(args: argparse.Namespace) -> list[str]:
    """Every problem with parsed flags (empty = fine): the flags' own rule, then the settings'."""
    problems = []
    numbers = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    if args.speculative_algorithm is None and (any(v is not None for v in numbers) or args.speculative_draft_model_path
                                               or args.speculative_dspark_block_size is not None):
        problems.append("--speculative-* numbers, --speculative-draft-model-path or --speculative-dspark-block-size "
                        "given without --speculative-algorithm")
    return problems + engine_config(args).problems(flag_name) + server_options(args).problems()


def redacted_argv(argv: list[str]) -> list[str]:
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
        elif arg == "--api-key":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=<redacted>")
        else:
            out.append(arg)
    return out


# -- the settings table: recipe key -> setting (its flag) -> resolved-args name -> expectation ---------
# (the shape: sparkit.contract.flag_table). The adapter's argv is the table's rows in order
# (`command_line`), then the recipe's pass-through flags; the expected server args come from the
# same rows.


@dataclass
class Planned:
    """What a launch resolved before its command line."""

    recipe: Any  # sparkit.recipes.schema.Recipe
    port: int
    model_dir: str  # a built-in model's build, a pulled snapshot, or the directory as written
    served_name: str
    draft_dir: str | None = None
    draft_block_size: int | None = None  # DSpark: the draft config's block_size (None: unreadable at plan time)

    @property
    def spec(self) -> Any:
        return self.recipe.stack.speculative

    @property
    def nextn(self) -> bool:
        return self.spec.method == "nextn"

    @property
    def dspark(self) -> bool:
        return self.spec.method == "dspark"

    @property
    def block_size(self) -> int | None:
        """DSpark: the block size the engine will draft with (the recipe's, else the draft's)."""
        return (self.spec.block_size or self.draft_block_size) if self.dspark else None


def _row(key: str, name: str, **kw: Any) -> Setting:
    return Setting(key, name, flag=flag_name(name), **kw)


def _dspark_number(name: str, planned: Planned) -> int | None:
    """What a DSpark launch resolves each NEXTN number to (SGLang's _handle_dspark): one step, topk
    1, the block and its anchor verified."""
    if name == "num_draft_tokens":
        return planned.block_size + 1 if planned.block_size else None
    return 1


def _speculative_row(name: str) -> Setting:
    return shared(f"stack.speculative.{name}", flag=flag_name(f"speculative_{name}"),
                  arg=lambda p: getattr(p.spec, name) if p.nextn and p.spec.num_steps is not None else None,
                  expect=lambda p: getattr(p.spec, name) if p.nextn else _dspark_number(name, p) if p.dspark else None)


def _algorithm(planned: Planned) -> str | None:
    return "NEXTN" if planned.nextn else "DSPARK" if planned.dspark else None


SETTINGS: tuple[Setting, ...] = (
    shared("model.path", flag=flag_name("model_path"), arg=lambda p: p.model_dir),
    shared("model.served_name", flag=flag_name("served_model_name"), arg=lambda p: p.served_name),
    _row("server.host", "host", arg=lambda p: p.recipe.server.host),
    _row("server.port", "port", arg=lambda p: p.port),
    _row("target", "device", arg=lambda p: {"cpu": "cpu", "auto": "auto"}.get(p.recipe.target, "cuda"), label="device"),
    _row("stack.weights", "expert_weights", arg=lambda p: p.recipe.stack.weights, label="expert weights"),
    _row("stack.lm_head", "lm_head_dtype", arg=lambda p: p.recipe.stack.lm_head, label="lm_head", provides="lm_head"),
    _row("stack.lm_head_exact_top_k", "lm_head_exact_top_k",
         arg=lambda p: p.recipe.stack.lm_head_exact_top_k if p.recipe.stack.lm_head == "fp8" else None,
         label="exact top-k", provides="lm_head_exact_top_k"),
    shared("model.dtype", flag=flag_name("dtype"),
           arg=lambda p: p.recipe.model.dtype if p.recipe.model.dtype in ("bfloat16", "float32") else None),
    # The engine reports NEXTN as NEXTN (it takes EAGLE as an alias of it).
    shared("stack.speculative.method", flag=flag_name("speculative_algorithm"), arg=_algorithm, expect=_algorithm),
    *(_speculative_row(name) for name in SPECULATIVE_NUMBERS),
    shared("stack.speculative.draft_model", flag=flag_name("speculative_draft_model_path"),
           arg=lambda p: p.draft_dir if p.spec.enabled else None),
    _row("stack.speculative.block_size", "speculative_dspark_block_size",
         arg=lambda p: p.spec.block_size if p.dspark else None, expect=lambda p: p.block_size),
    _row("model.context_length", "context_length", arg=lambda p: p.recipe.model.context_length or None),
    _row("server.max_running_requests", "max_running_requests", arg=lambda p: p.recipe.server.max_running_requests),
    _row("server.enable_metrics", "enable_metrics", arg=lambda p: p.recipe.server.enable_metrics),
    # SGLang's own flags, so the same recipe keys mean the same on both engines; asserted when set.
    _row("server.constrained_json.disable_any_whitespace", "constrained_json_disable_any_whitespace",
         arg=lambda p: p.recipe.server.constrained_json.disable_any_whitespace,
         expect=lambda p: p.recipe.server.constrained_json.disable_any_whitespace or None),
    _row("server.constrained_json.max_whitespace_cnt", "constrained_json_max_whitespace_cnt",
         arg=lambda p: p.recipe.server.constrained_json.max_whitespace_cnt,
         expect=lambda p: p.recipe.server.constrained_json.max_whitespace_cnt),
    _row("server.tool_call_parser", "tool_call_parser", arg=lambda p: p.recipe.server.tool_call_parser,
         expect=lambda p: p.recipe.server.tool_call_parser),
    # One device: no flag, and the check expects what the engine reports.
    shared("stack.tp", expect=lambda p: 1),
    shared("stack.ep", expect=lambda p: 1),
)


def server_args(planned: Planned) -> dict[str, Any]:
    """The resolved args /server_info must report for this launch."""
    return expected_args(SETTINGS, planned)
