"""The Hugging Face cache, read as huggingface_hub lays it out, and what sparkit verified in it.

    $HF_HUB_CACHE/models--ORG--NAME/
        blobs/<etag>                 the file's bytes (etag: the LFS sha256, else the git oid)
        blobs/<etag>.incomplete      a download `sparkit pull` resumes (the name older
                                     huggingface_hub releases resumed from too)
        snapshots/<commit>/<path>    relative symlinks to the blobs: the directory engines load
        refs/<revision>              the commit a branch or tag pointed at when last resolved

Every HF tool (SGLang, transformers, huggingface-cli) finds a model pulled here. What sparkit
verified (each file's size and hash, checked against the hub's) is recorded in sparkit's own
cache, per commit (`pulls/models--ORG--NAME/<commit>.json`, private), so that `sparkit up` knows
a model is complete without hashing 70 GB again; a file whose size or modification time changed
since it was verified is verified again by the next pull.

Nothing here touches the network or imports huggingface_hub (the recipe compiler uses it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import HubError
from sparkit.hub import untrusted
from sparkit.hub.files import CONFIG_FILE, INDEX_FILE, SINGLE_FILE
from sparkit.hub.refs import COMMIT, HubRef, model_hub_ref, parse_hub_ref
from sparkit.paths import cache_dir, ensure_dir, write_atomic

RECORD_VERSION = 1
PARTIAL_SUFFIX = ".incomplete"


def hub_cache() -> Path:
    """The hub cache as huggingface_hub resolves it: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE,
    HF_HOME/hub, else $XDG_CACHE_HOME (~/.cache)/huggingface/hub."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "huggingface" / "hub"


def repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def repo_dir(repo: str) -> Path:
    return hub_cache() / repo_folder(repo)


# The names below are made only of checked ids (sparkit.hub.untrusted): a hash or a commit that is
# a path never leaves the cache, whatever path led it here.

def _blob_name(repo: str, etag: str) -> str:
    if not untrusted.is_etag(etag):
        raise untrusted.refused(f"the Hugging Face cache of {repo}", "etag", etag,
                                "a blob name (a git object id or an LFS sha256)")
    return etag


def blob_path(repo: str, etag: str) -> Path:
    return repo_dir(repo) / "blobs" / _blob_name(repo, etag)


def partial_path(repo: str, etag: str) -> Path:
    return repo_dir(repo) / "blobs" / (_blob_name(repo, etag) + PARTIAL_SUFFIX)


def lock_path(repo: str, etag: str) -> Path:
    """Where huggingface_hub locks a blob while it is written (the same lock file, so the two never
    write one blob at once)."""
    return hub_cache() / ".locks" / repo_folder(repo) / f"{_blob_name(repo, etag)}.lock"


def snapshot_dir(repo: str, commit: str) -> Path:
    return repo_dir(repo) / "snapshots" / untrusted.commit(commit, f"the Hugging Face cache of {repo}", "commit")


def local_commit(ref: HubRef) -> str | None:
    """The commit `ref` names here: its revision when that is a commit, else what refs/<revision>
    recorded when it was last resolved (None: never resolved on this machine)."""
    if ref.pinned:
        return ref.revision
    try:
        commit = (repo_dir(ref.repo) / "refs" / ref.rev).read_text().strip()
    except OSError:
        return None
    return commit if COMMIT.fullmatch(commit) else None


def remember_commit(repo: str, revision: str, commit: str) -> None:
    """refs/<revision> = commit, as huggingface_hub writes it (atomically; nothing for a revision
    that is the commit itself). Best effort: a read-only cache keeps its old ref."""
    if revision == commit:
        return
    ref_path = repo_dir(repo) / "refs" / revision
    try:
        if ref_path.is_file() and ref_path.read_text() == commit:
            return
        ref_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref_path.with_name(f"{ref_path.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref_path)
    except OSError:
        pass


# ------------------------------------------------------------------------------ sparkit's record

def record_path(repo: str, commit: str) -> Path:
    return cache_dir() / "pulls" / repo_folder(repo) / f"{untrusted.commit(commit, f'sparkit record of {repo}', 'commit')}.json"


def load_record(repo: str, commit: str) -> dict[str, Any] | None:
    """sparkit's record of `repo` at `commit`; None when there is none, or it is not one sparkit
    writes (another version, a file it names by a path rather than a hash: an older sparkit
    recorded what a hostile hub listed)."""
    try:
        data = json.loads(record_path(repo, commit).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or not isinstance(data.get("files"), dict):
        return None
    return data if all(_sound_entry(p, e) for p, e in data["files"].items()) else None


def _sound_entry(path: Any, entry: Any) -> bool:
    try:
        untrusted.file_name(path, "record")
        untrusted.size(entry["size"], "record")
        sha256 = entry.get("sha256")
        return entry["etag"] == (sha256 or entry.get("blob_id")) and untrusted.is_etag(entry["etag"])
    except (HubError, KeyError, TypeError, AttributeError):
        return False


def save_record(record: dict[str, Any]) -> Path:
    path = record_path(record["repo"], record["commit"])
    ensure_dir(path.parent)
    record["version"] = RECORD_VERSION
    record["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def file_stat(path: Path) -> dict[str, int] | None:
    """What a verification is pinned to: the size and modification time of the file (the blob
    behind a snapshot's symlink)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def still_verified(entry: dict[str, Any], path: Path) -> bool:
    """The file at `path` is the one verified: its size and mtime are those recorded then."""
    verified = entry.get("verified")
    return bool(verified) and file_stat(path) == verified and verified.get("size") == entry.get("size")


# ------------------------------------------------------------------------------ is it here?

@dataclass
class LocalCopy:
    """A hub model on this machine, as far as the cache and sparkit's record tell."""

    ref: HubRef
    commit: str | None
    path: Path | None  # the snapshot directory (what an engine loads)
    state: str  # "verified" | "unverified" (complete, not verified by sparkit) | "incomplete" | "absent"
    detail: str
    missing: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.state in ("verified", "unverified")


def _structurally_complete(snapshot: Path) -> list[str]:
    """What a snapshot no record describes lacks of a loadable checkpoint (config.json and the
    weights its index names, or model.safetensors, or some *.safetensors)."""
    missing = [] if (snapshot / CONFIG_FILE).is_file() else [CONFIG_FILE]
    index = snapshot / INDEX_FILE
    if index.is_file():
        try:
            names = sorted({str(v) for v in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return missing + [f"{INDEX_FILE} (unreadable)"]
        missing += [n for n in names if not (snapshot / n).is_file()]
    elif not (snapshot / SINGLE_FILE).is_file() and not any(p.is_file() for p in snapshot.glob("*.safetensors")):
        missing.append("*.safetensors")
    return missing


def local_copy(ref: HubRef) -> LocalCopy:
    """Whether `ref` is complete in the Hugging Face cache (no network)."""
    commit = local_commit(ref)
    if commit is None:
        return LocalCopy(ref, None, None, "absent", f"not in the Hugging Face cache {hub_cache()}")
    snapshot = snapshot_dir(ref.repo, commit)
    if not snapshot.is_dir():
        return LocalCopy(ref, commit, None, "absent", f"commit {commit[:12]} is not in the Hugging Face cache {hub_cache()}")
    record = load_record(ref.repo, commit)
    if record is None:
        missing = _structurally_complete(snapshot)
        if missing:
            return LocalCopy(ref, commit, snapshot, "incomplete",
                             f"{snapshot} lacks {len(missing)} file(s) the engine reads, e.g. {missing[0]}", missing)
        return LocalCopy(ref, commit, snapshot, "unverified",
                         f"{snapshot} (downloaded by another tool: not verified against the hub's hashes)")
    entries: dict[str, dict] = record["files"]
    missing = [p for p in entries if not (snapshot / p).is_file()]
    wrong_size = [p for p, e in entries.items() if p not in missing and os.stat(snapshot / p).st_size != e.get("size")]
    if missing or wrong_size:
        gone = missing + wrong_size
        what = "missing" if missing else "of the wrong size"
        return LocalCopy(ref, commit, snapshot, "incomplete",
                         f"{len(gone)} of the {len(entries)} files the engine reads are {what}, e.g. {gone[0]}", gone)
    unverified = [p for p, e in entries.items() if not e.get("verified")]
    if unverified:
        return LocalCopy(ref, commit, snapshot, "incomplete",
                         f"a pull of it did not finish: {len(unverified)} of its {len(entries)} files are not verified "
                         f"yet, e.g. {unverified[0]}", unverified)
    changed = [p for p, e in entries.items() if not still_verified(e, snapshot / p)]
    if changed:
        return LocalCopy(ref, commit, snapshot, "unverified",
                         f"{snapshot} ({len(changed)} file(s) changed since sparkit verified them, e.g. {changed[0]})")
    return LocalCopy(ref, commit, snapshot, "verified",
                     f"{snapshot} ({len(entries)} files verified against the hub's hashes)")


def pulled_models() -> list[dict[str, Any]]:
    """Every model sparkit pulled (its records), newest first: repo, revision, commit, snapshot,
    files, bytes, complete."""
    out = []
    for path in sorted((cache_dir() / "pulls").glob("models--*/*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if (not isinstance(record, dict) or not isinstance(record.get("files"), dict)
                or parse_hub_ref(str(record.get("repo"))) is None or not COMMIT.fullmatch(str(record.get("commit")))):
            continue
        snapshot = snapshot_dir(record["repo"], record["commit"])
        out.append({"repo": record["repo"], "revision": record.get("revision"), "commit": record["commit"],
                    "snapshot": str(snapshot), "present": snapshot.is_dir(), "complete": bool(record.get("complete")),
                    "files": len(record["files"]), "bytes": sum(int(e.get("size", 0)) for e in record["files"].values()),
                    "updated_at": record.get("updated_at")})
    return sorted(out, key=lambda r: r.get("updated_at") or "", reverse=True)


# ------------------------------------------------------------------------------ for the engines

def plan_hub_model(key: str, role: str, path: str, pulls: list[dict[str, Any]]) -> str | None:
    """For a model path that names the hub: record it in `pulls` (the plan's model_pulls) and
    return the local snapshot the engine must load when it is complete here, else None (the
    launch is refused until `sparkit pull`). None too for a path that is not a hub reference."""
    ref = model_hub_ref(path)
    if ref is None:
        return None
    copy = local_copy(ref)
    pulls.append({"key": key, "role": role, "ref": str(ref), "repo": ref.repo, "revision": ref.revision,
                  "commit": copy.commit, "local": str(copy.path) if copy.complete else None,
                  "state": copy.state, "detail": copy.detail})
    return str(copy.path) if copy.complete else None


__all__ = ["hub_cache", "repo_dir", "blob_path", "partial_path", "snapshot_dir", "local_commit", "LocalCopy",
           "local_copy", "load_record", "save_record", "pulled_models", "plan_hub_model", "record_path"]
