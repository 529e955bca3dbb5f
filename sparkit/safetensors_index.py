"""What a safetensors checkpoint holds, from its headers alone: every tensor's name, dtype, shape
and byte size, without reading (or even having) the weights.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
data. Reading the headers of a 65 GB checkpoint costs a few MB of I/O, so the memory fit
(sparkit.memory.fit) and anything else that needs the checkpoint's byte layout (a per-step
bandwidth roofline, say) can use the real shapes and dtypes, also of a sparse copy that holds
only the headers.

`read_safetensors_index(directory)` is the one entry point. A header that contradicts itself
(offsets that do not match shape x dtype, a file shorter than its header says: an interrupted
download) is a DataError naming the file and tensor.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import NamedTuple

from sparkit.errors import DataError

INDEX_FILE = "model.safetensors.index.json"
# The safetensors format caps the header at 100 MB; a larger length is a corrupt file.
MAX_HEADER_BYTES = 100 * 1000 * 1000

# Bits per element of every dtype the safetensors format names (sub-byte types pack densely).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "U16": 16, "I16": 16, "F16": 16, "BF16": 16,
    "U32": 32, "I32": 32, "F32": 32,
    "U64": 64, "I64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


class TensorInfo(NamedTuple):
    """One tensor as its file's header describes it (a tuple: checkpoints hold 100k+ of them)."""

    name: str
    dtype: str  # the safetensors name: BF16, F8_E4M3, U8, ...
    shape: tuple[int, ...]
    nbytes: int  # bytes it occupies in the file (= its size in memory in the same dtype)
    file: str  # file name inside the checkpoint directory

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """The tensors of one .safetensors file, in header order."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise DataError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise DataError(f"{path}: not a safetensors file (header length {length} for a {size}-byte file)")
            raw = handle.read(length)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: the safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: the safetensors header is not a JSON object")
    data_bytes = size - 8 - length
    file_name = path.name
    return [_tensor(path, file_name, name, entry, data_bytes) for name, entry in header.items() if name != "__metadata__"]


def _tensor(path: Path, file_name: str, name: str, entry: object, data_bytes: int) -> TensorInfo:
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]  # type: ignore[index]
        shape = tuple(int(d) for d in shape)
        begin, end = int(begin), int(end)
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets") from None
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise DataError(f"{path}: tensor {name!r} has an unknown dtype {dtype!r}")
    expected = -(-math.prod(shape) * bits // 8)
    if end - begin != expected:
        raise DataError(f"{path}: tensor {name!r} ({dtype} {list(shape)}) should take {expected} bytes, "
                        f"its data_offsets say {end - begin}")
    if end > data_bytes:
        raise DataError(f"{path}: tensor {name!r} ends at byte {end} of the data, but the file holds only "
                        f"{data_bytes} bytes of data (an incomplete download?)")
    return TensorInfo(name, dtype, shape, end - begin, file_name)


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's .safetensors files: those its index names, else every one in the directory."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise DataError(f"{index}: not a safetensors index (no weight_map)") from None
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise DataError(f"{index} names {len(missing)} file(s) that are not there, e.g. {missing[0]} "
                            "(an incomplete download?)")
        return [directory / n for n in names]
    return sorted(directory.glob("*.safetensors"))


def read_safetensors_index(directory: Path) -> list[TensorInfo]:
    """Every tensor of the checkpoint in `directory` (all its .safetensors files), from the headers.

    Raises DataError when the directory holds no safetensors file or a header is inconsistent."""
    files = safetensors_files(Path(directory))
    if not files:
        raise DataError(f"{directory}: no .safetensors files")
    tensors: list[TensorInfo] = []
    for file in files:
        tensors.extend(read_safetensors_header(file))
    return tensors


__all__ = ["TensorInfo", "read_safetensors_index", "read_safetensors_header", "safetensors_files", "DTYPE_BITS"]
