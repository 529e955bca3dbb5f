"""EmbeddedEngine: inference of sparkit's built-in models, tiny-ling and tiny-ling-v3 (chunked
prefill, cached decode, sampling, NEXTN and DSpark speculative decoding) speaking api.py's types
(SamplingParams, StepOutput, ...), for several requests at once: the server's scheduler (worker.py)
opens a Sequence per request, prefills it chunk by chunk and decodes every running sequence in one
step; `generate` drives one sequence alone through the same calls. A sequence decoded among others
gets the bits it gets alone (batching.py says how, and checks it at load). A model brings its own
caches (`new_pool`: one per running sequence; `cache.length = n` rolls one back to n committed
tokens) and its NextN draft (`nextn_draft`). The server calls the engine from one thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from sparkit.engines.embedded import batching
from sparkit.engines.embedded.api import CancelFlag, LogprobRequest, SamplingParams, StepOutput
from sparkit.engines.embedded.sequence import Sequence
from sparkit.engines.embedded.settings import EngineConfig  # noqa: F401 (the engine's configuration, declared there)
from sparkit.errors import LaunchError
from sparkit.models.profiler_spans import span

ENGINE_VERSION = "0.1.0"


class EmbeddedEngine:
    def __init__(self, config: EngineConfig):
        from sparkit.models.tiny_ling.tokenizer import load_tokenizer

        self.config = config
        self._validate(config)
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        self.model_path = str(Path(config.model_path))
        self.model_name = config.served_model_name or Path(config.model_path).name
        self.notes: list[str] = []
        self.load_seconds: dict[str, float] = {}

        started = time.monotonic()
        try:
            self.tokenizer = load_tokenizer(config.model_path)
        except Exception as exc:
            raise LaunchError(f"cannot load the tokenizer from {config.model_path}: {exc}") from None
        self.model = self._load_target(config)
        self.vocab_limit = min(len(self.tokenizer), self.model_config.vocab_size)
        self.context_length = min(config.context_length or self.model_config.max_position_embeddings, self.model_config.max_position_embeddings)
        self.load_seconds["target"] = time.monotonic() - started

        self.speculative = config.speculative_algorithm is not None
        self.num_steps = config.speculative_num_steps if self.speculative else 0
        self.draft = None  # NEXTN's draft
        self.dspark = None  # DSpark's (sparkit.engines.embedded.dspark.DSparkDrafter: each sequence gets its own)
        if config.dspark:
            self._load_dspark(config.speculative_draft_model_path)
        elif self.speculative:
            started = time.monotonic()
            self.draft = self._load_draft(config)
            self.load_seconds["draft"] = time.monotonic() - started
        self.max_running = config.max_running_requests
        # one cache per request running at once (tiny-ling: slots of one mapped buffer, written as far
        # as its sequence reaches; tiny-ling-v3: its KDA state and MLA cache made per sequence)
        self._target_pool = self.model.new_pool(self.max_running, self.context_length, self.dtype, self.device)
        self._draft_pool = (self.draft.new_pool(self.max_running, self.context_length, self.dtype, self.device)
                            if self.draft is not None else None)
        started = time.monotonic()
        self.rows_check = batching.check_rows(self, self.max_running)
        self.rows_plan = self.rows_check.plan
        self.load_seconds["batch_check"] = time.monotonic() - started
        self.notes.append(f"Batching: at most {self.max_running} running requests; {self.rows_check.describe()}.")
        self._generator = _make_generator(self.device, config.seed)
        # accept-length bookkeeping for the server's metrics (totals since start)
        self.total_verify_steps = 0
        self.total_committed_in_verify = 0
        self._grammar_compiler = None
        self._grammar_lock = threading.Lock()

    def _load_target(self, config: EngineConfig):
        from sparkit.models import checkpoint
        from sparkit.models.tiny_ling import quant

        self.model_config, model = checkpoint.load_checkpoint(config.model_path)
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
        return model

    def _load_draft(self, config: EngineConfig):
        from sparkit.models import checkpoint
        from sparkit.models.tiny_ling import quant

        model = self.model
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
        return model.nextn_draft(nextn, draft_head)

    @property
    def grammar_compiler(self):
        """xgrammar's compiler over this tokenizer (grammar.py), built on first use, for callers in
        this process (the tests); the HTTP server compiles in its own child processes instead
        (grammar_pool.py), where a compile can be stopped."""
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
        """One request alone: prefill, then decode steps of it alone (the scheduler's calls). Yields
        one StepOutput per step; the last has finished=True.

        The request's penalties, min_new_tokens, grammar and logit_bias (logits.py) shape the
        logits each token is chosen from. Logprobs are the target model's, whatever drafted the
        tokens: log_softmax of those logits (divided by the temperature when sampling, as SGLang's
        sampler returns them); prompt logprobs are of the raw logits (SGLang's input logprobs).
        Stops early (finish_reason {"type": "abort"}) as soon as `cancelled()` is true, freeing all
        per-request state (KV cache) before returning. Stop strings are matched by the server on
        decoded text; stop_token_ids and EOS by the engine."""
        self.check_request(input_ids, params, logprobs)
        # Validation above runs at call time (this method is not a generator); steps run lazily,
        # and the KV cache slot is taken when they start.
        return self._alone(list(input_ids), params, cancelled, logprobs)

    def _alone(self, input_ids: list[int], params: SamplingParams, cancelled: CancelFlag,
               logprobs: LogprobRequest | None) -> Iterator[StepOutput]:
        if cancelled():
            yield _aborted()
            return
        seq = self.open(input_ids, params, logprobs)
        try:
            out = None
            while out is None:
                out = self.prefill(seq)
                if out is None and cancelled():
                    yield _aborted()
                    return
            yield out
            while not out.finished:
                if cancelled():
                    yield _aborted()
                    return
                out = self.decode([seq])[0]
                yield out
        finally:
            self.release(seq)

    # ---------------------------------------------------------------- the scheduler's calls

    @property
    def free_slots(self) -> int:
        return self.max_running - self._target_pool.in_use

    def check_request(self, input_ids: list[int], params: SamplingParams, logprobs: LogprobRequest | None = None) -> None:
        """ValueError naming what is wrong with a request this engine cannot serve."""
        if not input_ids:
            raise ValueError("input_ids is empty")
        if len(input_ids) >= self.context_length:
            raise ValueError(f"the prompt has {len(input_ids)} tokens; the context length is {self.context_length}")
        if params.max_new_tokens is not None and params.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        bad = [t for t in input_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.model_config.vocab_size})")
        if logprobs is not None and logprobs.input_start is not None and not 0 <= logprobs.input_start <= len(input_ids):
            raise ValueError(f"logprob_start_len {logprobs.input_start} is outside the prompt (0..{len(input_ids)})")

    def _load_dspark(self, path: str) -> None:
        """The DSpark draft at `path`, sharing the target's embedding and lm_head modules."""
        from sparkit.engines.embedded.dspark import DSparkDrafter, load_dspark_draft

        started = time.monotonic()
        draft = load_dspark_draft(path, self.model, self.model_config, self.dtype, self.device)
        block = self.config.speculative_dspark_block_size
        if block is not None and block != draft.config.block_size:
            # SGLang drafts with the flag's block size and warns; a draft runs best at the one it
            # was trained for, and the startup check compares the two.
            self.notes.append(f"DSpark gamma mismatch: using block size {block} (--speculative-dspark-block-size) "
                              f"but the draft config's block_size is {draft.config.block_size}.")
            draft.config.block_size = block
        self.dspark = DSparkDrafter(draft, None)
        self.num_steps = 1
        self.load_seconds["draft"] = time.monotonic() - started

    def open(self, input_ids: list[int], params: SamplingParams, logprobs: LogprobRequest | None = None) -> Sequence:
        """A sequence for a request, holding a KV cache slot (and the draft's) until `release`.
        Raises ValueError for a request check_request refuses, RuntimeError when every slot is taken."""
        from sparkit.engines.embedded.speculative import NextnDrafter

        self.check_request(input_ids, params, logprobs)
        generator = _make_generator(self.device, params.seed) if params.seed is not None else self._generator
        target = self._target_pool.acquire()
        draft_cache = drafter = None
        if self.dspark is not None:
            drafter = self.dspark.for_sequence(self.context_length, self.dtype, self.device)
        elif self.draft is not None:
            draft_cache = self._draft_pool.acquire()
            drafter = NextnDrafter(self.draft, self.num_steps, draft_cache)
        return Sequence(self, list(input_ids), params, generator, logprobs, target, draft_cache, drafter)

    def release(self, seq: Sequence) -> None:
        """Give a sequence's KV cache slots back (it can do nothing more); idempotent."""
        seq.finished = True
        for pool, cache in ((self._target_pool, seq.target_cache), (self._draft_pool, seq.draft_cache)):
            if cache is not None:
                pool.release(cache)
        seq.target_cache = seq.draft_cache = None
        if self.dspark is not None:
            seq.drafter = None  # its draft context cache goes with it

    def chunk_size(self) -> int:
        return self.config.chunked_prefill_size

    def prefill(self, seq: Sequence) -> StepOutput | None:
        """Prefill the sequence's next prompt chunk (Sequence.next_chunk tokens); None while the
        prompt is not all in, then the step that commits the first token (finished at once for
        max_new_tokens 0, whose prompt runs only when its logprobs are wanted)."""
        if self.dspark is not None:
            from sparkit.engines.embedded.dspark import dspark_prefill

            return dspark_prefill(self, seq)
        if seq.prefill_only and (seq.want is None or seq.want.input_start is None):
            return seq.ended({"type": "length", "length": 0})
        begin = seq.prefilled
        end = begin + seq.next_chunk(self.chunk_size())
        cache = seq.target_cache
        with torch.inference_mode():
            hidden = self.model.forward_hidden(torch.tensor([seq.seq[begin:end]], device=self.device), cache, begin)
            cache.length = seq.prefilled = end
            seq.add_input_logprobs(self._target_logits, hidden, begin)
            if seq.drafter is not None and end < seq.prompt_len:
                # the draft over this chunk: position t gets the target hidden at t and the token at t+1
                seq.drafter.extend(hidden, torch.tensor([seq.seq[begin + 1 : end + 1]], device=self.device), begin)
            if end < seq.prompt_len:
                return None
            if seq.prefill_only:
                return seq.ended({"type": "length", "length": 0})
            logits = seq.rules.rows(self._target_logits(hidden[:, -1:]))
            out = seq.first_output(logits, seq.pick(logits[-1]))
            if seq.drafter is not None and not out.finished:
                seq.drafter.extend(hidden, torch.tensor([seq.seq[begin + 1 :]], device=self.device), begin)
        return out

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        """One decode step (or speculative round) for each sequence, all computed together; a
        sequence's step is what it would be alone (DSpark: one verify step of each in turn)."""
        if not seqs:
            return []
        with torch.inference_mode():
            if self.dspark is not None:
                from sparkit.engines.embedded.dspark import dspark_decode

                return [dspark_decode(self, seq) for seq in seqs]
            if self.draft is None:
                return self._decode_plain(seqs)
            from sparkit.engines.embedded.speculative import decode_round

            return decode_round(self, seqs)

    def _decode_plain(self, seqs: list[Sequence]) -> list[StepOutput]:
        starts = [len(seq.seq) - 1 for seq in seqs]  # the last committed token is not in the cache yet
        hidden = self.target_forward([seq.target_cache for seq in seqs], starts, [[seq.seq[-1]] for seq in seqs])
        logits = [seq.rules.rows(rows) for seq, rows in zip(seqs, self.target_logits(hidden))]
        tokens = self.choose(seqs, logits)
        outs = []
        for seq, start, rows, token in zip(seqs, starts, logits, tokens):
            seq.target_cache.length = start + 1
            committed, finish = seq.commit([token])
            outs.append(StepOutput(committed, verify_step=False, finished=finish is not None, finish_reason=finish,
                                   logprobs=seq.output_logprobs(rows, committed)))
        return outs

    def choose(self, seqs: list[Sequence], logits: list) -> list[int]:
        """Each sequence's token from the last row of its processed logits: the greedy ones in one argmax."""
        tokens: list[int | None] = [None] * len(seqs)
        greedy = [i for i, seq in enumerate(seqs) if seq.greedy]
        if greedy:
            with span("sampling"):
                best = torch.stack([logits[i][-1] for i in greedy]).argmax(dim=-1).tolist()
            for i, token in zip(greedy, best):
                tokens[i] = token
        for i, seq in enumerate(seqs):
            if tokens[i] is None:
                tokens[i] = seq.pick(logits[i][-1])
        return tokens  # type: ignore[return-value]

    # ---------------------------------------------------------------- forwards over several sequences

    def target_forward(self, caches: list, starts: list[int], ids: list[list[int]]) -> list:
        """The target's normed hidden states [n_i, H] for each sequence's ids at its position: one
        forward for all (batching.RowsPlan), or one each with the batch-1 kernels."""
        if self.rows_plan is not None:
            return batching.target_rows(self.model, self.rows_plan, caches, starts, ids)
        return [self.model.forward_hidden(torch.tensor([x], device=self.device), cache, start)[0]
                for cache, start, x in zip(caches, starts, ids)]

    def draft_forward(self, caches: list, starts: list[int], hiddens: list, ids: list[list[int]],
                      last_only: bool = False) -> list:
        """The draft's hidden states for each sequence (target hidden rows [n_i, H] and the ids after them)."""
        if self.rows_plan is not None:
            return batching.draft_rows(self.draft, self.rows_plan, caches, starts, hiddens, ids, last_only)
        return [self.draft.forward_hidden(h[None], torch.tensor([x], device=self.device), cache, start, last_only)[0]
                for cache, start, h, x in zip(caches, starts, hiddens, ids)]

    def target_logits(self, hiddens: list) -> list:
        """float32 logits [n_i, vocab_limit] of each sequence's target hidden rows."""
        with span("lm_head"):
            return self._logits(self.model.lm_head, hiddens)

    def draft_logits(self, hiddens: list) -> list:
        return self._logits(self.draft.lm_head, hiddens)

    def _logits(self, head, hiddens: list) -> list:
        # ids past the tokenizer's vocabulary (padding rows of the head) are never produced
        if self.rows_plan is not None:
            return [rows[:, : self.vocab_limit] for rows in batching.logits_rows(head, self.rows_plan, hiddens)]
        return [head(h[None])[0, :, : self.vocab_limit].float() for h in hiddens]

    def _target_logits(self, hidden):
        """A prefill's logits ([1, n, H] hidden states, batch-1 kernels: a prefill is always alone)."""
        with span("lm_head"):
            return self.model.logits(hidden)[0, :, : self.vocab_limit].float()

    def server_args(self) -> dict:
        """The resolved server args: what the settings decide, and what loading resolved (DSpark:
        the block size of the draft, and SGLang's resolution of it: one step, topk 1, block + 1
        tokens verified)."""
        dspark = {}
        if self.dspark is not None:
            block = self.dspark.block_size
            dspark = {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": block + 1,
                      "speculative_dspark_block_size": block}
        return {
            **self.config.resolved(),
            **dspark,
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_name,
            "device": self.device.type,
            "dtype": str(self.dtype).replace("torch.", ""),
            "context_length": self.context_length,
            # how requests running together are computed (batching.py): one forward padded to
            # min_rows, or one forward each with the batch-1 kernels and why
            "batched_forward": ({"together": True, "min_rows": self.rows_plan.min_rows, "checked_rows": self.rows_plan.max_rows,
                                 "fused_moe": self.rows_plan.fused_moe}
                                if self.rows_plan is not None else {"together": False, "why": self.rows_check.why}),
        }

    def activation_report(self):
        from sparkit.engines.activation_report import (
            ActivationReport,
            EmbeddingReport,
            LmHeadReport,
            ModelReport,
            MoeLayerReport,
            MoeReport,
            SpeculativeReport,
        )
        from sparkit.models.tiny_ling.model import MoE

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
        if self.dspark is not None:
            draft = self.dspark.draft
            models["draft"] = ModelReport(
                model_class=draft.model_class,
                lm_head=head_report(draft.lm_head, shared=draft.lm_head is self.model.lm_head),
                embed_tokens=EmbeddingReport(module_id=id(draft.embed_tokens),
                                             shared_with_target=draft.embed_tokens is self.model.embed_tokens))
            block = self.dspark.block_size
            spec = SpeculativeReport(algorithm="DSPARK", num_steps=1, eagle_topk=1, num_draft_tokens=block + 1,
                                     draft_model_path=self.config.speculative_draft_model_path, block_size=block)
        elif self.draft is not None:
            models["draft"] = ModelReport(
                model_class=self.draft.model_class,
                lm_head=head_report(self.draft.lm_head, shared=self.draft.lm_head is self.model.lm_head),
                moe=moe_report(self.draft.nextn.decoder, "mtp.decoder."),
                embed_tokens=EmbeddingReport(module_id=id(self.draft.embed_tokens),
                                             shared_with_target=self.draft.embed_tokens is self.model.embed_tokens),
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
        from sparkit.models.checkpoint import checkpoint_weights
        from sparkit.models.tiny_ling.model import MoE

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


def _aborted() -> StepOutput:
    return StepOutput([], verify_step=False, finished=True, finish_reason={"type": "abort"})


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
