"""EmbeddedEngine: tiny-ling inference (prefill + KV-cache decode, sampling, NEXTN speculative
decoding) behind the EngineProtocol of api.py. Batch 1; the server calls it from one thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from sparkit.engines.embedded.api import CancelFlag, LogprobRequest, SamplingParams, StepOutput, TokenLogprobs
from sparkit.engines.embedded.settings import EngineConfig  # noqa: F401 (the engine's configuration, declared there)
from sparkit.errors import LaunchError

ENGINE_VERSION = "0.1.0"


class EmbeddedEngine:
    def __init__(self, config: EngineConfig):
        from sparkit.engines.embedded import checkpoint, quant
        from sparkit.engines.embedded.model import TinyLingForCausalLMNextN
        from sparkit.engines.embedded.tokenizer import load_tokenizer

        self.config = config
        self._validate(config)
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        self.model_path = str(Path(config.model_path))
        self.model_name = config.served_model_name or Path(config.model_path).name
        self.notes: list[str] = []
        self.load_seconds: dict[str, float] = {}

        started = time.monotonic()
        self.model_config, model = checkpoint.load_checkpoint(config.model_path)
        try:
            self.tokenizer = load_tokenizer(config.model_path)
        except Exception as exc:
            raise LaunchError(f"cannot load the tokenizer from {config.model_path}: {exc}") from None
        self.vocab_limit = min(len(self.tokenizer), self.model_config.vocab_size)
        self.context_length = min(config.context_length or self.model_config.max_position_embeddings, self.model_config.max_position_embeddings)
        head_weight = model.lm_head.weight.data
        self._quantize_moe(model, config.expert_weights, config.model_path)
        model.to(device=self.device, dtype=self.dtype)
        model.lm_head = quant.make_lm_head(head_weight.to(self.device), config.lm_head_dtype,
                                           exact_top_k=config.lm_head_exact_top_k)
        if config.debug_corrupt_expert_dequant:
            self.notes.append("DEBUG: fp8 expert dequantisation deliberately corrupted (experts 0 and 1 swapped)")
        if config.lm_head_dtype == "fp8":
            self.notes.append("Online FP8 quantization enabled for lm_head.")
            self.notes.append(f"FP8 lm_head path: {model.lm_head.quant_method.kernel(model.lm_head)}")
        if self.dtype == torch.float32:
            # fixed-op-count CPU path (see model.FastDecoderLayer); off where experts are decoded per forward
            model.prepare_inference()
        self.model = model
        self.load_seconds["target"] = time.monotonic() - started

        self.speculative = config.speculative_algorithm is not None
        self.num_steps = config.speculative_num_steps if self.speculative else 0
        self.draft = None
        if self.speculative:
            started = time.monotonic()
            nextn = model.mtp
            if config.speculative_draft_model_path:
                draft_cfg, draft_model = checkpoint.load_checkpoint(config.speculative_draft_model_path)
                if (draft_cfg.hidden_size, draft_cfg.vocab_size) != (self.model_config.hidden_size, self.model_config.vocab_size):
                    raise LaunchError(
                        f"draft model {config.speculative_draft_model_path} (hidden {draft_cfg.hidden_size}, vocab "
                        f"{draft_cfg.vocab_size}) does not fit the target (hidden {self.model_config.hidden_size}, "
                        f"vocab {self.model_config.vocab_size})"
                    )
                self._quantize_moe(draft_model, config.expert_weights, config.speculative_draft_model_path)
                draft_model.to(device=self.device, dtype=self.dtype)
                nextn = draft_model.mtp
                if self.dtype == torch.float32:
                    nextn.prepare_inference()
            if config.draft_lm_head_sharing == "module":
                draft_head = model.lm_head
            else:
                draft_head = quant.lm_head_from_raw_tensor(model.lm_head.weight, self.dtype)
            self.draft = TinyLingForCausalLMNextN(nextn, model.embed_tokens, draft_head, model.rope, self.model_config)
            self.load_seconds["draft"] = time.monotonic() - started
        self._target_cache = model.new_cache(self.context_length, self.dtype, self.device)
        self._draft_cache = self.draft.new_cache(self.context_length, self.dtype, self.device) if self.draft else None
        self._generator = _make_generator(self.device, config.seed)
        # accept-length bookkeeping for the server's metrics (totals since start)
        self.total_verify_steps = 0
        self.total_committed_in_verify = 0
        self._grammar_compiler = None
        self._grammar_lock = threading.Lock()

    @property
    def grammar_compiler(self):
        """xgrammar's compiler over this tokenizer (grammar.py), built on first use: routes
        compile a request's grammar with it off the event loop, before the request is queued."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                from sparkit.engines.embedded.grammar import GrammarCompiler

                self._grammar_compiler = GrammarCompiler(
                    self.tokenizer, self.vocab_limit, self.model_config.eos_token_id,
                    any_whitespace=not self.config.constrained_json_disable_any_whitespace,
                    max_whitespace_cnt=self.config.constrained_json_max_whitespace_cnt)
            return self._grammar_compiler

    # ---------------------------------------------------------------- protocol

    def generate(self, input_ids: list[int], params: SamplingParams, cancelled: CancelFlag,
                 logprobs: LogprobRequest | None = None) -> Iterator[StepOutput]:
        if not input_ids:
            raise ValueError("input_ids is empty")
        if len(input_ids) >= self.context_length:
            raise ValueError(f"the prompt has {len(input_ids)} tokens; the context length is {self.context_length}")
        if params.max_new_tokens is not None and params.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        bad = [t for t in input_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.model_config.vocab_size})")
        generator = _make_generator(self.device, params.seed) if params.seed is not None else self._generator
        # Validation above runs at call time (this method is not a generator); steps run lazily.
        if logprobs is not None and logprobs.input_start is not None and not 0 <= logprobs.input_start <= len(input_ids):
            raise ValueError(f"logprob_start_len {logprobs.input_start} is outside the prompt (0..{len(input_ids)})")
        return self._steps(_Request(self, list(input_ids), params, generator, logprobs), cancelled)

    def _steps(self, run: _Request, cancelled: CancelFlag) -> Iterator[StepOutput]:
        try:
            if self.draft is None:
                yield from run.plain(cancelled)
            else:
                yield from run.speculative(cancelled)
        finally:
            self._target_cache.length = 0
            if self._draft_cache is not None:
                self._draft_cache.length = 0

    def server_args(self) -> dict:
        """The resolved server args: what the settings decide, and what loading resolved."""
        return {
            **self.config.resolved(),
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_name,
            "device": self.device.type,
            "dtype": str(self.dtype).replace("torch.", ""),
            "context_length": self.context_length,
        }

    def activation_report(self):
        from sparkit.engines.activation_report import (
            ActivationReport,
            LmHeadReport,
            ModelReport,
            MoeLayerReport,
            MoeReport,
            SpeculativeReport,
        )
        from sparkit.engines.embedded.model import MoE

        def head_report(head, shared=None) -> LmHeadReport:
            return LmHeadReport(
                weight_dtype=str(head.weight.dtype).replace("torch.", ""),
                quant_method=type(head.quant_method).__name__,
                module_id=id(head),
                storage_ptr=head.weight.untyped_storage().data_ptr(),
                shared_with_target=shared,
                exact_top_k=getattr(head, "exact_top_k", None),
            )

        def moe_report(module, prefix: str) -> MoeReport | None:
            """Every MoE layer of `module` as it really runs (its expert holder's format and class)."""
            return MoeReport.of_layers([
                MoeLayerReport(name=f"{prefix}{name}", quant_method=moe.quant_method_name,
                               expert_weight_format=moe.expert_format, runner="embedded-torch")
                for name, moe in module.named_modules() if isinstance(moe, MoE)])

        models = {
            "target": ModelReport(model_class=type(self.model).__name__, lm_head=head_report(self.model.lm_head),
                                  moe=moe_report(self.model.layers, "layers."))
        }
        spec = SpeculativeReport()
        if self.draft is not None:
            models["draft"] = ModelReport(
                model_class=self.draft.model_class,
                lm_head=head_report(self.draft.lm_head, shared=self.draft.lm_head is self.model.lm_head),
                moe=moe_report(self.draft.nextn.decoder, "mtp.decoder."),
            )
            c = self.config
            spec = SpeculativeReport(
                algorithm=c.speculative_algorithm.upper(),
                num_steps=c.speculative_num_steps,
                eagle_topk=c.speculative_eagle_topk,
                num_draft_tokens=c.num_draft_tokens,
                draft_model_path=c.speculative_draft_model_path,
            )
        device = str(self.device) if self.device.type == "cpu" else f"cuda:{self.device.index or 0}"
        return ActivationReport(engine="embedded", engine_version=ENGINE_VERSION, device=device, models=models, speculative=spec, notes=list(self.notes))

    # ---------------------------------------------------------------- internals

    @staticmethod
    def _validate(c: EngineConfig) -> None:
        problems = c.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def _quantize_moe(self, model, fmt: str, model_path: str) -> None:
        from sparkit.engines.embedded.checkpoint import checkpoint_weights
        from sparkit.engines.embedded.model import MoE

        stored = checkpoint_weights(model_path)
        if stored != "bf16":
            # A quantised export: its experts already hold the checkpoint's values; quantising them
            # again in another scheme would serve numbers the checkpoint does not have.
            if fmt != stored:
                raise LaunchError(f"{model_path} stores its experts as {stored} (config.json quantization_config); "
                                  f"--expert-weights {fmt} would quantise them again",
                                  hint=f"use --expert-weights {stored} (the recipe's stack.weights: {stored})")
            if self.config.debug_corrupt_expert_dequant:
                raise LaunchError(f"--debug-corrupt-expert-dequant corrupts the engine's own fp8 quantisation, and "
                                  f"{model_path} is quantised already",
                                  hint="serve the export with the damaged scale instead (sparkit:tiny-ling@fp8+damaged-scale)")
        for module in model.modules():
            if isinstance(module, MoE):
                module.quantize_experts(fmt, self.dtype, corrupt_expert_index=self.config.debug_corrupt_expert_dequant,
                                        from_checkpoint=stored != "bf16")
                for holder in (module.experts_gate_up, module.experts_down):
                    for name, tensor in holder.tensors().items():
                        setattr(holder, name, tensor.to(self.device))
                    if hasattr(holder, "packed"):
                        holder.weight = holder.packed
                    if self.config.expert_dequant == "load":
                        holder.cache_decoded()


class _Request:
    """State of one generation: committed tokens, RNG, finish rules."""

    def __init__(self, engine: EmbeddedEngine, prompt: list[int], params: SamplingParams, generator,
                 logprobs: LogprobRequest | None = None):
        self.engine, self.params, self.generator = engine, params, generator
        self.want = logprobs
        self.seq = prompt
        self.prompt_len = len(prompt)
        self.greedy = _is_greedy(params)
        self.stop_ids = set(params.stop_token_ids or [])
        if not params.ignore_eos:
            self.stop_ids.add(engine.model_config.eos_token_id)
        self.max_new = params.max_new_tokens if params.max_new_tokens is not None else engine.context_length
        self.device = engine.device
        from sparkit.engines.embedded.logits import LogitRules

        # penalties, min_new_tokens, grammar, logit_bias (min_new_tokens holds back EOS even under ignore_eos)
        self.rules = LogitRules(params, engine.vocab_limit, set(params.stop_token_ids or []) | {engine.model_config.eos_token_id},
                                engine.device)

    @property
    def generated(self) -> int:
        return len(self.seq) - self.prompt_len

    def pick(self, logits) -> int:
        """A token from one row of logits the request's rules have already processed."""
        from sparkit.engines.embedded.profiling import span
        from sparkit.engines.embedded.speculative import logits_to_probs, sample

        with span("sampling"):
            if self.greedy:
                return int(logits.argmax())
            return int(sample(logits_to_probs(logits[None], self.params), self.generator)[0])

    def commit(self, tokens: list[int]) -> tuple[list[int], dict | None]:
        """Append tokens up to the first finish condition; returns (committed, finish_reason).
        SGLang's order: a stop token, then the length, then a grammar that has terminated."""
        out = []
        self.rules.begin_commit()
        for t in tokens:
            out.append(t)
            self.seq.append(t)
            self.rules.accept(t)
            if t in self.stop_ids:
                return out, {"type": "stop", "matched": t}
            if self.generated >= self.max_new:
                return out, {"type": "length", "length": self.max_new}
            if self.rules.terminated:
                return out, {"type": "stop", "matched": t}
        if len(self.seq) >= self.engine.context_length:
            return out, {"type": "length", "length": self.generated}
        return out, None

    def _target_logits(self, hidden):
        from sparkit.engines.embedded.profiling import span

        # ids past the tokenizer's vocabulary (padding rows of the head) are never produced
        with span("lm_head"):
            return self.engine.model.logits(hidden)[0, :, : self.engine.vocab_limit].float()

    def _prefill(self):
        model, cache = self.engine.model, self.engine._target_cache
        cache.length = 0
        ids = torch.tensor([self.seq], device=self.device)
        hidden = model.forward_hidden(ids, cache, 0)
        cache.length = ids.shape[1]
        return hidden

    # -- logprobs: the target's, from the logits each committed token was chosen from

    def _output_logprobs(self, logits, tokens: list[int]) -> TokenLogprobs | None:
        """logits [>= len(tokens), V]: row i is where tokens[i] was chosen. Greedy: log_softmax of
        the logits; sampling: of logits / temperature (SGLang's sampler returns those)."""
        if self.want is None or not tokens:
            return None
        from sparkit.engines.embedded.speculative import GREEDY_EPS

        rows = logits[: len(tokens)]
        if not self.greedy:
            rows = rows / max(self.params.temperature, GREEDY_EPS)
        # a token the grammar or min_new_tokens forbids has logprob -inf: JSON has no such number,
        # so it reads as float32's lowest (SGLang clamps the same way)
        rows = rows.log_softmax(-1).clamp(min=torch.finfo(torch.float32).min)
        return _pick_logprobs(rows, tokens, self.want.top)

    def _input_logprobs(self, hidden) -> TokenLogprobs | None:
        """The prompt's logprobs from position want.input_start on, from the prefill's hidden
        states (raw logits, as SGLang's input logprobs); position 0 has none."""
        if self.want is None or self.want.input_start is None:
            return None
        start, n = self.want.input_start, self.prompt_len
        out = TokenLogprobs(top=[] if self.want.top else None)
        if start >= n:
            return out
        if start == 0:
            out.token_ids.append(self.seq[0])
            out.logprobs.append(None)
            if out.top is not None:
                out.top.append(None)
        first = max(start, 1)
        if first < n:
            rows = self._target_logits(hidden[:, first - 1 : n - 1]).log_softmax(-1)
            out.extend(_pick_logprobs(rows, self.seq[first:n], self.want.top))
        return out

    def _prefill_only(self, cancelled) -> Iterator[StepOutput]:
        """max_new_tokens 0: nothing to generate; the prompt still runs when its logprobs are
        wanted (an eval harness scoring a text)."""
        finish = {"type": "length", "length": 0}
        inputs = None
        if self.want is not None and self.want.input_start is not None and not cancelled():
            with torch.inference_mode():
                inputs = self._input_logprobs(self._prefill())
        yield StepOutput([], verify_step=False, finished=True, finish_reason=finish, input_logprobs=inputs)

    def plain(self, cancelled) -> Iterator[StepOutput]:
        engine = self.engine
        if self.max_new == 0:
            yield from self._prefill_only(cancelled)
            return
        if cancelled():
            yield _aborted()
            return
        with torch.inference_mode():
            hidden = self._prefill()
            inputs = self._input_logprobs(hidden)
            logits = self.rules.rows(self._target_logits(hidden[:, -1:]))
            token = self.pick(logits[-1])
        while True:
            committed, finish = self.commit([token])
            yield StepOutput(committed, verify_step=False, finished=finish is not None, finish_reason=finish,
                             logprobs=self._output_logprobs(logits, committed), input_logprobs=inputs)
            inputs = None
            if finish is not None:
                return
            if cancelled():
                yield _aborted()
                return
            with torch.inference_mode():
                cache = engine._target_cache
                pos = cache.length
                hidden = engine.model.forward_hidden(torch.tensor([[token]], device=self.device), cache, pos)
                cache.length = pos + 1
                logits = self.rules.rows(self._target_logits(hidden))
                token = self.pick(logits[-1])

    def speculative(self, cancelled) -> Iterator[StepOutput]:
        from sparkit.engines.embedded.speculative import NextnDrafter, logits_to_probs, verify_greedy, verify_rejection

        engine = self.engine
        k = engine.num_steps
        if self.max_new == 0:
            yield from self._prefill_only(cancelled)
            return
        if cancelled():
            yield _aborted()
            return
        drafter = NextnDrafter(engine.draft, k, engine._draft_cache)
        drafter.reset()
        with torch.inference_mode():
            hidden = self._prefill()
            inputs = self._input_logprobs(hidden)
            first_logits = self.rules.rows(self._target_logits(hidden[:, -1:]))
            token = self.pick(first_logits[-1])
        committed, finish = self.commit([token])
        yield StepOutput(committed, verify_step=False, finished=finish is not None, finish_reason=finish,
                         logprobs=self._output_logprobs(first_logits, committed), input_logprobs=inputs)
        if finish is not None:
            return
        with torch.inference_mode():
            # MTP over the prompt: position t gets the target hidden at t and the token at t+1
            next_ids = torch.tensor([self.seq[1:]], device=self.device)
            drafter.extend(hidden, next_ids, 0)
        target_cache = engine._target_cache
        while True:
            if cancelled():
                yield _aborted()
                return
            m = len(self.seq) - 1  # position of the last committed token (not yet in the target cache)
            if m + k + 1 > engine.context_length:
                yield StepOutput([], verify_step=False, finished=True, finish_reason={"type": "length", "length": self.generated})
                return
            with torch.inference_mode():
                if self.greedy:
                    drafts, _ = drafter.propose(lambda lg: int(lg.argmax()), engine.vocab_limit)
                else:
                    drafts, draft_logits = drafter.propose(self.pick_from_draft, engine.vocab_limit)
                ids = torch.tensor([[self.seq[-1]] + drafts], device=self.device)
                hidden = engine.model.forward_hidden(ids, target_cache, m)
                # [k+1, V]: row j as plain decoding would see it after drafts[:j] (logits.py)
                logits = self.rules.rows(self._target_logits(hidden), drafts)
                if self.greedy:
                    accepted, bonus = verify_greedy(drafts, logits.argmax(dim=-1).tolist())
                else:
                    q = logits_to_probs(torch.stack(draft_logits), self.params)
                    p = logits_to_probs(logits, self.params)
                    accepted, bonus = verify_rejection(drafts, q, p, self.generator)
                new_tokens = drafts[:accepted] + [bonus]
                target_cache.length = m + accepted + 1
            committed, finish = self.commit(new_tokens)
            engine.total_verify_steps += 1
            engine.total_committed_in_verify += len(committed)
            # the logprobs of what was committed are the target's verify logits at those positions
            # (row j chose token j), never the draft's
            yield StepOutput(committed, verify_step=True, num_accepted_drafts=len(committed) - 1 if finish else accepted,
                             num_proposed_drafts=k, finished=finish is not None, finish_reason=finish,
                             logprobs=self._output_logprobs(logits, committed))
            if finish is not None:
                return
            with torch.inference_mode():
                drafter.extend(hidden[:, : accepted + 1], torch.tensor([new_tokens], device=self.device), m)

    def pick_from_draft(self, logits) -> int:
        from sparkit.engines.embedded.speculative import logits_to_probs, sample

        return int(sample(logits_to_probs(logits[None].float(), self.params), self.generator)[0])


def _pick_logprobs(rows, tokens: list[int], top: int) -> TokenLogprobs:
    """rows [n, V] of logprobs: row i's value at tokens[i], and its `top` best (value, id)."""
    index = torch.tensor(tokens, device=rows.device).view(-1, 1)
    chosen = rows.gather(1, index).view(-1).tolist()
    best = None
    if top:
        values, ids = rows.topk(min(top, rows.shape[-1]), dim=-1)
        best = [list(zip(v, i)) for v, i in zip(values.tolist(), ids.tolist())]
    return TokenLogprobs(list(tokens), chosen, best)


def _aborted() -> StepOutput:
    return StepOutput([], verify_step=False, finished=True, finish_reason={"type": "abort"})


def _is_greedy(params: SamplingParams) -> bool:
    from sparkit.engines.embedded.speculative import is_greedy

    return is_greedy(params)


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LaunchError(f"device {device!r} requested but CUDA is not available", hint="use --device cpu or auto")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise LaunchError(f"unknown device {device!r}", hint="use auto, cpu or cuda")
    return torch.device(device)


def _resolve_dtype(dtype: str | None, device: torch.device):
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise LaunchError(f"unknown dtype {dtype!r}", hint="use bfloat16 or float32")
    return table[dtype]


def _make_generator(device: torch.device, seed: int):
    g = torch.Generator(device=device)
    g.manual_seed(int(seed) % (2**63))
    return g
