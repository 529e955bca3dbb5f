"""The safetensors header reader: the shipped tiny-ling checkpoint read from its headers matches
what the safetensors library itself loads, and broken headers are refused by name."""

from __future__ import annotations

import json
import struct

import pytest

from sparkit.checkpoint_headers import read_safetensors_index as read_index
from sparkit.errors import DataError
from sparkit.models.tiny_ling.family import SHIPPED_DIR


def read_safetensors_index(directory):
    return list(read_index(directory).tensors.values())

TINY = SHIPPED_DIR / "tiny-ling-s0"


def test_tiny_ling_headers_match_what_safetensors_loads():
    from safetensors import safe_open

    index = {t.name: t for t in read_safetensors_index(TINY)}
    seen = 0
    with safe_open(str(TINY / "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            tensor = handle.get_tensor(name)
            info = index[name]
            assert info.shape == tuple(tensor.shape)
            assert info.nbytes == tensor.numel() * tensor.element_size()
            assert info.dtype == {"torch.bfloat16": "BF16", "torch.float32": "F32"}[str(tensor.dtype)]
            seen += 1
    assert seen == len(index) > 40


def write(path, header: dict, data_bytes: int) -> None:
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + data_bytes)


def test_sharded_checkpoint_with_sub_byte_and_fp8_dtypes(tmp_path):
    write(tmp_path / "a.safetensors", {"w": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 32]},
                                       "__metadata__": {"format": "pt"}}, 32)
    write(tmp_path / "b.safetensors", {"p": {"dtype": "F4", "shape": [3, 5], "data_offsets": [0, 8]}}, 8)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "a.safetensors",
                                                                                      "p": "b.safetensors"}}))
    got = {t.name: (t.dtype, t.shape, t.nbytes, t.file) for t in read_safetensors_index(tmp_path)}
    assert got == {"w": ("F8_E4M3", (4, 8), 32, "a.safetensors"), "p": ("F4", (3, 5), 8, "b.safetensors")}


@pytest.mark.parametrize("header, data, message", [
    ({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 16]}}, 16, "needs 32 bytes, its offsets span 16"),
    ({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}}, 20, "a truncated file"),
    ({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}}, 2, "unknown dtype 'Q4'"),
    ({"w": {"shape": [4]}}, 0, "no dtype"),
])
def test_inconsistent_headers_are_refused_naming_the_tensor(tmp_path, header, data, message):
    write(tmp_path / "model.safetensors", header, data)
    with pytest.raises(DataError, match=message) as caught:
        read_safetensors_index(tmp_path)
    assert "'w'" in str(caught.value) and "model.safetensors" in str(caught.value)


def test_not_safetensors_and_missing_shards_are_data_errors(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 4)
    with pytest.raises(DataError, match="not a safetensors file"):
        read_safetensors_index(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    with pytest.raises(DataError, match="not there, e.g. gone.safetensors"):
        read_safetensors_index(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no .safetensors files"):
        read_safetensors_index(empty)
