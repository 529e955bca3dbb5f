"""The DSpark draft builder: the shipped draft is the default spec and passed its gate, a build is
defined by its spec (the shipped draft's first steps rebuilt bit for bit; the same short build
twice, the same bytes; another seed, others), the gate refuses a weak draft and keeps nothing, an
untrained draft is its seeded initialisation, and the draft's files are what SGLang loads."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from sparkit.models.dspark import builder  # noqa: E402
from sparkit.models.dspark.builder import DraftSpec  # noqa: E402
from sparkit.models.dspark.checkpoint import MARKER, WEIGHTS, load_draft, read_marker  # noqa: E402


def _weights(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / WEIGHTS))


@pytest.mark.parametrize("draft, target", [("tiny-ling-dspark", "tiny-ling"), ("tiny-ling-v3-dspark", "tiny-ling-v3")])
def test_the_shipped_draft_is_the_default_spec_and_passed_the_gate(draft, target, request):
    """Each shipped draft (tiny-ling's, tiny-ling-v3's) is its default spec's build, it passed the gate
    against its own target's NEXTN 3/1/4, and its marker names the shipped target build."""
    draft_dir = request.getfixturevalue("dspark_draft_dir" if target == "tiny-ling" else "v3_dspark_draft_dir")
    target_dir = request.getfixturevalue("tiny_model_dir" if target == "tiny-ling" else "v3_model_dir")
    assert builder.builtin_draft_dir(draft) == draft_dir
    marker = read_marker(draft_dir)
    quality, gate = marker["quality"], builder.DEFAULT_GATE
    assert marker["train_steps"] == builder.DEFAULT_TRAIN_STEPS and marker["seed"] == 0
    assert quality["accept_length"] >= gate.min_accept_length
    assert quality["accept_length"] >= quality["nextn_accept_length"]
    from sparkit.models.checkpoint import read_marker as read_target_marker

    built = read_target_marker(target_dir)
    assert marker["target"] == {"name": target, **{k: built[k] for k in ("name", "seed", "steps", "builder_version")}}


@pytest.mark.slow
def test_the_builder_reproduces_the_shipped_drafts_first_steps(tmp_path, dspark_draft_dir):
    """The first TRAJECTORY_STEPS[0] steps of the shipped build (its data's first sequences, its
    schedule), bit for bit: a change to the draft, its data or its training that was not followed
    by a rebuild and a BUILDER_VERSION bump fails here."""
    from sparkit.models.builder import current_numerics, numerics_key

    shipped = read_marker(dspark_draft_dir)
    here, recorded = current_numerics(1), shipped["numerics"]
    if here["machine"] != recorded["machine"] or here["blas"] != recorded["blas"]:
        pytest.skip(f"recorded on {recorded['machine']} with {recorded['blas']} BLAS; this is {here['machine']} "
                    f"with {here['blas']} (the bits cannot be compared)")
    assert numerics_key(here) == numerics_key(recorded)
    first = builder.TRAJECTORY_STEPS[0]
    marker = builder.build_draft(tmp_path, DraftSpec(), stop_after=first)
    assert marker["train_steps"] == first and marker["sequences"] == first * builder.BATCH
    assert marker["trajectory"][str(first)] == shipped["trajectory"][str(first)]


@pytest.mark.slow
def test_a_build_is_its_spec_and_another_seed_differs(tmp_path):
    spec = DraftSpec(steps=2)
    builder.build_draft(tmp_path / "a", spec)
    builder.build_draft(tmp_path / "b", spec)
    builder.build_draft(tmp_path / "other", DraftSpec(seed=1, steps=2))
    a, b, other = (_weights(tmp_path / n) for n in ("a", "b", "other"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc.weight"], other["fc.weight"])


@pytest.mark.slow
def test_the_gate_refuses_a_weak_draft_and_caches_nothing(tmp_path):
    """Two steps of training cannot clear the gate's accept length; the figures come from the
    engine that would serve the draft (two held-out prompts, to keep the test short)."""
    from sparkit.engines.embedded.quality import measure_draft_quality

    target = tmp_path / "weak"
    with pytest.raises(builder.WeakModelError, match="too weak") as info:
        builder.ensure_draft(directory=target, steps=2, gate=builder.DEFAULT_GATE,
                             measure=lambda d, t: measure_draft_quality(d, t, prompts=2))
    message = str(info.value)
    assert "DSpark accept length" in message and "NEXTN's" in message and "not cached" in message
    assert not target.exists() and not list(tmp_path.glob(".weak.building-*"))
    assert info.value.exit_code == 5


def test_a_draft_trained_against_an_older_target_build_is_not_reused(v3_dspark_draft_dir, tmp_path):
    """A draft drafts for the target it was trained against: once the target's builder makes another
    model (its BUILDER_VERSION bumped), the draft built for the old one is rebuilt, not served."""
    import shutil

    spec = DraftSpec("tiny-ling-v3-dspark")
    copy = tmp_path / v3_dspark_draft_dir.name
    shutil.copytree(v3_dspark_draft_dir, copy)
    assert builder.is_complete(copy, spec)
    marker = json.loads((copy / MARKER).read_text())
    marker["target"]["builder_version"] -= 1
    (copy / MARKER).write_text(json.dumps(marker))
    assert not builder.is_complete(copy, spec)


def test_an_untrained_draft_is_its_seeded_initialisation(random_draft_dir):
    from sparkit.models.dspark.model import LingDSparkModel

    marker = read_marker(random_draft_dir)
    assert (marker["steps"], marker["train_steps"], marker["trajectory"]) == (0, 0, {})
    cfg, draft = load_draft(random_draft_dir)
    torch.manual_seed(0)
    fresh = LingDSparkModel(cfg)
    torch.manual_seed(1)
    other = LingDSparkModel(cfg)
    for name, value in fresh.state_dict().items():
        # the same draws (bf16 on disk; the builder's portable kernels round the scaling differently
        # from this process's own by an ulp), far from another seed's
        assert torch.allclose(draft.state_dict()[name], value, atol=2e-3, rtol=1e-2), name
        if value.numel() > 1 and value.std() > 0:
            assert not torch.allclose(draft.state_dict()[name], other.state_dict()[name], atol=2e-3, rtol=1e-2), name


def test_the_draft_files_are_sglangs_layout_with_the_targets_tokenizer(dspark_draft_dir, tiny_model_dir):
    from sparkit.models.dspark.config import tensor_names

    config = json.loads((dspark_draft_dir / "config.json").read_text())
    assert config["architectures"] == ["LingDSparkModel"] and config["model_type"] == "qwen3"
    cfg, _ = load_draft(dspark_draft_dir)
    assert sorted(_weights(dspark_draft_dir)) == sorted(tensor_names(cfg))
    assert not any(n.startswith(("embed_tokens.", "lm_head.")) for n in tensor_names(cfg))  # the target's
    assert (dspark_draft_dir / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    assert (dspark_draft_dir / MARKER).is_file()


def test_a_draft_with_a_missing_tensor_is_refused_naming_it(dspark_draft_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    from sparkit.errors import LaunchError

    broken = tmp_path / "draft"
    shutil.copytree(dspark_draft_dir, broken)
    state = _weights(broken)
    del state["markov_head.markov_w2.weight"]
    save_file(state, str(broken / WEIGHTS))
    with pytest.raises(LaunchError, match="missing markov_head.markov_w2.weight"):
        load_draft(broken)
    (broken / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(LaunchError, match=r"config.json: architectures \['Qwen3ForCausalLM'\] does not include LingDSparkModel"):
        load_draft(broken)


def test_export_writes_what_sglang_loads_and_refuses_to_overwrite_other_files(dspark_draft_dir, tmp_path):
    from sparkit.errors import UsageError
    from sparkit.models.dspark.checkpoint import EXPORT_MARKER, export

    marker = export(dspark_draft_dir, tmp_path / "out")
    assert marker["block_size"] == 8 and (tmp_path / "out" / EXPORT_MARKER).is_file()
    for name in ("config.json", WEIGHTS, "tokenizer.json"):
        assert (tmp_path / "out" / name).read_bytes() == (dspark_draft_dir / name).read_bytes()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a sparkit export"):
        export(dspark_draft_dir, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_draft_for_tiny_ling_v3_has_its_widths_and_sglangs_capture_points(v3_short_draft_dir, v3_model_dir):
    """sparkit:tiny-ling-v3-dspark: the V3 target's widths (config.json), its 4 layers, the
    residual stream after layers 1 and 3 (what set_dspark_layers_to_capture hands out for those
    ids), and its marker names the V3 target build it was trained against."""
    from sparkit.models.checkpoint import read_marker as read_target_marker

    target = json.loads((v3_model_dir / "config.json").read_text())
    config = json.loads((v3_short_draft_dir / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"], config["num_target_layers"]) == (
        target["hidden_size"], target["vocab_size"], target["num_hidden_layers"])
    assert config["target_layer_ids"] == config["dspark_config"]["target_layer_ids"] == [1, 3]
    assert config["rope_theta"] == target["rope_theta"]
    marker, built = read_marker(v3_short_draft_dir), read_target_marker(v3_model_dir)
    assert marker["name"] == "tiny-ling-v3-dspark" and marker["train_steps"] > 0
    assert marker["target"] == {"name": "tiny-ling-v3", **{k: built[k] for k in ("name", "seed", "steps", "builder_version")}}
