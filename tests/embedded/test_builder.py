"""Builder and tokenizer: builds defined by steps and seed (identical on an idle and a loaded
machine, reproducing the shipped checkpoint), the quality gate, build reuse and clean-up, atomic
builds, the tokenizer's round trip and chat template, and clear errors for corrupt checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from sparkit.engines.embedded.quality import measure_quality  # noqa: E402
from sparkit.errors import LaunchError, UsageError  # noqa: E402
from sparkit.models import builder, checkpoint  # noqa: E402
from sparkit.models.builder import BuildSpec  # noqa: E402
from sparkit.models.catalog import BUILTIN_MODELS  # noqa: E402
from sparkit.models.tiny_ling import family  # noqa: E402


# Every test of quick_build is `slow`: the build trains a model (12 s, 30 s beside other work), and
# one quick test using it would bring that into the quick loop.
@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
    """A real (very briefly trained) build made through ensure_model."""
    directory = tmp_path_factory.mktemp("quick") / "tiny"
    messages = []
    path = builder.ensure_model(directory=directory, seed=3, steps=2, progress=lambda f, m: messages.append((f, m)))
    return path, messages


def _weights(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / checkpoint.WEIGHTS))


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_the_shipped_build_is_the_default_spec_and_passed_the_gate(name):
    spec = BuildSpec(name)
    shipped = spec.family.shipped_dir / spec.dir_name
    assert builder.is_complete(shipped, spec), f"rebuild it: sparkit model make-tiny --model {name} {shipped}"
    assert builder.builtin_model_dir(name) == shipped
    marker = checkpoint.read_marker(shipped)
    quality, gate = marker["quality"], spec.family.gate
    assert marker["train_steps"] == spec.family.default_steps and marker["seed"] == 0
    assert quality["heldout_loss"] <= gate.max_heldout_loss
    assert quality["accept_length"] >= gate.min_accept_length
    assert quality["unanswered_greetings"] == [] and quality["greetings"] > 50


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_the_builder_reproduces_the_shipped_checkpoints_first_steps(tmp_path, name):
    """The first TRAJECTORY_STEPS[0] steps of each family's default build, bit for bit: a change to
    the model, the corpus, the tokenizer or the training that was not followed by a rebuild (and a
    builder version bump) fails here. The build's numerics are portable across x86-64 CPUs; what
    they still depend on (torch's version, the architecture, the BLAS) is recorded in the marker
    and must match here (scripts/test pins torch: constraints.txt)."""
    spec = BuildSpec(name)
    shipped = checkpoint.read_marker(spec.family.shipped_dir / spec.dir_name)
    first = builder.TRAJECTORY_STEPS[0]
    here = builder.current_numerics()
    recorded = shipped["numerics"]
    if here["machine"] != recorded["machine"] or here["blas"] != recorded["blas"]:
        pytest.skip(f"the shipped build's trajectory was recorded on {recorded['machine']} with {recorded['blas']} "
                    f"BLAS; this is {here['machine']} with {here['blas']} (the bits cannot be compared)")
    assert builder.numerics_key(here) == builder.numerics_key(recorded), (
        f"the shipped build was made under {recorded}; this environment is {here} (install constraints.txt)")
    marker = builder.build_model(tmp_path, spec, stop_after=first)
    assert marker["train_steps"] == first
    assert marker["trajectory"][str(first)] in _known_trajectories(shipped, first)


def test_a_gated_build_without_a_measure_is_refused_before_it_trains(tmp_path):
    """The gate's measure comes from the engine above the builder (sparkit.engines.embedded.quality);
    a caller that asks for a gate and hands none learns it before the training, not after it."""
    with pytest.raises(TypeError, match="needs a measure"):
        builder.build_model(tmp_path / "build", BuildSpec("tiny-ling", 0, 2), gate=family.DEFAULT_GATE)
    assert not (tmp_path / "build" / checkpoint.WEIGHTS).exists()


def _cpu_signature() -> str:
    """'avx512f' or 'noavx512': what the builder's bits were seen to depend on. Not the model name:
    CI machines of one kind name their CPU 'Intel(R) Xeon(R) Processor' on one boot and '... @ 2.80GHz'
    on another, with the same bits."""
    from pathlib import Path

    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512f" if "avx512f" in flags else "noavx512"


def _known_trajectories(shipped: dict, steps: int) -> set:
    """The shipped marker's hash, and the one recorded for this CPU (tests/fixtures/builder-trajectories.json)
    at the current BUILDER_VERSION; on a CPU with neither, only the marker's."""
    from pathlib import Path

    known = {shipped["trajectory"][str(steps)]}
    if shipped.get("name", "tiny-ling") != "tiny-ling":  # the table records tiny-ling's builds
        return known
    table = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "builder-trajectories.json").read_text())
    entry = table["trajectories"].get(_cpu_signature())
    if entry and entry["builder_version"] == family.BUILDER_VERSION and entry["steps"] == steps:
        known.add(entry["hash"])
    return known


def test_the_builders_corpus_encoder_gives_the_saved_tokenizers_ids():
    """The builder encodes its corpus itself (a build must not depend on the installed
    tokenizers/transformers); the tokenizer it saves must agree id for id, special tokens
    written literally included."""
    import itertools

    from sparkit.models.tiny_ling import corpus, tokenizer

    saved = tokenizer.build_tokenizer()
    documents = list(itertools.islice(corpus.documents(0), 400)) + ["héllo 你好 🎉 <|user|>x<|eos|><|assistant|>", "<|bos|><|pad|>"]
    for doc in documents:
        assert tokenizer.encode_bytes(doc) == saved.encode(doc, add_special_tokens=False), doc


@pytest.mark.slow
def test_a_trainer_whose_numerics_are_not_portable_is_refused(tmp_path, monkeypatch):
    """The environment that makes a build portable must reach torch; a trainer started without
    it (here: ATen's AVX2 kernels forced back) fails the build instead of saving other bits."""
    monkeypatch.setitem(builder.PORTABLE_NUMERICS, "ATEN_CPU_CAPABILITY", "avx2")
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vectorised ATen kernels to fall back to")
    with pytest.raises(LaunchError, match="not DEFAULT"):
        builder.build_model(tmp_path, BuildSpec("tiny-ling", 0, 2))
    assert not (tmp_path / checkpoint.WEIGHTS).exists()


@pytest.mark.slow
def test_a_build_is_the_same_on_a_loaded_machine_and_another_seed_differs(tmp_path):
    """Steps and seed define the build: the same spec with a CPU-bound process beside the
    builder gives the same bytes; another seed does not."""
    spec = BuildSpec("tiny-ling", 0, 3)
    builder.build_model(tmp_path / "idle", spec)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        builder.build_model(tmp_path / "loaded", spec)
    finally:
        busy.kill()
        busy.wait()
    builder.build_model(tmp_path / "other", BuildSpec("tiny-ling", 1, 3))
    idle, loaded, other = (_weights(tmp_path / n) for n in ("idle", "loaded", "other"))
    assert idle.keys() == loaded.keys()
    assert all(torch.equal(idle[k], loaded[k]) for k in idle)
    assert not torch.equal(idle["embed_tokens.weight"], other["embed_tokens.weight"])
    assert (tmp_path / "idle" / checkpoint.MARKER).read_text() != ""


@pytest.mark.slow
def test_the_quality_gate_refuses_a_weak_model_and_caches_nothing(tmp_path):
    target = tmp_path / "weak"
    with pytest.raises(builder.WeakModelError, match="too weak") as info:
        builder.ensure_model(directory=target, seed=0, steps=2, gate=family.DEFAULT_GATE, measure=measure_quality)
    message = str(info.value)
    assert "held-out loss" in message and "not cached" in message and "--steps" in message
    assert not target.exists()
    assert not list(tmp_path.glob(".weak.building-*"))
    assert info.value.exit_code == 5


@pytest.mark.slow
def test_a_build_killed_mid_way_is_removed_by_the_next_build_whatever_its_pid(tmp_path):
    """SIGKILL a real builder while it trains; the next build in that directory removes what it
    left. Whether a leftover is dead is told by its lock, not its pid: one named after a live
    pid (pids are reused) goes too, and the directory of a builder at work stays."""
    import signal
    import time

    models = tmp_path / "models"
    models.mkdir()
    killed = subprocess.Popen([sys.executable, "-c",
                               "import sys; from sparkit.models.builder import ensure_model; "
                               "ensure_model(directory=sys.argv[1], seed=4, steps=100000, gate=False)", str(models / "big")])
    try:
        deadline = time.monotonic() + 300
        while not list(models.glob(".big.building-*")):
            assert killed.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    (leftover,) = models.glob(".big.building-*")
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
                               "print('locked', flush=True); time.sleep(600)", str(models / ".busy.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        at_work = models / f".busy.building-{holder.pid}"
        at_work.mkdir()
        reused = models / f".reused.building-{os.getppid()}"  # a dead builder's pid, now a live process's
        reused.mkdir()
        (models / ".reused.lock").touch()
        builder.ensure_model(directory=models / "small", seed=3, steps=1)
        assert not leftover.exists() and not reused.exists()
        assert at_work.exists()
    finally:
        holder.kill()
        holder.wait()
    builder.remove_dead_builds(models)  # its builder is gone now: so is its directory
    assert not at_work.exists()


@pytest.mark.slow
def test_autotokenizer_loads_the_build_and_round_trips_any_utf8(quick_build):
    from transformers import AutoTokenizer

    path, _ = quick_build
    tok = AutoTokenizer.from_pretrained(str(path))
    for text in ["hello world", "  spaces\tand\nnewlines ", "héllo wörld", "你好，世界", "emoji 🎉🚀", "\x00\x7f", "<|eos|> literally"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|eos|>"
    assert tok.convert_ids_to_tokens(tok.bos_token_id) == "<|bos|>"


@pytest.mark.slow
def test_chat_template_renders_turns_and_the_generation_prompt(quick_build):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(quick_build[0]))
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|bos|><|system|>Be brief.<|eos|><|user|>Hi<|eos|><|assistant|>"
    assert "chat_template" in json.loads((quick_build[0] / "tokenizer_config.json").read_text())


@pytest.mark.slow
def test_build_has_the_documented_files_and_config(quick_build):
    path, messages = quick_build
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", checkpoint.MARKER):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["TinyLingForCausalLM"]
    assert config["num_experts"] == 8 and config["top_k"] == 2 and config["num_nextn_predict_layers"] == 1
    assert config["torch_dtype"] == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for t in _weights(path).values())
    marker = checkpoint.read_marker(path)
    assert {k: marker[k] for k in ("builder_version", "name", "seed", "steps")} == BuildSpec("tiny-ling", 3, 2).key()
    assert messages[0][0] == 0.0 and messages[-1][0] == 1.0
    fractions = [f for f, _ in messages]
    assert fractions == sorted(fractions)
    assert not list(path.parent.glob(".*building*"))  # no temporary directory left behind


@pytest.mark.slow
def test_an_existing_complete_build_is_reused(quick_build):
    path, _ = quick_build
    before = (path / "model.safetensors").stat().st_mtime_ns
    messages = []
    again = builder.ensure_model(directory=path, seed=3, steps=2, progress=lambda f, m: messages.append(m))
    assert again == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    assert messages == [f"using existing build at {path}"]


@pytest.mark.slow
def test_a_build_of_another_spec_or_version_is_rebuilt(quick_build, tmp_path):
    path = tmp_path / "old"
    shutil.copytree(quick_build[0], path)
    assert not builder.is_complete(path, BuildSpec("tiny-ling", 3, 1))  # other steps
    marker = checkpoint.read_marker(path)
    (path / checkpoint.MARKER).write_text(json.dumps({**marker, "builder_version": family.BUILDER_VERSION - 1}))
    assert not builder.is_complete(path)
    builder.ensure_model(directory=path, seed=3, steps=1)
    assert builder.is_complete(path, BuildSpec("tiny-ling", 3, 1))


def test_default_location_is_the_user_cache_for_builds_that_do_not_ship(sparkit_home):
    assert builder.builtin_model_dir("tiny-ling", 2) == sparkit_home / "cache" / "models" / "tiny-ling-s2"
    assert builder.builtin_model_dir("tiny-ling", 1, 40) == sparkit_home / "cache" / "models" / "tiny-ling-s1-n40"
    with pytest.raises(UsageError, match="unknown built-in model"):
        builder.builtin_model_dir("huge-ling", 0)
    with pytest.raises(UsageError, match="at least one training step"):
        BuildSpec("tiny-ling", 0, 0)


def test_refuses_to_overwrite_a_directory_that_is_not_a_build(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a tiny-ling build"):
        builder.ensure_model(directory=tmp_path, steps=1)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_truncated_checkpoint_fails_with_a_message_naming_the_file(quick_build, tmp_path):
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    path = tmp_path / "corrupt"
    shutil.copytree(quick_build[0], path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(LaunchError, match="model.safetensors") as info:
        EmbeddedEngine(EngineConfig(model_path=str(path)))
    assert str(weights) in str(info.value)


@pytest.mark.slow
def test_garbage_config_and_missing_directory_fail_clearly(quick_build, tmp_path):
    path = tmp_path / "badconfig"
    shutil.copytree(quick_build[0], path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(LaunchError, match="config.json"):
        checkpoint.load_checkpoint(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(LaunchError, match="TinyLingForCausalLM"):
        checkpoint.load_checkpoint(path)
    with pytest.raises(LaunchError, match="does not exist"):
        checkpoint.load_checkpoint(tmp_path / "nowhere")


@pytest.mark.slow
def test_weights_that_do_not_match_the_config_are_named(quick_build, tmp_path):
    path = tmp_path / "mismatch"
    shutil.copytree(quick_build[0], path)
    config = json.loads((path / "config.json").read_text())
    config["num_experts"] = 4
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LaunchError, match="does not match"):
        checkpoint.load_checkpoint(path)


@pytest.mark.slow
def test_make_tiny_cli_builds_and_reports_json(tmp_path):
    from typer.testing import CliRunner

    from sparkit.cli.main import app

    target = tmp_path / "cli-tiny"
    result = CliRunner().invoke(app, ["model", "make-tiny", str(target), "--seed", "5", "--steps", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["path"] == str(target) and data["seed"] == 5 and data["steps"] == 2
    assert data["builder_version"] == family.BUILDER_VERSION
    assert builder.is_complete(target, BuildSpec("tiny-ling", 5, 2))


@pytest.mark.slow
def test_make_tiny_cli_builds_tiny_ling_v3_when_asked(tmp_path):
    from typer.testing import CliRunner

    from sparkit.cli.main import app
    from sparkit.models.tiny_ling_v3 import family as v3

    target = tmp_path / "cli-v3"
    result = CliRunner().invoke(app, ["model", "make-tiny", str(target), "--model", "tiny-ling-v3", "--steps", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["name"] == "tiny-ling-v3" and data["builder_version"] == v3.BUILDER_VERSION and data["steps"] == 2
    assert json.loads((target / "config.json").read_text())["architectures"] == ["TinyLingV3ForCausalLM"]
    assert builder.is_complete(target, BuildSpec("tiny-ling-v3", 0, 2))


def test_make_tiny_cli_names_the_models_it_knows_for_an_unknown_one(tmp_path):
    import subprocess
    import sys

    # the real command line: its exit codes are set where sparkit's errors are rendered (cli.main)
    result = subprocess.run([sys.executable, "-m", "sparkit", "model", "make-tiny", str(tmp_path / "x"), "--model",
                             "tiny-ling-v9"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unknown built-in model 'tiny-ling-v9'" in result.stderr and "tiny-ling, tiny-ling-v3" in result.stderr
    assert not (tmp_path / "x").exists()
