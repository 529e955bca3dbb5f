"""tiny-ling's tokenizer: pure byte-level (256 byte tokens + a few special tokens).

Saved as tokenizer.json + tokenizer_config.json so that
`transformers.AutoTokenizer.from_pretrained(DIR)` loads it as a PreTrainedTokenizerFast.
Any UTF-8 text round-trips because every byte has its own token.
"""

from __future__ import annotations

import re
from pathlib import Path

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, SYSTEM, USER, ASSISTANT]
NUM_BYTE_TOKENS = 256
# Special tokens sit right after the 256 byte tokens; the vocabulary is padded to a
# multiple of 8 (unused ids are never produced by the tokenizer).
VOCAB_SIZE = 264

# One turn = role token, content, <|eos|>. Generation stops at <|eos|>.
# Tools (issue 37) in Ling 3.0's format, the one SGLang's `ling3` tool-call parser reads: the
# functions' schemas in a system turn before the conversation (the first system message's text
# ahead of them), an assistant's calls as <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V
# </arg_value>\n</tool_call> after its text (a string value as it is, any other as JSON), and tool
# results as <tool_response> blocks in a user turn (tiny-ling has no tool role token; consecutive
# results share one turn). A conversation without tools renders as it always has, byte for byte.
TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "Here are the available functions in JSON Schema format:\n<tools>\n")
TOOLS_FORMAT = ("</tools>\n\nFor each function call, write its name and arguments in this format:\n"
                "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
                "...\n</tool_call>")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|system|>' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '" + TOOLS_FORMAT.replace("\n", "\\n") + "<|eos|>' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first and tools %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|user|>' }}{% endif %}"
    "{{ '<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|eos|>' }}{% else %}{{ '\\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>' + function['name'] + '\\n' }}"
    "{% for key, value in (function['arguments'] or {}).items() %}"
    "{{ '<arg_key>' + key + '</arg_key>\\n<arg_value>' }}"
    "{% if value is string %}{{ value }}{% else %}{{ value | tojson }}{% endif %}"
    "{{ '</arg_value>\\n' }}"
    "{% endfor %}"
    "{{ '</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|eos|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def special_token_id(token: str) -> int:
    return NUM_BYTE_TOKENS + SPECIAL_TOKENS.index(token)


_SPECIAL_PATTERN = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


def encode_bytes(text: str) -> list[int]:
    """What the saved tokenizer's `encode(text, add_special_tokens=False)` gives, without it:
    each special token written literally is its id, every other byte of the UTF-8 text is its own
    id. The builder encodes its corpus with this, so a build does not depend on the installed
    tokenizers/transformers (tests/embedded/test_builder.py compares the two)."""
    ids: list[int] = []
    position = 0
    for match in _SPECIAL_PATTERN.finditer(text):
        ids += text[position:match.start()].encode("utf-8")
        ids.append(special_token_id(match.group()))
        position = match.end()
    ids += text[position:].encode("utf-8")
    return ids


def build_tokenizer():
    """A transformers PreTrainedTokenizerFast over a byte-level BPE with no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel maps byte b to a printable char; give byte b the id b.
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(NUM_BYTE_TOKENS)}
    assert set(vocab) == set(byte_chars)
    for token in SPECIAL_TOKENS:
        vocab[token] = special_token_id(token)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(directory: str | Path) -> None:
    build_tokenizer().save_pretrained(str(directory))
    add_template_to_config(directory)


def add_template_to_config(directory: str | Path) -> None:
    """Also put the chat template into tokenizer_config.json (transformers >= 5 writes it only to
    chat_template.jinja; older readers look in the config)."""
    import json

    path = Path(directory) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.setdefault("chat_template", CHAT_TEMPLATE)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(directory: str | Path):
    # PreTrainedTokenizerFast directly: AutoTokenizer would also parse config.json and warn
    # about the unknown model_type (it loads the same files).
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map (what ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


class TokenTexts:
    """Each token id's raw bytes and display text, as logprob entries show them (cached: the
    vocabulary is small and the same ids come back in every response).

    Byte-level tokens are read through GPT-2's byte map, so a lone byte of a multi-byte
    character has its real bytes; its display text is that byte as latin-1 (one character per
    byte, lossless), as SGLang's `_lossless_token_text` renders such fragments."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._from_char = {c: b for b, c in _bytes_to_unicode().items()}
        self._cache: dict[int, tuple[bytes, str]] = {}

    def _entry(self, token_id: int) -> tuple[bytes, str]:
        entry = self._cache.get(token_id)
        if entry is None:
            piece = self.tokenizer.convert_ids_to_tokens(int(token_id)) or ""
            if piece and all(c in self._from_char for c in piece):
                raw = bytes(self._from_char[c] for c in piece)
            else:  # a special or added token: its text is what it is
                raw = self.tokenizer.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            entry = self._cache[token_id] = (raw, text)
        return entry

    def raw(self, token_id: int) -> bytes:
        return self._entry(token_id)[0]

    def text(self, token_id: int) -> str:
        return self._entry(token_id)[1]
