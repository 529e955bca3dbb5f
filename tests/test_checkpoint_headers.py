"""sparkit.checkpoint_headers: a checkpoint's tensors from its safetensors headers, and every way a header
can lie about its sizes reported as one error naming the file."""

from __future__ import annotations

import json
import struct

import pytest

from sparkit.checkpoint_headers import (
    MAX_JSON_DEPTH,
    load_json,
    read_config,
    read_safetensors_header,
    read_safetensors_index,
)
from sparkit.errors import DataError

from _checkpoints import write_safetensors, write_sharded

TENSORS = {
    "a.weight": ("BF16", (3, 5)),
    "b.weight": ("F8_E4M3", (7, 2)),
    "b.weight_scale_inv": ("F32", (1, 1)),
    "c.weight": ("U8", (4, 16)),
    "c.scale": ("F8_E8M0", (4, 1)),
}
SIZES = {"a.weight": 30, "b.weight": 14, "b.weight_scale_inv": 4, "c.weight": 64, "c.scale": 4}


def test_a_sharded_checkpoint_lists_every_tensor_with_its_dtype_shape_and_size(tmp_path):
    write_sharded(tmp_path, TENSORS, shards=2)
    index = read_safetensors_index(tmp_path)
    assert set(index.tensors) == set(TENSORS)
    assert len(index.files) == 2
    for name, (dtype, shape) in TENSORS.items():
        t = index.tensors[name]
        assert (t.dtype, t.shape, t.nbytes) == (dtype, shape, SIZES[name])
    assert index.total_bytes == sum(SIZES.values())


def test_the_shipped_tiny_ling_header_accounts_for_the_whole_data_region():
    from sparkit.models.builder import builtin_model_dir

    directory = builtin_model_dir("tiny-ling", 0)
    raw = (directory / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    index = read_safetensors_index(directory)
    assert index.files == ["model.safetensors"]
    assert index.total_bytes == len(raw) - 8 - length  # every stored byte belongs to one tensor
    assert len(index.tensors) == len(json.loads(raw[8:8 + length])) - 1  # all but __metadata__


def test_a_directory_without_an_index_reads_every_safetensors_file(tmp_path):
    write_safetensors(tmp_path / "part-a.safetensors", {"x": ("BF16", (2, 2))})
    write_safetensors(tmp_path / "part-b.safetensors", {"y": ("F32", (3,))})
    assert set(read_safetensors_index(tmp_path).tensors) == {"x", "y"}


def _raw_file(path, header: dict, data_bytes: int) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)


@pytest.mark.parametrize("header, data, message", [
    ({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}}, 16, "truncated"),
    ({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 30]}}, 32, "needs 32 bytes"),
    ({"w": {"dtype": "BF16", "shape": "4x4", "data_offsets": [0, 32]}}, 32, "not a list of sizes"),
    ({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [32, 0]}}, 32, "are not [begin, end]"),
])
def test_a_header_whose_sizes_do_not_add_up_is_an_error_naming_file_and_tensor(tmp_path, header, data, message):
    path = tmp_path / "model.safetensors"
    _raw_file(path, header, data)
    with pytest.raises(DataError) as err:
        read_safetensors_header(path)
    assert str(path) in err.value.message and "'w'" in err.value.message and message in err.value.message


def test_a_file_that_is_not_safetensors_is_an_error(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(DataError, match="header length"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 5) + b"nope!")
    with pytest.raises(DataError, match="not JSON"):
        read_safetensors_header(path)


def test_an_index_naming_a_shard_that_lacks_the_tensor_is_an_error(tmp_path):
    write_sharded(tmp_path, TENSORS, shards=2)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first, second = sorted(set(index["weight_map"].values()))
    moved = next(n for n, f in index["weight_map"].items() if f == first)
    index["weight_map"][moved] = second
    index_path.write_text(json.dumps(index))
    with pytest.raises(DataError, match=f"{moved!r} is mapped to {second}"):
        read_safetensors_index(tmp_path)


def test_a_directory_without_weights_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(DataError, match="no .safetensors files"):
        read_safetensors_index(tmp_path)


# -- issue 40, item 10: a checkpoint's JSON and its shapes, from whoever made the files (a hub),
# are clear errors in time bounded by the file's length: never a RecursionError, an OverflowError,
# a ValueError, or a product of 200,000 dimensions computed for a minute

def _raw_header(path, text: str, data_bytes: int = 8) -> None:
    raw = text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)


def _entry(shape: str) -> str:
    return '{"w": {"dtype": "BF16", "shape": ' + shape + ', "data_offsets": [0, 8]}}'


DEEP = "[" * 100_000 + "]" * 100_000
JUST_TOO_DEEP = '{"a": ' * (MAX_JSON_DEPTH) + "1" + "}" * MAX_JSON_DEPTH  # json.loads takes it: the walk refuses it


@pytest.mark.parametrize("text, message", [
    (DEEP, f"nested more than {MAX_JSON_DEPTH} levels deep"),
    ('{"__metadata__": ' + JUST_TOO_DEEP + "}", f"nested more than {MAX_JSON_DEPTH} levels deep"),
    (_entry("[" + str(10**400) + "]"), "needs more than"),
    (_entry(json.dumps([10**9] * 200_000)), "not a list of sizes (at most 64 of them)"),
    (_entry("[" + "9" * 5000 + "]"), "not JSON"),
    (_entry("[true, 4]"), "not a list of sizes"),
], ids=["100000 deep", "65 deep", "10**400", "200000 dims", "5000 digits", "a bool"])
def test_an_absurd_header_is_one_data_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "model.safetensors"
    _raw_header(path, text)
    with pytest.raises(DataError) as err:
        read_safetensors_header(path)
    assert str(path) in err.value.message and message in err.value.message, err.value.message


def test_a_config_or_index_nested_thousands_deep_is_one_data_error_naming_it(tmp_path):
    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(DataError, match="config.json: the config is nested more than"):
        read_config(tmp_path)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", (2, 2))})
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ' + DEEP + "}")
    with pytest.raises(DataError, match="model.safetensors.index.json: the safetensors index is nested more than"):
        read_safetensors_index(tmp_path)


def test_sglang_s_expert_width_reads_past_a_config_it_cannot_use(tmp_path):
    from sparkit.engines.sglang.rules import expert_width

    (tmp_path / "config.json").write_text(DEEP)
    assert expert_width(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"moe_intermediate_size": 768}')
    assert expert_width(str(tmp_path)) == 768


def test_json_at_the_depth_a_real_config_has_is_read():
    nested = {"quantization_config": {"config_groups": {"group_0": {"weights": {"num_bits": 4}}}}}
    assert load_json(json.dumps(nested), "config.json") == nested
