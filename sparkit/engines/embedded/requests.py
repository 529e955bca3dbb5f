"""Request parsing for the embedded server's SGLang/OpenAI/Ollama HTTP API: what a valid request is.

Pure data in, data out: no HTTP framework, no torch. routes.py owns the sockets; the response
shapes are responses.py's. Both can be unit-tested without starting anything.

Every field SGLang 0.5.23's request types define (GenerateReqInput and its API contract,
sampling_params, the OpenAI protocol models) and every field the OpenAI API defines is declared
here, once: either honoured (a field of the pydantic model) or listed in the model's `NEUTRAL`
table with the values that mean "off" (what this engine does anyway). A neutral value is
accepted; any other value is a 400 naming the field and the values it can take, rather than a
silently ignored knob. tests/embedded_server/test_api_fields.py reads the installed sglang and
openai packages and fails on a field declared nowhere, so a new SGLang field shows up there.

A key no request type defines follows SGLang: ignored at the top level of /generate and of the
OpenAI bodies (SGLang's GenerateRequest contract and its pydantic models ignore unknown keys; the
names come back in the `x-sparkit-ignored-fields` response header), rejected inside
sampling_params (SGLang's contract rejects unknown sampling keys), as a 400 naming the key.

Before validation the body itself is bounded: NaN/Infinity, numbers that overflow to infinity,
nesting deeper than MAX_JSON_DEPTH and strings holding unpaired UTF-16 surrogates are 400s naming
where they are (each used to be a 500 further in).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from sparkit.engines.embedded.responses import error_body

# /generate's default when sampling_params.max_new_tokens is absent (SGLang's default).
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128
# OpenAI's /v1/completions default for max_tokens.
DEFAULT_COMPLETION_MAX_TOKENS = 16
# Deeper JSON is refused before it reaches anything recursive (json, pydantic, the encoder):
# no request of either API nests more than a handful of levels.
MAX_JSON_DEPTH = 32
# Above this, sampling is uniform noise for any model whose logits are O(10); SGLang has no bound,
# OpenAI's is 2. A bound at all is what keeps `1e308` from being taken as a setting.
MAX_TEMPERATURE = 100.0
# OpenAI's bound on n. A batch (prompts x n) is bounded too, before anything is tokenised: each
# item is a queued job. SGLang has neither bound; no client of either API comes near them.
MAX_N = 128
MAX_BATCH_ITEMS = 512
# float32 holds logits: a bias past this (3.5e38 overflowed the cast and was a 500) can only mean
# "always" or "never", which +-1e10 already means at any temperature. OpenAI's bound is 100.
MAX_LOGIT_BIAS = 1e10
# SGLang takes any repetition_penalty in (0, 2]; dividing a logit by 1e-308 gives infinity (then
# NaN probabilities). At 1e-6 a logit of 100 becomes 1e8, still finite and far past any other.
MIN_REPETITION_PENALTY = 1e-6


class ApiError(Exception):
    """A request the server refuses: its body is SGLang's for the route (`body()`), with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def body(self, *, nested: bool = True) -> dict[str, Any]:
        return error_body(self.status, self.message, type=self.type, param=self.param, nested=nested)



# -- declared fields ---------------------------------------------------------------------------

# A NEUTRAL entry whose every value is harmless here (routing hints, labels, cache salts...).
ANY = "any"
# A NEUTRAL entry that stock SGLang accepts and that means nothing for this engine's model (a
# reasoning effort for a model that does not reason, a storage or service-tier hint): any value is
# accepted, and one that is not "off" is named in x-sparkit-ignored-fields (issue 37, item 5).
IGNORED = "ignored"


def is_neutral(value: Any, allowed: Any) -> bool:
    """None and empty containers are always "off"; else one of the declared values (a bool is
    not taken for 0 or 1)."""
    if allowed in (ANY, IGNORED) or value is None or (isinstance(value, (list, dict)) and not value):
        return True
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed)


def _neutral_problem(name: str, value: Any, allowed: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False, default=str)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    takes = "".join(f" or {json.dumps(a)}" for a in allowed)
    return f"{name}={shown} is not supported by the embedded engine (it takes only null{takes})"


class _Request(BaseModel):
    """A request body: declared fields honoured, NEUTRAL ones checked and dropped, unknown keys
    handled as SGLang handles them at this level (UNKNOWN)."""

    model_config = ConfigDict(extra="forbid")
    NEUTRAL: ClassVar[dict[str, Any]] = {}
    UNKNOWN: ClassVar[Literal["ignore", "reject"]] = "reject"

    @model_validator(mode="before")
    @classmethod
    def _declared_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        kept, problems = {}, []
        for key, value in data.items():
            if key in cls.model_fields:
                kept[key] = value
            elif key in cls.NEUTRAL:
                if not is_neutral(value, cls.NEUTRAL[key]):
                    problems.append(_neutral_problem(key, value, cls.NEUTRAL[key]))
                elif cls.NEUTRAL[key] == IGNORED and value not in (None, False, "", [], {}) and isinstance(info.context, dict):
                    info.context.setdefault("ignored", []).append(key)
            elif cls.UNKNOWN == "ignore":
                if isinstance(info.context, dict):
                    info.context.setdefault("ignored", []).append(key)
            else:
                kept[key] = value  # extra="forbid" names it
        if problems:
            raise ValueError("; ".join(problems))
        return kept


class _Lenient(_Request):
    UNKNOWN: ClassVar[Literal["ignore", "reject"]] = "ignore"


# Values SGLang's OpenAI sampling fields and the OpenAI API share.
_SAMPLING_NEUTRAL: dict[str, Any] = {
    "stop_regex": (),
    "custom_params": (),
    "watermark": (),
}


class _SamplingFields(BaseModel):
    """The sampling fields every API shares, with SGLang's ranges (SamplingParams.verify)."""

    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE, description="0 = greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, ge=MIN_REPETITION_PENALTY, le=2.0)
    n: int | None = Field(None, ge=1, le=MAX_N)
    logit_bias: dict[str, float] | None = None
    regex: str | None = None
    ebnf: str | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            try:
                int(key)
            except ValueError:
                raise ValueError(f"logit_bias keys are token ids, not {key[:40]!r}") from None
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values must be within [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] (a bias of "
                                 f"{MAX_LOGIT_BIAS:g} already makes a token certain or impossible), got {bias:g}")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    @property
    def samples(self) -> int:
        return self.n or 1

    def grammar_fields(self) -> dict[str, str | None]:
        """The request's grammar constraint by SGLang's sampling name (at most one may be set)."""
        return {"json_schema": getattr(self, "json_schema", None), "regex": self.regex, "ebnf": self.ebnf}

    def constraint_field(self) -> str:
        """The request field that set the constraint (what a grammar error names)."""
        given = self.constraint()
        return given[0] if given else "json_schema"

    def constraint(self) -> tuple[str, str] | None:
        """(kind, source) of the output constraint, or None. SGLang: an empty string is unset."""
        given = [(kind, source) for kind, source in self.grammar_fields().items() if source]
        if len(given) > 1:
            raise ValueError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
        return given[0] if given else None

    @model_validator(mode="after")
    def _one_constraint(self):
        self.constraint()
        return self

    def sampling_kwargs(self) -> dict[str, Any]:
        """The engine's SamplingParams fields this request decides (SGLang's defaults for unset ones)."""
        return {
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "min_p": self.min_p or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "presence_penalty": self.presence_penalty or 0.0,
            "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
            "logit_bias": {int(k): v for k, v in (self.logit_bias or {}).items()},
            "stop": self.stop_list(),
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
        }


class GenerateSamplingParams(_SamplingFields, _Request):
    """/generate's sampling_params: SGLang's API contract (sglang.api.v1.SamplingParams), whose
    unknown keys are rejected."""

    NEUTRAL: ClassVar[dict[str, Any]] = {
        **_SAMPLING_NEUTRAL,
        "beam_width": (1,),
        "structural_tag": (),
        "choice": ([],),
        # fast (Rust) tokenizers do not read it; tiny-ling's is one
        "spaces_between_special_tokens": ANY,
        # SGLang sends every N tokens; this engine sends every step: a client sees the same text
        "stream_interval": ANY,
    }
    max_new_tokens: int | None = Field(None, ge=0)
    min_new_tokens: int | None = Field(None, ge=0)
    json_schema: str | None = None
    sampling_seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)

    @model_validator(mode="after")
    def _min_within_max(self):
        if self.min_new_tokens and self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], got {self.min_new_tokens}.")
        return self


@dataclass
class GenerateItem:
    """One prompt of a /generate request, one of its n samples: what becomes one engine job."""

    prompt: str | list[int]
    prompt_index: int
    sampling: GenerateSamplingParams
    rid: str | None
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    sample: int = 0  # which of the prompt's n samples (a seed given is offset by it)


def _per_item(name: str, value: Any, batch: int, samples: int) -> list[Any]:
    """SGLang's normalisation of a per-item field: one value for all, or one per prompt."""
    if not isinstance(value, list):
        return [value] * batch
    if samples > 1:
        raise ValueError(f"Cannot use list {name} with parallel_sample_num > 1")
    if len(value) != batch:
        raise ValueError(f"{name}: a list of {len(value)} for a batch of {batch} prompts")
    return value


class GenerateRequest(_Lenient):
    """SGLang's native /generate body (GenerateReqInput's fields): one prompt, or a batch (a list
    of texts or of token-id lists, with per-item lists of sampling_params, rid and the logprob
    fields), each prompt sampled n times. `items()` is SGLang's normalisation of it."""

    NEUTRAL: ClassVar[dict[str, Any]] = {
        # multimodal, embeddings, LoRA, structured outputs, disaggregation, hidden states
        "input_embeds": (), "image_data": (), "video_data": (), "audio_data": (), "mm_hashes": (),
        "mm_content_hashes": (), "use_audio_in_video": (False,), "video_config": (), "modalities": (),
        "max_dynamic_patch": (), "min_dynamic_patch": (), "image_max_dynamic_patch": (),
        "video_max_dynamic_patch": (), "images_config": (), "mm_processor_kwargs": (),
        "need_wait_for_mm_inputs": (False,), "num_items_assigned": (), "encoder_urls": (),
        "multi_item_delimiter_indices": (), "token_indices_to_pool": (),
        "lora_path": (), "lora_id": (), "custom_logit_processor": (), "positional_embed_overrides": (),
        "watermark": (), "session_id": (), "session_params": (), "kv_hints": (),
        "bootstrap_host": (), "bootstrap_port": (), "bootstrap_room": (), "bootstrap_pair_key": (),
        "decode_tp_size": (), "routed_dp_rank": (0,), "data_parallel_rank": (0,), "disagg_prefill_dp_rank": (0,),
        "http_worker_ipc": (), "background": (False,), "require_reasoning": (False,), "max_thinking_tokens": (),
        "return_hidden_states": (False,), "return_routed_experts": (False,), "routed_experts_start_len": (0,),
        "return_indexer_topk": (False,), "return_bytes": (False,), "return_entropy": (False,),
        "return_prompt_token_ids": (False,), "return_sampling_mask": (False,),
        "token_ids_logprob": (), "sampling_logprobs_mode": ("selected",),
        "return_flat_raw_top_logprobs": (False,), "return_flat_raw_output_top_logprobs": (False,),
        "return_flat_raw_top_logprobs_b64": ANY,  # only read with the flat forms
        # labels, routing and bookkeeping: no effect on what one engine at batch 1 computes
        "log_metrics": ANY, "no_logs": ANY, "custom_labels": ANY, "routing_key": ANY, "conversation_id": ANY,
        "priority": ANY, "extra_key": ANY, "cache_salt": ANY, "external_trace_header": ANY, "received_time": ANY,
    }

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: GenerateSamplingParams | list[GenerateSamplingParams] = Field(default_factory=GenerateSamplingParams)
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    # -1: no prompt logprobs (SGLang's default)
    logprob_start_len: Annotated[int, Field(ge=-1)] | list[Annotated[int, Field(ge=-1)]] = -1
    top_logprobs_num: Annotated[int, Field(ge=0)] | list[Annotated[int, Field(ge=0)]] = 0
    return_text_in_logprobs: bool = False

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("sampling_params", "logprob_start_len", "top_logprobs_num", "return_logprob"):
            if key in data and data[key] is None:
                del data[key]
        return data

    @model_validator(mode="after")
    def _prompts(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of `text` or `input_ids`")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("input_ids cannot be empty.")
        if isinstance(self.text, list) and not self.text:
            raise ValueError("text: an empty batch; give at least one prompt")
        if isinstance(self.sampling_params, list):
            ns = {p.samples for p in self.sampling_params}
            if len(ns) > 1:
                raise ValueError("The parallel_sample_num should be the same for all samples in sample params.")
        self.items()  # the per-item lists fit the batch
        return self

    @property
    def samples(self) -> int:
        params = self.sampling_params
        return (params[0] if isinstance(params, list) and params else params).samples if params else 1

    @property
    def is_single(self) -> bool:
        """SGLang answers one object for one prompt sampled once, a list for anything else."""
        one = isinstance(self.text, str) or (self.input_ids is not None and isinstance(self.input_ids[0], int))
        return one and self.samples == 1

    def prompts(self) -> list[str | list[int]]:
        if self.text is not None:
            return [self.text] if isinstance(self.text, str) else list(self.text)
        return [self.input_ids] if isinstance(self.input_ids[0], int) else list(self.input_ids)

    def items(self) -> list[GenerateItem]:
        """The jobs, in SGLang's order: each prompt's n samples together (prompt-major)."""
        prompts, n = self.prompts(), self.samples
        batch = len(prompts)
        if batch * n > MAX_BATCH_ITEMS:
            raise ValueError(f"{batch} prompts x n={n} is {batch * n} generations; at most {MAX_BATCH_ITEMS} "
                             "per request (send several requests)")
        params = self.sampling_params
        if isinstance(params, list) and len(params) != batch:
            raise ValueError(f"sampling_params: a list of {len(params)} for a batch of {batch} prompts")
        params = params if isinstance(params, list) else [params] * batch
        want = _per_item("return_logprob", self.return_logprob, batch, n)
        start = _per_item("logprob_start_len", self.logprob_start_len, batch, n)
        top = _per_item("top_logprobs_num", self.top_logprobs_num, batch, n)
        if self.is_single:
            rids = [self.rid]
        elif n > 1:  # SGLang gives each sample a fresh id
            rids = [None] * batch
        elif isinstance(self.rid, list):
            if len(self.rid) != batch:
                raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
            if len(set(self.rid)) != len(self.rid):
                raise ValueError(f"Duplicate request IDs detected within the request: {self.rid}")
            rids = list(self.rid)
        else:
            rids = [f"{self.rid}_{i}" if self.rid else None for i in range(batch)]
        return [GenerateItem(prompts[i], i, params[i], rids[i], want[i], start[i], top[i], sample=j)
                for i in range(batch) for j in range(n)]


class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Lenient):
    """A call in an assistant message of the history: its arguments JSON text (OpenAI) or an
    object (Ollama, and SGLang takes either)."""

    name: str
    arguments: str | dict[str, Any] | None = None

    def argument_object(self, where: str) -> dict[str, Any]:
        """The arguments as the chat template renders them (SGLang's parse_tool_call_arguments)."""
        if self.arguments is None or isinstance(self.arguments, dict):
            return self.arguments or {}
        try:
            value = json.loads(self.arguments)
        except ValueError:
            raise ApiError(400, f"{where}: Assistant tool call function.arguments must be valid JSON.",
                           param=where) from None
        if not isinstance(value, dict):
            raise ApiError(400, f"{where}: Assistant tool call function.arguments must be a JSON object.", param=where)
        return value


class ToolCallIn(_Lenient):
    id: str | None = None
    type: str = "function"
    index: int | None = None
    function: FunctionCall


class FunctionDef(_Lenient):
    NEUTRAL: ClassVar[dict[str, Any]] = {"defer_loading": ANY}
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefIn(_Lenient):
    """A tool of the request (SGLang's Tool)."""

    NEUTRAL: ClassVar[dict[str, Any]] = {"defer_loading": ANY}
    type: str = "function"
    function: FunctionDef

    def template_form(self) -> dict[str, Any]:
        """What the chat template renders: the tool as the client sent it, unset keys left out."""
        return self.model_dump(exclude_unset=True)


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    """tool_choice naming one function: {"type": "function", "function": {"name": ...}}."""

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatMessage(_Lenient):
    NEUTRAL: ClassVar[dict[str, Any]] = {"function_call": (), "reasoning_content": (), "refusal": (), "audio": ()}
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        # SGLang's normalize_tool_content joins a tool result's text parts with spaces
        return (" " if self.role == "tool" else "").join(part.text for part in self.content)

    def calls(self) -> list[FunctionCall]:
        return [call.function for call in self.tool_calls or []]


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# Fields SGLang's two OpenAI request models share that this engine does not implement.
_OPENAI_NEUTRAL: dict[str, Any] = {
    **_SAMPLING_NEUTRAL,
    "custom_logit_processor": (),
    # disaggregation's bootstrap server: SGLang reads these only in prefill/decode mode
    "bootstrap_host": IGNORED, "bootstrap_port": IGNORED, "bootstrap_room": IGNORED,
    "routed_dp_rank": (0,), "data_parallel_rank": (0,), "disagg_prefill_dp_rank": (0,),
    "return_hidden_states": (False,), "return_routed_experts": (False,), "routed_experts_start_len": (0,),
    "return_cached_tokens_details": (False,), "return_token_ids": (False,),
    "lora_path": (), "session_id": (), "session_params": (),
    # a multimodal processor's settings: there are no images for them to act on
    "images_config": IGNORED, "mm_processor_kwargs": IGNORED,
    "extra_key": ANY, "cache_salt": ANY, "priority": ANY,
}


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema (SGLang's JsonSchemaResponseFormat; unknown keys ignored, as its)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "Schema"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format. SGLang's other form, a structural tag, is refused by its type."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="before")
    @classmethod
    def _schema_at_the_top(cls, data: Any) -> Any:
        """SGLang's set_json_schema: {"type": "json_schema", "schema": {...}} is read as json_schema."""
        if isinstance(data, dict) and data.get("type") == "json_schema" and not data.get("json_schema") and data.get("schema"):
            data = dict(data)
            schema = data.pop("schema")
            data["json_schema"] = {"name": schema.get("title", "Schema") if isinstance(schema, dict) else "Schema",
                                   "schema": schema}
        return data

    @model_validator(mode="after")
    def _has_schema(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("schema_ is required for json_schema response format request.")
        return self

    def json_schema_source(self) -> str | None:
        """The json_schema constraint it stands for (SGLang's to_sampling_params)."""
        if self.type == "json_schema":
            return json.dumps(self.json_schema.schema_)
        if self.type == "json_object":
            return '{"type": "object"}'
        return None


class _OpenAIRequest(_SamplingFields, _Lenient):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    min_tokens: int = Field(0, ge=0)
    response_format: ResponseFormat | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    user: str | None = None
    rid: str | None = None
    return_spec_tokens_details: bool = False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def constraint_field(self) -> str:
        if self.response_format is not None and self.response_format.json_schema_source() is not None:
            return "response_format"
        return super().constraint_field()

    def grammar_fields(self) -> dict[str, str | None]:
        fields = super().grammar_fields()
        from_format = self.response_format.json_schema_source() if self.response_format else None
        if from_format is not None:  # SGLang: response_format sets json_schema over the field
            fields["json_schema"] = from_format
        return fields


class ChatCompletionRequest(_OpenAIRequest):
    NEUTRAL: ClassVar[dict[str, Any]] = {
        **_OPENAI_NEUTRAL,
        # OpenAI's deprecated form of tools: SGLang does not read it either
        "functions": (), "function_call": ("auto", "none"),
        "continue_final_message": (False,),
        # tiny-ling does not reason: SGLang hands these to a reasoning model's template, here there is none
        "reasoning_effort": IGNORED, "thinking": IGNORED, "task": IGNORED,
        "stream_reasoning": ANY,  # tiny-ling does not reason: nothing to separate or stream
        "separate_reasoning": ANY,
        "return_prompt_token_ids": (False,), "return_meta_info": (False,), "return_input_ids_in_sglext": (False,),
        "return_output_ids_in_sglext": (False,), "return_sampling_mask": (False,),
        "sampling_logprobs_mode": ("selected",), "return_flat_raw_output_top_logprobs": (False,),
        "return_flat_raw_top_logprobs_b64": ANY,
        "max_dynamic_patch": IGNORED, "min_dynamic_patch": IGNORED, "use_audio_in_video": IGNORED,
        "video_config": IGNORED,
        "audio": (), "modalities": (["text"],), "web_search_options": (),
        # OpenAI-only hints this server has nothing to do with: a predicted output (a speed hint),
        # a verbosity level for models trained on one, storage, caching, service tiers
        "prediction": IGNORED, "verbosity": IGNORED, "store": IGNORED, "service_tier": IGNORED,
        "metadata": ANY, "prompt_cache_key": ANY, "prompt_cache_options": ANY,
        "prompt_cache_retention": ANY, "safety_identifier": ANY,
        "moderation": (),
    }

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    chat_template_kwargs: dict[str, Any] | None = None
    input_ids: list[int] | None = None  # SGLang's extension: the prompt's ids, the template skipped
    tools: list[ToolDefIn] | None = None
    # SGLang's default: "none" without tools, else "auto"
    tool_choice: Literal["auto", "required", "none"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _tool_choice(self):
        """SGLang's checks (serving_chat._validate_request, protocol.to_sampling_params), its messages."""
        if self.tool_choice is None:
            self.tool_choice = "auto" if self.tools else "none"
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("Tools cannot be empty if tool choice is set to required.")
        named = self.named_tool
        if named is not None:
            if not self.tools:
                raise ValueError("Tools cannot be empty if tool choice is set to a specific tool.")
            if all(tool.function.name != named for tool in self.tools):
                raise ValueError(f"Tool '{named}' not found in tools list.")
        if self.forces_a_call and (self.response_format and self.response_format.type != "text" or self.regex
                                   or self.ebnf):
            raise ValueError("tool_choice 'required' or a named tool cannot be combined with response_format, regex, "
                             "or ebnf: the tool-call constraint and the output constraint cannot both be honored.")
        return self

    @property
    def named_tool(self) -> str | None:
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    @property
    def forces_a_call(self) -> bool:
        """tool_choice "required" or a named function: the reply must be a call."""
        return bool(self.tools) and (self.tool_choice == "required" or self.named_tool is not None)

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template shows (SGLang: none under "none", only the named one)."""
        if not self.tools or self.tool_choice == "none":
            return None
        named = self.named_tool
        return [tool.template_form() for tool in self.tools if named is None or tool.function.name == named] or None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def top_logprobs_num(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else 0


class CompletionRequest(_OpenAIRequest):
    NEUTRAL: ClassVar[dict[str, Any]] = {**_OPENAI_NEUTRAL, "best_of": (1,), "suffix": ("",), "custom_labels": ANY}

    # one text, a batch of texts, one token-id prompt or a batch of them (SGLang's and OpenAI's forms)
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0)
    json_schema: str | None = None

    @model_validator(mode="after")
    def _prompt_not_empty(self):
        prompt = self.prompt
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            raise ValueError("Prompt cannot be empty")  # SGLang's _validate_request
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) and any(not p for p in prompt):
            raise ValueError("prompt: a token-id prompt of the batch is empty")
        if len(self.prompts()) * self.samples > MAX_BATCH_ITEMS:
            raise ValueError(f"{len(self.prompts())} prompts x n={self.samples} is more than {MAX_BATCH_ITEMS} "
                             "generations per request (send several requests)")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt, a text or its token ids, in order."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        return list(prompt)


class AbortRequest(_Lenient):
    """SGLang's AbortReq as /abort_request reads it."""

    rid: str = ""
    abort_all: bool = False


class TokenizeRequest(_Lenient):
    """SGLang's TokenizeRequest (its model allows extra keys)."""

    NEUTRAL: ClassVar[dict[str, Any]] = {"tools": (), "tool_choice": ("auto", "none"), "reasoning_effort": ("none",),
                                         "continue_final_message": (False,)}
    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


# -- parsing -------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (send a finite number)")


def _check_json_values(data: Any) -> None:
    """Depth, unpaired surrogates, non-finite floats: each a ValueError naming where (iterative,
    so that the check cannot itself recurse too deep)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            shown = where if len(where) <= 40 else where[:37] + "..."
            raise ValueError(f"{shown}: nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, f"{where}.{key}".lstrip(".") if where else "a key")
                stack.append((item, f"{where}.{key}" if where else str(key), depth + 1))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                stack.append((item, f"{where}.{i}" if where else str(i), depth + 1))
        elif isinstance(value, str):
            _check_string(value, where or "the body")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where or 'the body'}: {value} is out of range (send a finite number)")


def _check_string(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise ValueError(f"{where}: contains the unpaired UTF-16 surrogate \\u{ord(bad):04x}, which is not text "
                         "(encode the character as a surrogate pair or as UTF-8)") from None


def parse_json(raw: bytes, where: str) -> Any:
    """JSON bytes -> a checked Python value, or ApiError(400)."""
    if isinstance(raw, (bytes, bytearray)) and not raw.strip():
        raise ApiError(400, f"{where}: empty request body; send a JSON object")
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, f"{where}: the body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"{where}: malformed JSON: {exc}") from None
    try:
        _check_json_values(data)
    except ValueError as exc:
        raise ApiError(400, f"{where}: {exc}") from None
    return data


def parse_body(raw: bytes, model: type[BaseModel], where: str, ignored: list[str] | None = None) -> Any:
    """JSON bytes -> a validated request model, or ApiError(400) naming the offending field.
    Top-level keys no request type defines are appended to `ignored` (SGLang ignores them)."""
    data = parse_json(raw, where)
    if isinstance(data, list):
        raise ApiError(400, f"{where}: the body must be a JSON object, got an array (a batch is one object whose "
                       "prompt field is a list)")
    if not isinstance(data, dict):
        raise ApiError(400, f"{where}: the body must be a JSON object, got {type(data).__name__}")
    context: dict[str, Any] = {}
    try:
        parsed = model.model_validate(data, context=context)
    except ValidationError as exc:
        raise ApiError(400, f"{where}: {describe_validation_error(exc, model)}", param=_first_loc(exc)) from None
    if ignored is not None:
        ignored.extend(context.get("ignored", []))
    return parsed


def _first_loc(exc: ValidationError) -> str | None:
    errors = _branch_errors(exc.errors())
    loc = _clean_loc(errors[0]["loc"]) if errors else []
    return ".".join(loc) or None


_UNION_NOISE = {"str", "list[str]", "list[int]", "list[TextPart]", "int", "float", "bool"}


def _clean_loc(loc: tuple) -> list[str]:
    """A location without the type tags union members add to it ('list[int]', 'function-after[...]')."""
    return [str(p) for p in loc if str(p) not in _UNION_NOISE and not any(c in str(p) for c in "[(")
            and not str(p).startswith(("function-", "constrained-"))]


def _branch_errors(errors: list[dict]) -> list[dict]:
    """A field typed `X | list[X]` (a prompt or its batch) fails in both branches; report the
    branch the value was meant for: not "should be a valid list" when another error says more,
    and the deepest location (the element or key that is wrong)."""
    by_field: dict[str, list[dict]] = {}
    for err in errors:
        loc = _clean_loc(err["loc"])
        by_field.setdefault(loc[0] if loc else "", []).append(err)
    kept = []
    for group in by_field.values():
        if len(group) > 1:
            group = [e for e in group if e["type"] != "list_type"] or group
            deepest = max(len(_clean_loc(e["loc"])) for e in group)
            group = [e for e in group if len(_clean_loc(e["loc"])) == deepest]
        kept += group
    return kept


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line per problem: 'sampling_params.max_new_tokens: Input should be greater than or equal to 0'."""
    lines = []
    seen: set[str] = set()
    for err in _branch_errors(exc.errors()):
        loc_parts = _clean_loc(err["loc"])
        loc = ".".join(loc_parts)
        if err["type"] == "extra_forbidden":
            message = "unknown field"
            allowed = _allowed_fields(model, loc_parts[:-1])
            if allowed:
                message += f" (allowed: {', '.join(allowed)})"
        else:
            message = err["msg"].removeprefix("Value error, ")
        line = f"{loc}: {message}" if loc else message
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return "; ".join(lines)


def _allowed_fields(model: type[BaseModel], parents: list[str]) -> list[str]:
    current: Any = model
    for name in parents:
        if name.isdigit():
            continue
        info = getattr(current, "model_fields", {}).get(name)
        if info is None:
            return []
        annotation = info.annotation
        current = _model_in(annotation)
        if current is None:
            return []
    return sorted(set(getattr(current, "model_fields", {})) | set(getattr(current, "NEUTRAL", {})))


def _model_in(annotation: Any) -> Any:
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# -- Ollama's API as SGLang 0.5.23 serves it (sglang/srt/entrypoints/ollama/) ---------------------------

# Ollama option -> SGLang sampling parameter: SGLang's mapping, with "seed" under the name its
# SamplingParams has (SGLang forwards it as "seed", which fails the request with a 500).
OLLAMA_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "num_predict": "max_new_tokens",
                  "stop": "stop", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "seed": "sampling_seed"}
# Ollama's "json" format: llama.cpp's JSON grammar, whose root is an object.
OLLAMA_JSON_FORMAT = '{"type": "object"}'
# SGLang's max_new_tokens when num_predict is not given ("Ollama users typically expect longer
# responses"); more than tiny-ling's context holds, so such a request is a 400 there as here.
OLLAMA_DEFAULT_NUM_PREDICT = 2048
# Fields SGLang's Ollama models accept and its handlers never read.
OLLAMA_UNREAD = ("keep_alive", "think", "images", "suffix", "template", "context", "raw")


class OllamaToolCall(_Lenient):
    function: FunctionCall


class OllamaMessage(_Lenient):
    role: str
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None  # a tool result's tool (Ollama's name for it)

    def text(self) -> str:
        return self.content

    def calls(self) -> list[FunctionCall]:
        return [call.function for call in self.tool_calls or []]


class _OllamaRequest(_Lenient):
    model: str
    stream: bool = True
    options: dict[str, Any] | None = None
    format: Any = None
    keep_alive: float | str | None = None

    def format_schema(self) -> str | None:
        """`format` as the json_schema constraint it stands for: "json" any JSON object, a dict
        that schema (Ollama's structured outputs); "" or null none."""
        if self.format in (None, ""):
            return None
        if self.format == "json":
            return OLLAMA_JSON_FORMAT
        if isinstance(self.format, dict):
            return json.dumps(self.format)
        shown = json.dumps(self.format)[:60]
        raise ApiError(400, f'format: "json" or a JSON schema (an object), not {shown}', param="format")

    def unread(self) -> list[str]:
        """What SGLang accepts and ignores here (named in x-sparkit-ignored-fields)."""
        names = [name for name in OLLAMA_UNREAD if getattr(self, name, None) not in (None, False, [])]
        names += [f"options.{key}" for key in (self.options or {}) if key not in OLLAMA_OPTIONS]
        if isinstance(self, OllamaChatRequest):
            names += [f"messages.{i}.images" for i, m in enumerate(self.messages) if m.images]
        return names

    def sampling_params(self) -> GenerateSamplingParams:
        """options -> SGLang's sampling parameters, checked as /generate's (errors name the option)."""
        options = dict(self.options or {})
        mapped = {OLLAMA_OPTIONS[key]: value for key, value in options.items() if key in OLLAMA_OPTIONS}
        mapped.setdefault("max_new_tokens", OLLAMA_DEFAULT_NUM_PREDICT)
        schema = self.format_schema()
        if schema is not None:
            mapped["json_schema"] = schema
        try:
            return GenerateSamplingParams.model_validate(mapped)
        except ValidationError as exc:
            names = {v: k for k, v in OLLAMA_OPTIONS.items()}
            problems = []
            for err in exc.errors():
                loc = [names.get(str(p), str(p)) for p in err["loc"] if str(p) not in _UNION_NOISE]
                problems.append(f"options.{'.'.join(loc)}: {err['msg'].removeprefix('Value error, ')}")
            raise ApiError(400, "; ".join(problems), param="options") from None


class OllamaChatRequest(_OllamaRequest):
    messages: list[OllamaMessage]
    think: bool | str | None = None
    tools: list[ToolDefIn] | None = None  # Ollama has no tool_choice: a call is the model's choice ("auto")

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [tool.template_form() for tool in self.tools] if self.tools else None


class OllamaGenerateRequest(_OllamaRequest):
    prompt: str
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None
    think: bool | None = None


class OllamaShowRequest(_Lenient):
    model: str
