"""Which files of a repository the engine reads (sparkit.hub.files): the rule, layout by layout,
on listings written here (the end-to-end tests check the same sets against the local hub)."""

from __future__ import annotations

import pytest

from sparkit.errors import DataError
from sparkit.hub.files import RemoteFile, select_files
from sparkit.hub.refs import HubRef, parse_hub_ref


def listing(*paths: str) -> dict[str, RemoteFile]:
    out = {}
    for i, p in enumerate(paths):
        lfs = p.endswith((".safetensors", ".bin", ".png"))
        out[p] = RemoteFile(p, 1000 + i, f"{i:040x}", f"{i:064x}" if lfs else None)
    return out


HF_EXPORT = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "configuration_bailing_moe_v2.py")
NOISE = ("README.md", ".gitattributes", "pytorch_model.bin", "original/model.safetensors", "images/diagram.png",
         "original/tokenizer.model", "scripts/convert.py", "original/chat_template.jinja")
AUTO_MAP = {"auto_map": {"AutoConfig": "configuration_bailing_moe_v2.BailingMoeV2Config"}}


def test_one_file_checkpoint_reads_its_metadata_and_model_safetensors_only():
    files = listing(*HF_EXPORT, "model.safetensors", "consolidated.safetensors", *NOISE)
    chosen = select_files(files, AUTO_MAP, None, "org/m")
    assert set(chosen.files) == {*HF_EXPORT, "model.safetensors"}
    skipped = dict(chosen.skipped)
    assert set(skipped) == {"consolidated.safetensors", *NOISE}
    assert "model.safetensors (no index)" in skipped["consolidated.safetensors"]
    assert chosen.files[-1] == "model.safetensors"  # weights last, metadata first


def test_an_index_names_exactly_the_shards_and_a_stale_layout_beside_it_is_skipped():
    shards = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    files = listing(*HF_EXPORT, "model.safetensors.index.json", *shards, "model-00001-of-00002.safetensors",
                    "model-00002-of-00002.safetensors", "README.md")
    index = {"weight_map": {"a": shards[0], "b": shards[1], "c": shards[2], "d": shards[2]}}
    chosen = select_files(files, AUTO_MAP, index, "org/m")
    assert chosen.files[-3:] == shards and "model.safetensors.index.json" in chosen.files
    assert {p for p, _ in chosen.skipped} == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                              "README.md"}
    assert chosen.weights == "the 3 shard(s) model.safetensors.index.json names"


def test_remote_code_only_with_an_auto_map_and_tokenizer_files_by_name():
    files = listing("config.json", "modeling_x.py", "configuration_x.py", "tokenizer.model", "merges.txt",
                    "vocab.txt", "qwen.tiktoken", "additional_chat_templates/tool_use.jinja", "model.safetensors")
    without = select_files(files, {"architectures": ["X"]}, None, "org/m")
    assert "modeling_x.py" not in without.files and "configuration_x.py" not in without.files
    assert "config.json has no auto_map" in dict(without.skipped)["modeling_x.py"]
    assert {"tokenizer.model", "merges.txt", "vocab.txt", "qwen.tiktoken",
            "additional_chat_templates/tool_use.jinja"} <= set(without.files)
    with_code = select_files(files, {"auto_map": {"AutoModel": "modeling_x.X"}}, None, "org/m")
    assert {"modeling_x.py", "configuration_x.py"} <= set(with_code.files)


def test_no_index_no_single_file_loads_every_top_level_safetensors():
    files = listing("config.json", "a.safetensors", "b.safetensors", "sub/c.safetensors")
    chosen = select_files(files, {}, None, "org/m")
    assert chosen.files[-2:] == ["a.safetensors", "b.safetensors"] and "sub/c.safetensors" not in chosen.files


@pytest.mark.parametrize("paths,index,message", [
    (("config.json", "pytorch_model.bin"), None, "has no safetensors weights"),
    (("model.safetensors",), None, "has no config.json"),
    (("config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"),
     {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}},
     "names 1 file(s) the repository does not have, e.g. model-00002-of-00002.safetensors"),
    (("config.json", "model.safetensors.index.json", "model.safetensors"), {"weights": {}}, "no weight_map"),
])
def test_a_repository_the_engine_cannot_load_is_a_data_error_naming_it(paths, index, message):
    with pytest.raises(DataError) as info:
        select_files(listing(*paths), {}, index, "org/m@abc")
    assert message in info.value.message and "org/m@abc" in info.value.message


@pytest.mark.parametrize("text,ref", [
    ("inclusionAI/Ling-3.0-flash-fp4", HubRef("inclusionAI/Ling-3.0-flash-fp4")),
    ("org/name@v1.2", HubRef("org/name", "v1.2")),
    ("org/name@refs/pr/3", HubRef("org/name", "refs/pr/3")),
    ("org/name@" + "a" * 40, HubRef("org/name", "a" * 40)),
    ("/models/x", None), ("./x/y", None), ("~/x/y", None), ("sparkit:tiny-ling", None), ("just-a-name", None),
    ("org/name@", None), ("org/name@../x", None), ("a/b/c", None), ("org/name@with space", None),
])
def test_hub_references(text, ref):
    assert parse_hub_ref(text) == ref
    if ref is not None:
        assert str(ref) == text and ref.pinned == (ref.revision == "a" * 40)
