"""What a checkpoint directory holds, read from its files' headers only (no weights loaded).

A safetensors file is an 8-byte little-endian header length, a JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}` and the data
region. `read_safetensors_index(dir)` reads every header of a checkpoint (one file, or the shards
that `model.safetensors.index.json` names, or every `*.safetensors` in the directory) and
returns each tensor's dtype, shape and stored size, checked against the file: a header that
lies about its sizes is an error naming the file, never a silently wrong byte count.

Reading a 24-shard checkpoint costs 24 small reads; a sparse file (a valid header over a data
region that was never written) reads like a real one. `write_sparse_checkpoint` writes such files:
real headers over holes, so a 250 GB checkpoint's layout costs a few megabytes of disk.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import DataError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# safetensors itself refuses headers above 100 MB; a larger length field is a corrupt file.
MAX_HEADER_BYTES = 100 * 1000 * 1000
# A checkpoint's JSON (config.json, the index, a header) nests a few levels; a file nested
# thousands deep is made to crash a parser (Python's raises RecursionError), not to be read.
MAX_JSON_DEPTH = 64
# torch's own limits on a tensor: its dimensions, and its elements (an int64 count).
MAX_DIMS = 64
MAX_ELEMENTS = 2**63 - 1

# Bits per element of each safetensors dtype code (the F4/F6 codes pack several per byte).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header describes it."""

    name: str
    dtype: str  # the safetensors code: BF16, F8_E4M3, U8, ...
    shape: tuple[int, ...]
    nbytes: int  # stored size (the span of data_offsets)
    file: str  # the file (shard) name within the checkpoint directory

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class SafetensorsIndex:
    """Every tensor of a checkpoint directory, by name."""

    directory: Path
    tensors: dict[str, TensorInfo]
    files: list[str]
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # per file: its __metadata__

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def read_safetensors_header(path: str | Path) -> tuple[dict[str, TensorInfo], dict[str, Any]]:
    """(tensors by name, __metadata__) of one .safetensors file, checked against its size.
    DataError names the file and what is wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = path.stat().st_size
            raw_len = handle.read(8)
            header_len = header_length(raw_len, size, str(path))
            raw = handle.read(header_len)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return parse_safetensors_header(raw, size - 8 - header_len, str(path), path.name)


def header_length(first_bytes: bytes, size: int, where: str) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes, checked against the
    file's `size` (DataError naming `where`)."""
    if len(first_bytes) < 8:
        raise DataError(f"{where}: not a safetensors file (shorter than its 8-byte header length)")
    (header_len,) = struct.unpack("<Q", first_bytes[:8])
    if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
        raise DataError(f"{where}: not a safetensors file (header length {header_len} does not fit "
                        f"the file's {size} bytes)")
    return header_len


def load_json(raw: bytes | str, where: str, what: str = "the file") -> Any:
    """A checkpoint's JSON document (config.json, the index, a safetensors header; from disk or from
    the hub) parsed, in time and memory bounded by its length: DataError naming `where` for text
    that is not UTF-8, not JSON, nested more than MAX_JSON_DEPTH levels, or a number of more
    digits than Python converts."""
    try:
        value = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: {what} is not UTF-8 text ({exc.reason} at byte {exc.start})", hint=_JSON_HINT) from None
    except RecursionError:
        raise DataError(f"{where}: {what} is nested more than {MAX_JSON_DEPTH} levels deep", hint=_JSON_HINT) from None
    except ValueError as exc:  # not JSON, or an integer of more digits than int() takes
        raise DataError(f"{where}: {what} is not JSON ({exc})", hint=_JSON_HINT) from None
    if _nested_past(value, MAX_JSON_DEPTH):
        raise DataError(f"{where}: {what} is nested more than {MAX_JSON_DEPTH} levels deep", hint=_JSON_HINT)
    return value


_JSON_HINT = ("a checkpoint's JSON is what its tools wrote, a few levels deep: this copy is damaged or was made to "
              "crash a reader; use another copy, or another revision of a hub model (ORG/NAME@REVISION)")


def _nested_past(value: Any, limit: int) -> bool:
    """Whether lists and objects nest more than `limit` levels in `value` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def parse_safetensors_header(raw: bytes, data_size: int, where: str, file: str) -> tuple[dict[str, TensorInfo], dict[str, Any]]:
    """(tensors by name, __metadata__) from a header's JSON bytes, each tensor checked against its
    dtype, shape and the `data_size` bytes of the data region (read from disk, or by range
    requests from the hub: sparkit.hub.remote). `where` names the file in messages, `file` is its
    name within the checkpoint."""
    header = load_json(raw, where, "the safetensors header")
    if not isinstance(header, dict):
        raise DataError(f"{where}: the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(where, file, name, entry, data_size)
    return tensors, metadata if isinstance(metadata, dict) else {}


def _tensor_info(path: str, file: str, name: str, entry: Any, data_size: int) -> TensorInfo:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise DataError(f"{where}: its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise DataError(f"{where}: no dtype")
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise DataError(f"{where}: unknown dtype {_short(dtype)} (safetensors names {', '.join(DTYPE_BITS)})")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(type(d) is int and d >= 0 for d in shape)):  # type(): True is no size
        raise DataError(f"{where}: shape {_short(shape)} is not a list of sizes (at most {MAX_DIMS} of them)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise DataError(f"{where}: data_offsets {_short(offsets)} are not [begin, end]")
    if offsets[1] > data_size:
        raise DataError(f"{where}: its data ends at byte {offsets[1]} of a {data_size}-byte data region "
                        "(a truncated file?)")
    nbytes = offsets[1] - offsets[0]
    expected = _stored_bytes(shape, bits)
    if expected != nbytes:
        needs = f"more than {MAX_ELEMENTS} elements;" if expected is None else f"{expected} bytes,"
        raise DataError(f"{where}: {dtype} {_short(shape)} needs {needs} its offsets span {nbytes}")
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), nbytes=nbytes, file=file)


def _stored_bytes(shape: list[int], bits: int) -> int | None:
    """The bytes a tensor of `shape` stores at `bits` per element, in integers (a float overflows
    at 10**400 elements); None as soon as the product passes MAX_ELEMENTS, so a product of huge
    dimensions is never computed."""
    if 0 in shape:
        return 0
    elements = 1
    for d in shape:
        elements *= d
        if elements > MAX_ELEMENTS:
            return None
    return (elements * bits + 7) // 8


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def safetensors_files(directory: str | Path) -> list[Path]:
    """The checkpoint's .safetensors files: those its index names (each must be there), else
    model.safetensors, else every one in the directory."""
    directory = Path(directory)
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        names = sorted(set(_weight_map(index_path).values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise DataError(f"{index_path} names {len(missing)} file(s) that are not there, e.g. {missing[0]} "
                            "(an incomplete download?)")
        return [directory / n for n in names]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    return sorted(directory.glob("*.safetensors"))


def _weight_map(index_path: Path) -> dict[str, str]:
    try:
        raw = index_path.read_bytes()
    except OSError as exc:
        raise DataError(f"{index_path}: cannot read it ({exc.strerror or exc})") from None
    index = load_json(raw, str(index_path), "the safetensors index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise DataError(f"{index_path}: not a safetensors index (no weight_map object)")
    return weight_map


def read_safetensors_index(directory: str | Path) -> SafetensorsIndex:
    """Every tensor of the checkpoint in `directory`: the shards the index file names (each
    named tensor must be in its shard), else `model.safetensors`, else every `*.safetensors`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: not a checkpoint directory")
    index_path = directory / INDEX_FILE
    weight_map = _weight_map(index_path) if index_path.is_file() else None
    files = [p.name for p in safetensors_files(directory)]
    if not files:
        raise DataError(f"{directory}: no .safetensors files")
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict[str, Any]] = {}
    for name in files:
        found, meta = read_safetensors_header(directory / name)
        for tensor in found.values():
            if tensor.name in tensors:
                raise DataError(f"{directory}: tensor {tensor.name!r} is in both {tensors[tensor.name].file} and {name}")
            tensors[tensor.name] = tensor
        metadata[name] = meta
    if weight_map is not None:
        for tensor_name, file in weight_map.items():
            held = tensors.get(tensor_name)
            if held is None or held.file != file:
                raise DataError(f"{index_path}: tensor {tensor_name!r} is mapped to {file}, which does not hold it")
    return SafetensorsIndex(directory=directory, tensors=tensors, files=files, metadata=metadata)


def read_config(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json (DataError when missing or not a JSON object)."""
    path = Path(directory) / CONFIG_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file (a checkpoint directory has a config.json)") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    config = load_json(raw, str(path), "the config")
    if not isinstance(config, dict):
        raise DataError(f"{path}: not a JSON object")
    return config


def write_sparse_checkpoint(directory: str | Path, tensors: dict[str, tuple[str, tuple[int, ...]]],
                            config: dict[str, Any] | None = None, *, shard_bytes: int = 5 * 10**9) -> list[Path]:
    """Write `tensors` ({name: (dtype, shape)}, in order) as safetensors shards of at most
    `shard_bytes` of data each, named and indexed as Hugging Face does, whose data regions are
    holes (the files are as long as real ones; no disk is used for the weights), and `config` as
    config.json. Returns the shard paths. Readers of headers (read_safetensors_index) see a
    complete checkpoint."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, str, tuple[int, ...], int]]] = [[]]
    size = 0
    for name, (dtype, shape) in tensors.items():
        if dtype not in DTYPE_BITS:
            raise ValueError(f"tensor {name!r}: unknown safetensors dtype {dtype!r}")
        n = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dtype, tuple(shape), n))
        size += n
    weight_map: dict[str, str] = {}
    paths, total = [], 0
    for k, shard in enumerate(shards, 1):
        file = SINGLE_FILE if len(shards) == 1 else f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape, n in shard:
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors aligns the data region to 8 bytes
        path = directory / file
        with open(path, "wb") as handle:
            handle.write(struct.pack("<Q", len(raw)))
            handle.write(raw)
            handle.truncate(8 + len(raw) + offset)  # the data: a hole
        paths.append(path)
        total += offset
    if len(shards) > 1:
        (directory / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                       indent=1))
    if config is not None:
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    return paths


__all__ = ["TensorInfo", "write_sparse_checkpoint", "SafetensorsIndex", "read_safetensors_header", "read_safetensors_index",
           "read_config", "parse_safetensors_header", "header_length", "load_json", "DTYPE_BITS", "MAX_JSON_DEPTH"]
