"""Which files of a model repository its engine reads: what `sparkit pull` fetches, nothing else.

SGLang (0.5.23, model_loader/weight_utils.py) and transformers read, from the top of the
repository:
- every `*.json`: config.json, generation_config.json, the tokenizer's files, quantisation
  configs (hf_quant_config.json, ...), the safetensors index (SGLang's quantisation-config
  lookup fetches `*.json`);
- the tokenizer's other files (tokenizer.model, merges.txt, vocab.txt, *.tiktoken, ...) and the
  chat template (chat_template.jinja, additional_chat_templates/*.jinja);
- the model's own Python code when config.json has an `auto_map` (transformers imports it under
  trust_remote_code, and whatever it imports beside it: so every top-level *.py);
- the weights: with model.safetensors.index.json, exactly the shards its weight_map names (a
  repository that also holds consolidated.safetensors or an older set of shards keeps them);
  else model.safetensors (SGLang skips consolidated.safetensors beside it); else every top-level
  *.safetensors.
Everything else (README, .gitattributes, *.bin / *.pt / *.gguf copies, images, sub-folders such
as original/) is skipped, with the reason.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from sparkit.errors import DataError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# Tokenizer files that are not JSON, by the names transformers' tokenizers give them.
TOKENIZER_PATTERNS = ("tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "spiece.model",
                      "sentencepiece.bpe.model", "vocab.model", "qwen.tiktoken")
CHAT_TEMPLATE_FOLDER = "additional_chat_templates"  # transformers: named templates beside chat_template.jinja


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository at a commit, as the hub lists it."""

    path: str
    size: int
    blob_id: str  # the git object id (sha1 of "blob <size>\\0" + content for a file stored in git)
    sha256: str | None = None  # the LFS sha256 (large files); the hub's etag for them
    xet_hash: str | None = None

    @property
    def etag(self) -> str:
        """The name of its blob in the Hugging Face cache (huggingface_hub: the LFS sha256, else the git oid)."""
        return self.sha256 or self.blob_id

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


@dataclass
class Selection:
    files: list[str]  # what the engine reads, small files first
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why not)
    weights: str = ""  # how the weight files were chosen


def _top_level(path: str) -> bool:
    return "/" not in path


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _chat_template(path: str) -> bool:
    folder, _, name = path.rpartition("/")
    return name.endswith(".jinja") and folder in ("", CHAT_TEMPLATE_FOLDER)


def weight_files(available: dict[str, RemoteFile], index: dict | None, where: str) -> tuple[list[str], str]:
    """The safetensors files the engine loads and the rule that chose them. `index` is the
    parsed model.safetensors.index.json when the repository has one."""
    if index is not None:
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise DataError(f"{where}/{INDEX_FILE}: not a safetensors index (no weight_map object)")
        named = sorted({str(v) for v in weight_map.values()})
        missing = [n for n in named if n not in available]
        if missing:
            raise DataError(f"{where}/{INDEX_FILE} names {len(missing)} file(s) the repository does not have, "
                            f"e.g. {missing[0]}", hint="the repository is inconsistent: pick another revision "
                            "(ORG/NAME@REVISION) or tell its owner")
        return named, f"the {len(named)} shard(s) {INDEX_FILE} names"
    if SINGLE_FILE in available:
        return [SINGLE_FILE], f"{SINGLE_FILE} (no index)"
    loose = sorted(p for p in available if _top_level(p) and p.endswith(".safetensors"))
    if loose:
        return loose, f"every top-level *.safetensors ({len(loose)}; no index, no {SINGLE_FILE})"
    raise DataError(f"{where} has no safetensors weights (no {INDEX_FILE}, no *.safetensors)",
                    hint="sparkit pull fetches safetensors checkpoints; convert the checkpoint or pick another repository")


def select_files(available: dict[str, RemoteFile], config: dict | None, index: dict | None, where: str) -> Selection:
    """What the engine reads of `available` (path -> RemoteFile), given the repository's
    config.json and index (parsed; None when absent). DataError when it holds no weights, or its
    index names files it does not have. `where` names the repository in messages."""
    if CONFIG_FILE not in available:
        raise DataError(f"{where} has no {CONFIG_FILE}: not a model checkpoint the engine can load")
    weights, rule = weight_files(available, index, where)
    remote_code = isinstance(config, dict) and bool(config.get("auto_map"))
    chosen: list[str] = []
    skipped: list[tuple[str, str]] = []
    for path in sorted(available):
        if path in weights:
            continue
        if _top_level(path) and path.endswith(".json"):
            chosen.append(path)
        elif _top_level(path) and _matches(path, TOKENIZER_PATTERNS):
            chosen.append(path)
        elif _chat_template(path):
            chosen.append(path)
        elif _top_level(path) and path.endswith(".py"):
            if remote_code:
                chosen.append(path)
            else:
                skipped.append((path, "Python code, and config.json has no auto_map (the engine imports none)"))
        elif path.endswith(".safetensors"):
            skipped.append((path, f"not one of the weights the engine loads ({rule})"))
        else:
            skipped.append((path, "not read by the engine"))
    # Small files first: a pull interrupted early already has what `sparkit plan` reads.
    chosen.sort(key=lambda p: (available[p].size, p))
    return Selection(files=chosen + weights, skipped=skipped, weights=rule)


__all__ = ["RemoteFile", "Selection", "select_files", "weight_files", "INDEX_FILE", "SINGLE_FILE", "CONFIG_FILE"]
