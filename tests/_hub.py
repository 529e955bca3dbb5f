"""Test helpers: a local hub for huggingface_hub's own client: repositories of tiny-ling's Hugging Face exports in
several shard layouts (and a sparse Ling-3.0-flash-fp4 for the memory fit at real size), served
by tests/hub_server.py, a real process on a real socket (HF_ENDPOINT points the client at it).

Repositories (what each test expects the engine to read is written out in the tests):
- sparkit-test/tiny-ling         main: the bf16 export, one model.safetensors, plus files the
                                 engine never reads (README.md, .gitattributes, pytorch_model.bin,
                                 consolidated.safetensors, original/model.safetensors, an image);
                                 v0: the float32 export (10.1 MiB: a file over huggingface_hub's 10 MiB
                                 write chunk, for resuming mid-file)
- sparkit-test/tiny-ling-sharded the bf16 export in 3 shards + their index, beside a stale shard of
                                 an older 2-shard layout the index does not name
- sparkit-test/tiny-ling-fp32    the float32 export in 2 shards + index (another variant's repository)
- sparkit-test/tiny-ling-gated   main of tiny-ling, gated; sparkit-test/tiny-ling-private: private
- inclusionAI/Ling-3.0-flash-fp4 scripts/make_sparse_ling.py's headers over holes (range reads only)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from _shared import REPO_DIR

SERVER = Path(__file__).resolve().parent / "hub_server.py"
TOKEN = "hf_test_granted"
NOT_GRANTED = "hf_test_not_granted"
ENGINE_FILES = {"config.json", "configuration_bailing_moe_v2.py", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja"}


def commit(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def _export(tmp: Path, dtype: str) -> Path:
    from sparkit.models.builder import BuildSpec
    from sparkit.models.checkpoint import export_hf
    from sparkit.models.tiny_ling.family import SHIPPED_DIR

    destination = tmp / f"export-{dtype}"
    export_hf(SHIPPED_DIR / BuildSpec().dir_name, destination, dtype)
    (destination / ".sparkit-export.json").unlink()  # sparkit's own marker: not a hub file
    return destination


def _shard(source: Path, destination: Path, shards: int, stale: int | None = None) -> None:
    """`source`'s model.safetensors split into `shards` files with an index (and, with `stale`, the
    first shard of an older layout of `stale` files that the index does not name)."""
    from safetensors.torch import load_file, save_file

    destination.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "model.safetensors":
            shutil.copy2(f, destination / f.name)
    state = load_file(str(source / "model.safetensors"))
    names = list(state)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[s * per:(s + 1) * per]}
        save_file(part, str(destination / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (destination / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    if stale:
        first = {n: state[n] for n in names[:math.ceil(len(names) / stale)]}
        save_file(first, str(destination / f"model-00001-of-{stale:05d}.safetensors"), metadata={"format": "pt"})


def _noise(directory: Path) -> None:
    """Files a real repository carries that no engine reads."""
    (directory / "README.md").write_text("# tiny-ling\nA 3.75M-parameter MoE.\n")
    (directory / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (directory / "pytorch_model.bin").write_bytes(os.urandom(200_000))
    shutil.copy2(directory / "model.safetensors", directory / "consolidated.safetensors")
    (directory / "original").mkdir()
    shutil.copy2(directory / "model.safetensors", directory / "original" / "model.safetensors")
    (directory / "images").mkdir()
    (directory / "images" / "diagram.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(4000))


@dataclass
class Hub:
    url: str
    cdn: str
    root: Path
    proc: subprocess.Popen
    ling_dir: Path  # the sparse Ling-3.0-flash-fp4 checkpoint the server serves

    def control(self, **command) -> dict:
        import httpx

        # json.dumps, not httpx's encoder: a hostile hub's lies include numbers JSON has no word for (Infinity)
        return httpx.post(f"{self.url}/_control", content=json.dumps(command), timeout=30,
                          headers={"Content-Type": "application/json"}).json()

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"{self.url}/_control/stats", timeout=30).json()

    def served(self, repo: str, path: str) -> int:
        return self.stats()["served"].get(f"{repo}/{path}", 0)

    def add_repo(self, repo: str, files: dict[str, bytes | str], generate: dict | None = None) -> str:
        """A repository the hub serves from memory until the next reset (tests/hub_server.py's
        "repo"); its commit."""
        import base64

        body = {p: {"base64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v for p, v in files.items()}
        return self.control(op="repo", repo=repo, files=body, **({"generate": generate} if generate else {}))["commit"]

    def lie(self, repo: str, where: str, values: dict, path: str | None = None, first: int = 1) -> None:
        """From now on the hub says `values` in `repo`'s model info ("info"), in `path`'s listing
        entry ("listing") or in the headers of `path`'s HEAD answers from the `first`-th on ("head")."""
        self.control(op="lie", repo=repo, where=where, path=path, set=values, **{"from": first})


def build_repos(root: Path, work: Path) -> Path:
    """The repositories above, under `root` (repos.json and each commit's files); `work` is scratch."""
    bf16, fp32 = _export(work, "bfloat16"), _export(work, "float32")
    repos: dict = {}

    def add(repo: str, refs: dict[str, Path], *, in_place: bool = False, **flags) -> None:
        commits = {}
        spec_refs = {}
        for ref, source in refs.items():
            c = commit(f"{repo}@{ref}")
            if in_place:  # served where it is (a sparse checkpoint: a copy would write its holes)
                commits[c] = str(source.resolve())
            else:
                rel = f"files/{repo}/{c}"
                shutil.copytree(source, root / rel, symlinks=False)
                commits[c] = rel
            spec_refs[ref] = c
        repos[repo] = {"refs": spec_refs, "commits": commits, **flags}

    main = work / "tiny-ling-main"
    shutil.copytree(bf16, main)
    _noise(main)
    add("sparkit-test/tiny-ling", {"main": main, "v0": fp32})
    sharded = work / "sharded"
    _shard(bf16, sharded, 3, stale=2)
    (sharded / "README.md").write_text("# tiny-ling, sharded\n")
    add("sparkit-test/tiny-ling-sharded", {"main": sharded})
    fp32_sharded = work / "fp32-sharded"
    _shard(fp32, fp32_sharded, 2)
    add("sparkit-test/tiny-ling-fp32", {"main": fp32_sharded})
    add("sparkit-test/tiny-ling-gated", {"main": main}, gated="auto")
    add("sparkit-test/tiny-ling-private", {"main": main}, private=True)
    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO_DIR / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ling = module.write_checkpoint(work / "ling-fp4", "fp4")
    add("inclusionAI/Ling-3.0-flash-fp4", {"main": ling}, in_place=True, unhashed=True)
    (root / "repos.json").write_text(json.dumps(repos, indent=1))
    (root / "ling-dir").write_text(str(ling.resolve()))
    return root




def start_hub(root: Path) -> Hub:
    """tests/hub_server.py over `root`, listening (a real process on two real sockets)."""
    proc = subprocess.Popen([sys.executable, str(SERVER), str(root)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("api="):
        proc.kill()
        raise RuntimeError(f"the test hub did not start: {line!r}")
    ports = dict(part.split("=") for part in line.split())
    return Hub(f"http://127.0.0.1:{ports['api']}", f"http://127.0.0.1:{ports['cdn']}", root, proc,
               Path((root / "ling-dir").read_text()))


def run_sparkit(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def snapshot(env: dict, repo: str, rev: str = "main") -> Path:
    root = Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--"))
    return root / "snapshots" / (root / "refs" / rev).read_text().strip()


def served_files(hub: Hub, repo: str) -> dict[str, int]:
    prefix = repo + "/"
    return {k[len(prefix):]: v for k, v in hub.stats()["served"].items() if k.startswith(prefix)}


def one_error(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert "hint: " in done.stderr
    return " ".join(done.stderr.split())


class Pulling:
    """A `sparkit pull` process whose stderr is read line by line as it runs (tests/hub/conftest.py
    kills one a failed test left running)."""

    started: list[Pulling] = []

    def __init__(self, env: dict, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "sparkit", "pull", *args], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        Pulling.started.append(self)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, predicate, what: str, limit: float = 300) -> None:
        """Read stderr until a line satisfies `predicate` (`limit` only ends a test that hangs)."""
        while True:
            line = self.lines.get(timeout=limit)
            if line is None:
                raise AssertionError(f"sparkit pull ended before {what}: {self.seen[-20:]}")
            self.seen.append(line)
            if predicate(line):
                return

    def wait(self) -> str:
        self.proc.wait(timeout=300)
        while True:
            line = self.lines.get(timeout=60)
            if line is None:
                return "\n".join(self.seen)
            self.seen.append(line)
