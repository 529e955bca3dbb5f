"""The hub, through huggingface_hub: a repository's files with their sizes and the hub's own
hashes, small files by GET, safetensors headers by range requests, and every error as one
sparkit error that names the repository (and the file) and says what to do.

The client is huggingface_hub's, unmodified: its session (HF_TOKEN or the token file of
`hf auth login`, never an argument), its error classes (from the hub's X-Error-Code headers),
HF_ENDPOINT for a mirror, HF_HUB_OFFLINE. The endpoint and offline mode are read when each call
is made, not when huggingface_hub was imported.

The memory fit of a hub id that is not here reads the checkpoint's safetensors headers this way:
a 100 kB range of each weight file (its 8-byte header length and, usually, its whole header),
a second range when the header is longer, checked by sparkit.checkpoint_headers as a local file would
be. A commit never changes, so the headers read for one are kept in sparkit's cache
(`hub-headers/<commit>.json`): the next `sparkit plan` reads them without a request, offline included.

The listing's commit and every file's name, size, git oid and LFS sha256 are checked
(sparkit.hub.untrusted) before anything is named after them: a hub is untrusted input.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkit import interrupts
from sparkit.checkpoint_headers import TensorInfo, header_length, load_json, parse_safetensors_header
from sparkit.errors import DataError, HubError, SparkitError
from sparkit.hub import untrusted
from sparkit.hub.cache import local_commit, remember_commit, repo_folder
from sparkit.hub.files import CONFIG_FILE, INDEX_FILE, RemoteFile, weight_files
from sparkit.hub.refs import COMMIT, HubRef
from sparkit.paths import cache_dir, ensure_dir, write_atomic

DEFAULT_ENDPOINT = "https://huggingface.co"
HEADER_PROBE_BYTES = 100_000  # huggingface_hub's own first read of a safetensors header
HEADER_READERS = 8  # safetensors headers read at once
SMALL_FILE_LIMIT = 64 * 1024 * 1024  # config.json and the index, read into memory
TOKEN_HINT = "export HF_TOKEN=hf_... (a read token: https://huggingface.co/settings/tokens), or `hf auth login`"


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: no request is made at all."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def offline_variable() -> str:
    return "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"


@functools.cache
def _client():
    """huggingface_hub, quiet: its progress bars and retry warnings are sparkit's to show."""
    import logging

    import huggingface_hub
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    return huggingface_hub


def api():
    return _client().HfApi(endpoint=endpoint())


def token_present() -> bool:
    from huggingface_hub import get_token

    _client()
    return bool(get_token())


# ------------------------------------------------------------------------------ errors

def transport_errors() -> tuple[type[BaseException], ...]:
    """What the network under huggingface_hub raises: its HTTP library's transport errors (httpx2
    in huggingface_hub 2.x, httpx before), and the OS's."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for name in ("httpx2", "httpx"):
        try:
            found.append(__import__(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def hub_error(exc: BaseException, ref: HubRef, doing: str, path: str | None = None) -> SparkitError:
    """One sparkit error for what huggingface_hub (or the network under it) raised while `doing`
    something with `ref` (and its file `path`)."""
    from huggingface_hub import errors

    where = f"{ref}" + (f": {path}" if path else "")
    page = f"{endpoint()}/{ref.repo}"
    if isinstance(exc, (errors.OfflineModeIsEnabled,)) or offline():
        return HubError(f"offline ({offline_variable()}=1): cannot reach the hub while {doing} ({where})",
                        hint=f"unset {offline_variable()} to download, or serve a local copy: --set model.path=DIR")
    if isinstance(exc, errors.GatedRepoError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 403 or token_present():
            return HubError(f"{ref.repo} is gated and the account of your token has not been granted access "
                            f"({where})", hint=f"request access at {page} (logged in as that account), then pull again")
        return HubError(f"{ref.repo} is gated: the hub wants a token of an account that accepted its terms ({where})",
                        hint=f"accept the terms at {page}, then {TOKEN_HINT}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"no repository {ref.repo} on {endpoint()} (or it is private and your token, if any, "
                        f"has no access) while {doing}",
                        hint=f"check the name (org/name, as on {endpoint()}); for a private repository {TOKEN_HINT}")
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"{ref.repo} has no revision {ref.rev!r} while {doing}",
                        hint=f"name a branch, tag or commit of {page} (ORG/NAME@REVISION), or drop @{ref.rev} for main")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return HubError(f"{where}: no such file in the repository at that revision (while {doing})",
                        hint="the repository changed or is inconsistent: pin a revision that has it (ORG/NAME@REVISION)")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        server = (exc.server_message or "").strip().splitlines()
        said = f": {server[0]}" if server else ""
        if status == 401:
            return HubError(f"{endpoint()} refused the token (401{said}) while {doing} ({where})",
                            hint=f"the token is invalid or expired: {TOKEN_HINT}")
        if status == 403:
            return HubError(f"{endpoint()} forbids this (403{said}) while {doing} ({where})",
                            hint=f"check that your token may read {ref.repo}: {TOKEN_HINT}")
        if isinstance(status, int) and status >= 500:
            return HubError(f"the hub failed ({status}{said}) while {doing} ({where})",
                            hint="try again later; what is already verified is kept and the next pull resumes")
        return HubError(f"the hub answered {status}{said} while {doing} ({where})")
    if isinstance(exc, transport_errors()):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return HubError(f"cannot reach {endpoint()} ({reason}) while {doing} ({where})",
                        hint="check the network (or HF_ENDPOINT); a later `sparkit pull` resumes where this one stopped")
    if isinstance(exc, SparkitError):
        return exc
    return HubError(f"{type(exc).__name__} while {doing} ({where}): {exc}".splitlines()[0])


# ------------------------------------------------------------------------------ listing

@dataclass
class Listing:
    """A repository at one commit: every file with its size and the hub's hash."""

    ref: HubRef
    commit: str
    files: dict[str, RemoteFile]
    gated: Any = None  # False, "auto" or "manual" as the hub says
    private: bool | None = None


def listing(ref: HubRef, *, remember: bool = False) -> Listing:
    """The commit `ref` names now and its files (one request: the model info with its blobs).
    `remember`: record the revision's commit in the Hugging Face cache's refs/, as huggingface_hub
    does when it downloads (a pull does; the memory fit of `sparkit plan` writes nothing there)."""
    if offline():
        raise hub_error(ConnectionError("offline"), ref, "listing the repository's files")
    _client()
    try:
        info = api().model_info(ref.repo, revision=ref.rev, files_metadata=True)
    except Exception as exc:  # huggingface_hub's errors, or the network's
        raise hub_error(exc, ref, "listing the repository's files") from None
    where = f"{endpoint()} listed {ref}"
    if not info.sha:
        raise HubError(f"{endpoint()} did not say which commit {ref} is (no sha in its model info)",
                       hint="HF_ENDPOINT must point at a Hugging Face hub (or a mirror that speaks its API)")
    untrusted.commit(info.sha, where)
    files = {}
    for sibling in info.siblings or []:
        remote_file = _listed_file(sibling, where)
        files[remote_file.path] = remote_file
    if remember:
        remember_commit(ref.repo, ref.rev, info.sha)
    return Listing(ref, info.sha, files, gated=getattr(info, "gated", None), private=getattr(info, "private", None))


def _listed_file(sibling: Any, where: str) -> RemoteFile:
    """One entry of the listing, every value checked before it names a path or a byte count."""
    path = untrusted.file_name(sibling.rfilename, where)
    where = f"{where}: {path}"
    lfs = sibling.lfs
    if sibling.blob_id is None:
        raise HubError(f"{where}: no blobId (the file's hash) in the listing",
                       hint="HF_ENDPOINT must point at a Hugging Face hub (or a mirror that speaks its API)")
    blob_id = untrusted.git_oid(sibling.blob_id, where)
    if lfs is None:
        return RemoteFile(path=path, size=untrusted.size(0 if sibling.size is None else sibling.size, where),
                          blob_id=blob_id)
    return RemoteFile(path=path, size=untrusted.size(lfs.size, where, "lfs.size"), blob_id=blob_id,
                      sha256=untrusted.sha256(lfs.sha256, where))


def file_url(ref: HubRef, commit: str, path: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(ref.repo, path, revision=commit, endpoint=endpoint())


def read_range(ref: HubRef, commit: str, path: str, start: int, end: int) -> bytes:
    """Bytes [start, end] (inclusive) of a file, by a range request through huggingface_hub's
    session (its token, its error classes); never more than asked for, even from a server that
    ignores Range."""
    _client()
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    want = end - start + 1
    headers = {**build_hf_headers(), "Range": f"bytes={start}-{end}"}
    try:
        with get_session().stream("GET", file_url(ref, commit, path), headers=headers,
                                  timeout=_client().constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
            hf_raise_for_status(response)
            skip = start if response.status_code == 200 else 0  # a server that sent the whole file
            out = bytearray()
            for chunk in response.iter_bytes():
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                out += chunk
                if len(out) >= want:
                    break
            return bytes(out[:want])
    except SparkitError:
        raise
    except Exception as exc:
        raise hub_error(exc, ref, "reading a range of a file", path) from None


def read_small(ref: HubRef, commit: str, file: RemoteFile) -> bytes:
    if file.size > SMALL_FILE_LIMIT:
        raise DataError(f"{ref}: {file.path} is {file.size} bytes, too large for a metadata file")
    if file.size == 0:
        return b""
    return read_range(ref, commit, file.path, 0, file.size - 1)


def read_json(ref: HubRef, commit: str, file: RemoteFile) -> Any:
    """A small JSON file of the repository (config.json, the index), parsed within bounds
    (DataError naming it: not JSON, nested too deep)."""
    return load_json(read_small(ref, commit, file), f"{ref.repo}@{commit[:12]}/{file.path}")


# ------------------------------------------------------------------------------ the headers

@dataclass
class RemoteCheckpoint:
    """A hub checkpoint's config.json and every tensor of the weights the engine loads, from
    the safetensors headers (range requests), without a local copy."""

    ref: HubRef
    commit: str
    config: dict[str, Any]
    tensors: list  # sparkit.checkpoint_headers.TensorInfo
    files: dict[str, int]  # the weight files and their sizes
    weights_rule: str
    source: str  # where the headers came from, for the user
    read_at: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.ref.repo}@{self.commit[:12]}"


def _headers_dir(repo: str):
    return cache_dir() / "hub-headers" / repo_folder(repo)


def _headers_file(repo: str, commit: str):
    """`<commit>.json` of the header cache: a commit is checked before it names the file."""
    return _headers_dir(repo) / f"{untrusted.commit(commit, f'the header cache of {repo}', 'commit')}.json"


def _load_cached(ref: HubRef, commit: str) -> RemoteCheckpoint | None:
    try:
        data = json.loads(_headers_file(ref.repo, commit).read_text())
        tensors = [TensorInfo(name=n, dtype=d, shape=tuple(s), nbytes=b, file=f) for n, d, s, b, f in data["tensors"]]
        return RemoteCheckpoint(ref, commit, data["config"], tensors, data["files"], data["weights_rule"],
                                source="", read_at=data.get("read_at", ""))
    except (OSError, ValueError, KeyError, TypeError, RecursionError, HubError):
        return None


def _store_cached(found: RemoteCheckpoint) -> None:
    directory = ensure_dir(_headers_dir(found.ref.repo))
    data = {"repo": found.ref.repo, "commit": found.commit, "config": found.config, "files": found.files,
            "weights_rule": found.weights_rule, "read_at": found.read_at,
            "tensors": [[t.name, t.dtype, list(t.shape), t.nbytes, t.file] for t in found.tensors]}
    try:
        write_atomic(_headers_file(found.ref.repo, found.commit), json.dumps(data, separators=(",", ":")))
        revisions_path = directory / "revisions.json"
        try:
            revisions = json.loads(revisions_path.read_text())
        except (OSError, ValueError):
            revisions = {}
        revisions[found.ref.rev] = found.commit
        write_atomic(revisions_path, json.dumps(revisions, indent=1))
    except OSError:
        pass  # a cache: the next plan reads the hub again


def _last_known_commit(ref: HubRef) -> str | None:
    if ref.pinned:
        return ref.revision
    try:
        commit = json.loads((_headers_dir(ref.repo) / "revisions.json").read_text()).get(ref.rev)
    except (OSError, ValueError, AttributeError, RecursionError):
        commit = None
    return commit if isinstance(commit, str) and COMMIT.fullmatch(commit) else local_commit(ref)


def _read_header(ref: HubRef, commit: str, file: RemoteFile):
    where = f"{ref.repo}@{commit[:12]}/{file.path}"
    first = read_range(ref, commit, file.path, 0, min(HEADER_PROBE_BYTES, file.size) - 1)
    length = header_length(first, file.size, where)
    raw = first[8:8 + length] if 8 + length <= len(first) else read_range(ref, commit, file.path, 8, 8 + length - 1)
    tensors, _ = parse_safetensors_header(raw, file.size - 8 - length, where, file.path)
    return tensors


def _on_daemon_threads(fn: Callable[[Any], Any], items: list[Any], workers: int) -> list[Any]:
    """[fn(item) for item in items] on up to `workers` daemon threads; the first error is raised.
    The main thread only waits, in short sleeps a signal ends: Ctrl-C leaves at once, and a thread
    held by a hub that trickles its answer ends with the process (a pool's threads would be
    waited for at exit, as long as the hub liked)."""
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    todo, lock, finished = deque(enumerate(items)), threading.Lock(), threading.Event()
    running = [min(workers, len(items))]

    def work() -> None:
        try:
            while not errors:
                with lock:
                    if not todo:
                        return
                    i, item = todo.popleft()
                results[i] = fn(item)
        except BaseException as exc:  # the first error ends the reading; it is raised below
            errors.append(exc)
        finally:
            with lock:
                running[0] -= 1
                if not running[0]:
                    finished.set()

    if not items:
        return results
    for n in range(running[0]):
        thread = threading.Thread(target=work, name=f"sparkit-headers-{n}", daemon=True)
        interrupts.held(thread.start)
    interrupts.wait_until(finished)
    if errors:
        raise errors[0]
    return results


def remote_checkpoint(ref: HubRef) -> RemoteCheckpoint:
    """config.json and the safetensors headers of `ref`'s weights, read from the hub (or kept
    from an earlier read of the same commit). HubError when the hub cannot be asked and nothing
    was kept; DataError for a checkpoint whose files do not add up."""
    return _remote_checkpoint(ref, endpoint(), offline())


@functools.lru_cache(maxsize=8)
def _remote_checkpoint(ref: HubRef, _endpoint: str, _offline: bool) -> RemoteCheckpoint:
    try:
        found = listing(ref)
    except HubError as exc:
        commit = _last_known_commit(ref)
        kept = _load_cached(ref, commit) if commit else None
        if kept is None:
            raise
        kept.source = (f"headers read from the hub at {kept.read_at or 'an earlier plan'} and kept by sparkit "
                       f"(the hub cannot be asked now: {exc.message})")
        return kept
    kept = _load_cached(ref, found.commit)
    if kept is not None:
        kept.source = f"safetensors headers of {ref.repo}@{found.commit[:12]} read from {endpoint()} (kept since {kept.read_at})"
        return kept
    where = f"{ref.repo}@{found.commit[:12]}"
    if CONFIG_FILE not in found.files:
        raise DataError(f"{where} has no {CONFIG_FILE}: not a model checkpoint")
    config = read_json(ref, found.commit, found.files[CONFIG_FILE])
    if not isinstance(config, dict):
        raise DataError(f"{where}/{CONFIG_FILE}: not a JSON object")
    index = read_json(ref, found.commit, found.files[INDEX_FILE]) if INDEX_FILE in found.files else None
    names, rule = weight_files(found.files, index, where)
    headers = _on_daemon_threads(lambda n: _read_header(ref, found.commit, found.files[n]), names, HEADER_READERS)
    tensors: dict[str, Any] = {}
    for name, found_tensors in zip(names, headers):
        for tensor in found_tensors.values():
            if tensor.name in tensors:
                raise DataError(f"{where}: tensor {tensor.name!r} is in both {tensors[tensor.name].file} and {name}")
            tensors[tensor.name] = tensor
    result = RemoteCheckpoint(ref, found.commit, config, list(tensors.values()), {n: found.files[n].size for n in names},
                              rule, source=f"safetensors headers of {where} read from {endpoint()} by range requests",
                              read_at=time.strftime("%Y-%m-%d %H:%M"))
    _store_cached(result)
    return result


__all__ = ["endpoint", "offline", "listing", "Listing", "hub_error", "read_range", "read_json", "remote_checkpoint",
           "RemoteCheckpoint", "file_url", "api"]
