"""`sparkit pull`: exactly the files the engine reads, into the Hugging Face cache, each verified
against the hub's own hash before it counts, resumable after Ctrl-C, kill -9 or a dropped network.

    plan_pull(targets)   the repositories' listings (sizes, LFS sha256, git oids: each checked by
                         sparkit.hub.untrusted before it names a path), the files the engine reads
                         (sparkit.hub.files), what is here already (verified, to be verified, a
                         partial download to resume)
    check_room(plan)     before a byte moves: what is left to fetch against the free disk
    run_pull(plan)       verify what is here but unverified, fetch the rest, record each file as it
                         is verified, link the snapshot; `check_only` re-hashes instead of fetching

Each file gets one HEAD (its commit, etag and size must be the listing's) and is fetched by
sparkit.hub.transfer into `blobs/<etag>.incomplete`, a name that stays the same across processes,
so the next pull resumes from the bytes already there: written as they arrive, never past the
listed size, resumed by Range requests when the connection drops. The hash is computed as the
bytes arrive; the file is fsynced, renamed to its blob only when the hash is the hub's, and its
pages dropped from the page cache (posix_fadvise DONTNEED), so a 70 GB pull does not leave a
unified-memory machine short of memory before its first launch. A mismatch refetches the file
once from its first byte; a second is an error naming the file. A repository stored with Xet is
fetched by huggingface_hub's Xet client when hf_xet is installed, into the same partial file.
The snapshot is linked as huggingface_hub links it (relative symlinks to the blobs), from what was
verified, without asking the hub again.

Returns data and never prints; progress arrives through a callback (from worker threads, one
call at a time).
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sparkit import interrupts
from sparkit.checkpoint_headers import load_json
from sparkit.errors import DataError, HubError, PreflightError, SparkitError
from sparkit.hub import cache, remote, transfer, untrusted
from sparkit.hub.files import CONFIG_FILE, INDEX_FILE, RemoteFile, select_files
from sparkit.hub.refs import HubRef, parse_hub_ref
from sparkit.hub.remote import endpoint, offline
from sparkit.hub.untrusted import shown
from sparkit.memory.pagecache import evict, residency
from sparkit.memory.units import gib
from sparkit.paths import disk_full

READ_BLOCK = 8 * 1024 * 1024
MISMATCH_ATTEMPTS = 2  # a mismatch refetches the file once; the second is an error
BYTES_EVENT_STEP = 256 * 1024  # a "bytes" progress event per this much of a file (and at its end)

# (event, repository or None, file or None): "verifying", "verified", "fetching", "bytes",
# "dropped", "mismatch", "done", "failed", "linked", "stopping" (Ctrl-C or a failed file: the
# others stop at their next chunk)
ProgressFn = Callable[[str, "RepoPull", "PullFile | None"], None]


@dataclass
class PullFile:
    path: str
    size: int
    etag: str  # the blob's name: the LFS sha256, else the git oid
    sha256: str | None  # the hub's LFS sha256 (None: a file stored in git, checked by its git oid)
    blob_id: str
    state: str = "queued"  # present | verify | queued | verifying | fetching | done | failed | missing | damaged
    done: int = 0  # bytes of it on disk (resumed ones included) or hashed so far
    resumed_from: int = 0  # bytes a partial download already held when this pull started on it
    fetched: int = 0  # bytes received by this pull
    refetched: int = 0  # of those, bytes received again after a hash mismatch
    dropped: int = 0  # connections that dropped mid-file (and were resumed)
    note: str = ""
    content: bytes | None = field(default=None, repr=False)  # read while planning (config, index)

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("content", None)
        return data


@dataclass
class RepoPull:
    ref: HubRef
    role: str  # target | draft | model
    commit: str
    files: list[PullFile]
    skipped: list[tuple[str, str]]
    weights_rule: str
    online: bool  # listed by the hub now (False: from the local record, offline or hub unreachable)
    note: str = ""

    @property
    def snapshot(self) -> Path:
        return cache.snapshot_dir(self.ref.repo, self.commit)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": str(self.ref), "repo": self.ref.repo, "revision": self.ref.revision, "role": self.role,
                "commit": self.commit, "snapshot": str(self.snapshot), "bytes": self.bytes, "online": self.online,
                "weights": self.weights_rule, "note": self.note, "files": [f.to_dict() for f in self.files],
                "skipped": [{"path": p, "why": w} for p, w in self.skipped]}


@dataclass
class PullPlan:
    repos: list[RepoPull]
    check_only: bool = False

    @property
    def files(self) -> list[tuple[RepoPull, PullFile]]:
        return [(r, f) for r in self.repos for f in r.files]

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.repos)

    @property
    def to_fetch_bytes(self) -> int:
        return sum(f.size - f.resumed_from for _, f in self.files if f.state == "queued")

    @property
    def present_bytes(self) -> int:
        return sum(f.size for _, f in self.files if f.state in ("present", "done"))

    @property
    def complete(self) -> bool:
        return all(f.state in ("present", "done") for _, f in self.files)

    def disk(self) -> tuple[Path, int]:
        """(the existing directory the blobs land under, its free bytes)."""
        where = cache.hub_cache()
        while not where.exists() and where != where.parent:
            where = where.parent
        return where, shutil.disk_usage(where).free

    def to_dict(self) -> dict[str, Any]:
        where, free = self.disk()
        return {"repos": [r.to_dict() for r in self.repos], "total_bytes": self.total_bytes,
                "present_bytes": self.present_bytes, "to_fetch_bytes": self.to_fetch_bytes,
                "complete": self.complete, "disk": str(where), "free_bytes": free, "hub_cache": str(cache.hub_cache())}


@dataclass
class PullResult:
    plan: PullPlan
    seconds: float
    fetched_bytes: int
    refetched_bytes: int
    verified_files: int
    page_cache_bytes: int  # of the pulled files, in the page cache when the pull ended (mincore)

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "seconds": round(self.seconds, 3), "fetched_bytes": self.fetched_bytes,
                "refetched_bytes": self.refetched_bytes, "verified_files": self.verified_files,
                "page_cache_bytes": self.page_cache_bytes}


# ------------------------------------------------------------------------------ planning

def _local_listing(repo: str, commit: str) -> dict[str, RemoteFile]:
    """A snapshot's files as huggingface_hub linked them: each symlink's blob name is its etag (a
    64-hex LFS sha256, else the git oid), so a copy can be checked without the hub."""
    snapshot = cache.snapshot_dir(repo, commit)
    out: dict[str, RemoteFile] = {}
    for dirpath, _, names in os.walk(snapshot):
        for name in names:
            full = Path(dirpath) / name
            rel = full.relative_to(snapshot).as_posix()
            etag = os.path.basename(os.readlink(full)) if full.is_symlink() else ""
            try:
                size = full.stat().st_size
            except OSError:
                continue
            if not untrusted.is_etag(etag):
                continue  # not a link to a blob: nothing to check it against
            sha256 = etag if len(etag) == 64 else None
            out[rel] = RemoteFile(rel, size, etag if len(etag) == 40 else "", sha256)
    return out


def _file_states(repo: str, files: list[PullFile], record: dict[str, Any] | None, check_only: bool) -> None:
    entries = (record or {}).get("files", {})
    for f in files:
        blob, partial = cache.blob_path(repo, f.etag), cache.partial_path(repo, f.etag)
        stat = cache.file_stat(blob)
        if stat is not None:
            if stat["size"] != f.size:
                f.state, f.note = ("damaged" if check_only else "queued"), f"the cached blob has {stat['size']} bytes, not {f.size}"
            elif not check_only and cache.still_verified(entries.get(f.path) or {}, blob) and entries[f.path].get("etag") == f.etag:
                f.state, f.done = "present", f.size
            else:
                f.state = "verify"
        elif check_only:
            f.state, f.note = "missing", "not in the Hugging Face cache"
        else:
            held = partial.stat().st_size if partial.is_file() else 0
            f.state = "queued"
            f.resumed_from = f.done = held if held <= f.size else 0


def _plan_repo(role: str, ref: HubRef, check_only: bool) -> RepoPull:
    try:
        listed = remote.listing(ref, remember=True)
    except HubError as exc:
        return _plan_offline(role, ref, check_only, exc)
    where = f"{ref.repo}@{listed.commit[:12]}"
    config = index = None
    prefetched: dict[str, bytes] = {}
    for name in (CONFIG_FILE, INDEX_FILE):
        if name in listed.files:
            local = cache.blob_path(ref.repo, listed.files[name].etag)  # verified by an earlier pull, if here
            raw = local.read_bytes() if local.is_file() and local.stat().st_size == listed.files[name].size else None
            if raw is None:
                raw = remote.read_small(ref, listed.commit, listed.files[name])
                prefetched[name] = raw
            parsed = load_json(raw, f"{where}/{name}")
            config, index = (parsed, index) if name == CONFIG_FILE else (config, parsed)
    selection = select_files(listed.files, config, index, where)
    files = [PullFile(p, listed.files[p].size, listed.files[p].etag, listed.files[p].sha256, listed.files[p].blob_id)
             for p in selection.files]
    _file_states(ref.repo, files, cache.load_record(ref.repo, listed.commit), check_only)
    for f in files:
        if f.path in prefetched and f.state == "queued":
            f.content = prefetched[f.path]
    return RepoPull(ref, role, listed.commit, files, selection.skipped, selection.weights, online=True)


def _plan_offline(role: str, ref: HubRef, check_only: bool, why: HubError) -> RepoPull:
    """The hub cannot be asked: what sparkit recorded of the local copy (or, for --check, the
    snapshot's own blob names), enough to say it is complete and to verify it; else the error."""
    commit = cache.local_commit(ref)
    record = cache.load_record(ref.repo, commit) if commit else None
    if commit is None:
        raise why
    if record is not None and record.get("files"):
        files = [PullFile(p, int(e["size"]), e["etag"], e.get("sha256"), e.get("blob_id", ""))
                 for p, e in record["files"].items()]
        skipped = [tuple(s) for s in record.get("skipped", [])]
        rule = record.get("weights", "")
    elif check_only and cache.snapshot_dir(ref.repo, commit).is_dir():
        listed = _local_listing(ref.repo, commit)
        snapshot = cache.snapshot_dir(ref.repo, commit)
        config = _json_or_none(snapshot / CONFIG_FILE)
        index = _json_or_none(snapshot / INDEX_FILE)
        selection = select_files(listed, config, index, f"{snapshot}")
        files = [PullFile(p, listed[p].size, listed[p].etag, listed[p].sha256, listed[p].blob_id) for p in selection.files]
        skipped, rule = selection.skipped, selection.weights
    else:
        raise why
    _file_states(ref.repo, files, record, check_only)
    if any(f.state == "queued" for f in files):
        raise why  # something must be fetched, and the hub cannot be asked
    note = f"the hub was not asked ({why.message}); checked against {'sparkit' if record else 'the cache'}'s record of {commit[:12]}"
    return RepoPull(ref, role, commit, files, skipped, rule, online=False, note=note)


def _json_or_none(path: Path) -> Any:
    try:
        return load_json(path.read_bytes(), str(path))
    except (OSError, DataError):
        return None


def plan_targets(plan: Any, *, missing_only: bool = False) -> list[tuple[str, HubRef]]:
    """A launch plan's hub models ([(role, ref)], from its model_pulls); `missing_only`: those
    that are not complete here."""
    out = []
    for entry in getattr(plan, "model_pulls", None) or []:
        ref = parse_hub_ref(entry["ref"])
        if ref is not None and not (missing_only and entry.get("local")):
            out.append((entry["role"], ref))
    return out


def plan_pull(targets: list[tuple[str, HubRef]], *, check_only: bool = False) -> PullPlan:
    """What pulling `targets` ([(role, ref)]) involves: each repository's commit, the files its
    engine reads with their sizes and hashes, and what of them is already here."""
    seen: set[tuple[str, str | None]] = set()
    repos = []
    for role, ref in targets:
        if (ref.repo, ref.revision) in seen:
            continue
        seen.add((ref.repo, ref.revision))
        repos.append(_plan_repo(role, ref, check_only))
    return PullPlan(repos, check_only=check_only)


def check_room(plan: PullPlan, command: str) -> None:
    """PreflightError (exit 4) with the numbers when what is left to fetch does not fit the disk."""
    need = plan.to_fetch_bytes
    where, free = plan.disk()
    if need <= free:
        return
    count = sum(1 for _, f in plan.files if f.state == "queued")
    raise PreflightError(
        f"not enough disk for {', '.join(str(r.ref) for r in plan.repos)}: {gib(need)} left to fetch "
        f"({count} file{'s' if count != 1 else ''}), {gib(free)} free on {where} (Hugging Face cache "
        f"{cache.hub_cache()}); short by {gib(need - free)}",
        hint=f"free {gib(need - free)} there, or put the cache on a larger disk: HF_HUB_CACHE=/big/disk/hub {command}")


# ------------------------------------------------------------------------------ hashing

def _hasher(f: PullFile):
    if f.lfs:
        return hashlib.sha256()
    h = hashlib.sha1()  # the git oid of a file stored in git: sha1("blob <size>\0" + content)
    h.update(b"blob %d\0" % f.size)
    return h


def _expected(f: PullFile) -> str:
    return f.sha256 if f.lfs else f.blob_id


def _hash_file(path: Path, f: PullFile, on_bytes: Callable[[int], None], cancel: threading.Event, upto: int | None = None):
    h = _hasher(f)
    left = upto
    with open(path, "rb") as handle:
        while left is None or left > 0:
            if cancel.is_set():
                raise transfer.Stopped
            block = handle.read(READ_BLOCK if left is None else min(READ_BLOCK, left))
            if not block:
                break
            h.update(block)
            on_bytes(len(block))
            if left is not None:
                left -= len(block)
    return h


# ------------------------------------------------------------------------------ running

class _Runner:
    def __init__(self, plan: PullPlan, progress: ProgressFn | None, workers: int, command: str):
        self.plan, self.workers, self.command = plan, max(1, workers), command
        self._progress = progress
        self._lock = threading.Lock()  # progress calls and record writes, one at a time
        self.cancel = threading.Event()
        self.hangups = transfer.Hangups()  # the sockets in flight, for a Ctrl-C to close at once
        self.records: dict[int, dict[str, Any]] = {}
        self._reported: dict[int, int] = {}  # bytes of each file progress was told of
        self.verified = 0

    def emit(self, event: str, repo: RepoPull, f: PullFile | None) -> None:
        if self._progress is not None:
            with self._lock:
                self._progress(event, repo, f)

    # -- records

    def open_record(self, repo: RepoPull) -> None:
        old = cache.load_record(repo.ref.repo, repo.commit) or {}
        old_files = old.get("files", {})
        files = {}
        for f in repo.files:
            entry = {"size": f.size, "etag": f.etag, "sha256": f.sha256, "blob_id": f.blob_id, "verified": None}
            previous = old_files.get(f.path) or {}
            if f.state == "present" and previous.get("etag") == f.etag:
                entry["verified"] = previous.get("verified")
            files[f.path] = entry
        record = {"repo": repo.ref.repo, "revision": repo.ref.rev, "commit": repo.commit,
                  "endpoint": _endpoint(), "files": files, "skipped": [list(s) for s in repo.skipped],
                  "weights": repo.weights_rule, "complete": all(e["verified"] for e in files.values())}
        self.records[id(repo)] = record
        if repo.online or old:
            cache.save_record(record)

    def mark_verified(self, repo: RepoPull, f: PullFile) -> None:
        with self._lock:
            record = self.records[id(repo)]
            record["files"][f.path]["verified"] = cache.file_stat(cache.blob_path(repo.ref.repo, f.etag))
            cache.save_record(record)
            self.verified += 1

    def close_record(self, repo: RepoPull, complete: bool) -> None:
        with self._lock:
            record = self.records[id(repo)]
            record["complete"] = complete
            cache.save_record(record)

    # -- one file

    def verify_present(self, repo: RepoPull, f: PullFile) -> None:
        """A blob that is here but not (or no longer) verified: hash it; a mismatch removes it."""
        blob = cache.blob_path(repo.ref.repo, f.etag)
        f.state, f.done = "verifying", 0
        self.emit("verifying", repo, f)

        def counted(n: int) -> None:
            f.done += n
            self.emit("bytes", repo, f)

        digest = _hash_file(blob, f, counted, self.cancel).hexdigest()
        _evict_quietly(evict, blob)
        if digest == _expected(f):
            f.state, f.done = "present", f.size
            self.mark_verified(repo, f)
            self.emit("verified", repo, f)
            return
        f.note = f"the cached copy's {'sha256' if f.lfs else 'git oid'} is {digest[:12]}, the hub's {_expected(f)[:12]}"
        if self.plan.check_only:
            f.state = "damaged"
            self.emit("failed", repo, f)
            return
        _remove_blob(repo, f)
        f.state, f.done, f.resumed_from = "queued", 0, 0
        self.emit("mismatch", repo, f)

    def fetch(self, repo: RepoPull, f: PullFile) -> None:
        if f.content is not None:
            self._store(repo, f, f.content)
        else:
            self._download(repo, f)

    def _store(self, repo: RepoPull, f: PullFile, content: bytes) -> None:
        """A file already read while planning (config.json, the index): written as a blob, verified."""
        partial = cache.partial_path(repo.ref.repo, f.etag)
        partial.parent.mkdir(parents=True, exist_ok=True)
        h = _hasher(f)
        h.update(content)
        if h.hexdigest() != _expected(f) or len(content) != f.size:
            f.content = None
            return self._download(repo, f)
        f.state = "fetching"
        self.emit("fetching", repo, f)
        try:
            with open(partial, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise self._disk_error(exc, repo, f, partial) from None
        f.fetched, f.done = len(content), len(content)
        self._finish(repo, f, partial)

    def _download(self, repo: RepoPull, f: PullFile) -> None:
        from huggingface_hub.utils import WeakFileLock, build_hf_headers

        ref = repo.ref
        meta = self._head(repo, f)
        headers = build_hf_headers()
        url = remote.file_url(ref, repo.commit, f.path)
        if _origin(meta.location) != _origin(url):
            headers.pop("authorization", None)  # a signed CDN address: the token stays with the hub
        lock = cache.lock_path(ref.repo, f.etag)
        lock.parent.mkdir(parents=True, exist_ok=True)
        blob, partial = cache.blob_path(ref.repo, f.etag), cache.partial_path(ref.repo, f.etag)
        with WeakFileLock(lock):
            if blob.is_file() and blob.stat().st_size == f.size:  # another pull finished it meanwhile
                self.verify_present(repo, f)
                if f.state == "present":
                    f.state = "done"
                    return
            for attempt in range(1, MISMATCH_ATTEMPTS + 1):
                if meta.xet_file_data is not None and _xet_available():
                    digest = self._fetch_with_xet(repo, f, meta, headers, partial)
                else:
                    digest = self._fetch_once(repo, f, meta.location, headers, partial, attempt)
                if digest == _expected(f):
                    self._finish(repo, f, partial)
                    return
                partial.unlink(missing_ok=True)
                f.note = (f"{'sha256' if f.lfs else 'git oid'} {digest[:12]} of the {f.size} bytes received is not the "
                          f"hub's {_expected(f)[:12]}")
                if attempt < MISMATCH_ATTEMPTS:
                    self.emit("mismatch", repo, f)
                    continue
                f.state = "failed"
                self.emit("failed", repo, f)
                raise DataError(f"{ref}: {f.path} does not match the hub's {'sha256' if f.lfs else 'git oid'} after "
                                f"{MISMATCH_ATTEMPTS} downloads ({f.note}); nothing of it was kept",
                                hint="the hub's copy (or something between it and this machine: a proxy, a mirror "
                                     "behind HF_ENDPOINT) is damaged; try again later, or report it to the repository")

    def _head(self, repo: RepoPull, f: PullFile) -> Any:
        """The hub's HEAD answer for the file, which must say what its listing said (commit, etag,
        size) before anything is named after it or fetched; the one HEAD a file gets."""
        from huggingface_hub.file_download import get_hf_file_metadata

        if self.cancel.is_set():
            raise transfer.Stopped
        try:
            meta = get_hf_file_metadata(remote.file_url(repo.ref, repo.commit, f.path), endpoint=_endpoint())
        except Exception as exc:
            raise remote.hub_error(exc, repo.ref, "asking the hub for a file", f.path) from None
        etag = meta.etag
        if meta.commit_hash != repo.commit or etag != f.etag or (meta.size is not None and meta.size != f.size):
            raise HubError(f"{repo.ref}: {f.path}: the hub's answer (commit {shown(meta.commit_hash, 12)}, etag "
                           f"{shown(etag, 12)}, {shown(meta.size, 20)} bytes) disagrees with its listing (commit "
                           f"{repo.commit[:12]}, etag {f.etag[:12]}, {f.size} bytes)",
                           hint="the repository changed while pulling: run the pull again")
        return meta

    def _fetch_once(self, repo: RepoPull, f: PullFile, location: str, headers: dict[str, str], partial: Path,
                    attempt: int) -> str:
        """One download of `f` into `partial` (resumed from the bytes it holds), hashed on the way;
        the digest of what it holds. Errors say what to do: a full disk, a dropped connection, the
        hub's answer, more bytes than the file has."""
        partial.parent.mkdir(parents=True, exist_ok=True)
        held = partial.stat().st_size if partial.is_file() else 0
        if held > f.size:
            held = 0
        f.state, f.done = "fetching", held
        if attempt == 1:
            f.resumed_from = held
        self._reported[id(f)] = held
        self.emit("fetching", repo, f)
        try:
            with open(partial, "r+b" if held else "wb", buffering=0) as handle:
                handle.truncate(held)
                handle.seek(held)
                hasher = _hash_file(partial, f, lambda n: None, self.cancel, upto=held) if held else _hasher(f)
                body = transfer.Body(handle, f.size, held, hasher, lambda: _hasher(f),
                                     lambda n: self._got(repo, f, n, attempt), self.cancel,
                                     on_restart=lambda: self._restarted(f))
                transfer.fetch(location, headers, body, hangups=self.hangups, cancel=self.cancel,
                               on_drop=lambda exc: self._drop(repo, f),
                               timeout=remote._client().constants.HF_HUB_DOWNLOAD_TIMEOUT)
                os.fsync(handle.fileno())
        except (transfer.Stopped, KeyboardInterrupt, SparkitError):
            raise
        except transfer.TooLong as exc:
            raise self._too_long(exc, repo, f, partial) from None
        except transfer.Dropped as exc:
            raise self._dropped(exc, repo, f, partial) from None
        except Exception as exc:
            if isinstance(exc, _hf_http_error()):
                raise remote.hub_error(exc, repo.ref, "downloading a file", f.path) from None
            if isinstance(exc, OSError):
                raise self._disk_error(exc, repo, f, partial) from None
            raise remote.hub_error(exc, repo.ref, "downloading a file", f.path) from None
        return body.hasher.hexdigest()

    def _fetch_with_xet(self, repo: RepoPull, f: PullFile, meta: Any, headers: dict[str, str], partial: Path) -> str:
        """A file stored with Xet, hf_xet installed: huggingface_hub's Xet download into the same
        partial file (never hf_hub_download, which would ask the hub again and name the blob after
        its second answer), then sparkit's sha256 of what it wrote."""
        from huggingface_hub.file_download import xet_get

        f.state, f.done = "fetching", 0
        self.emit("fetching", repo, f)
        partial.parent.mkdir(parents=True, exist_ok=True)
        try:
            xet_get(incomplete_path=partial, xet_file_data=meta.xet_file_data, headers=headers, expected_size=f.size,
                    displayed_filename=f.path, tqdm_class=_progress_tqdm(lambda n: self._got(repo, f, n, 1)))
        except Exception as exc:
            raise remote.hub_error(exc, repo.ref, "downloading a file (Xet)", f.path) from None
        if partial.stat().st_size > f.size:
            raise self._too_long(transfer.TooLong(f"{partial.stat().st_size} bytes"), repo, f, partial)
        return _hash_file(partial, f, lambda n: None, self.cancel).hexdigest()

    def _got(self, repo: RepoPull, f: PullFile, n: int, attempt: int) -> None:
        f.done += n
        f.fetched += n
        if attempt > 1:
            f.refetched += n
        # Bytes arrive a network read at a time (kilobytes): progress hears of them a step at a time.
        if f.done - self._reported.get(id(f), 0) >= BYTES_EVENT_STEP or f.done >= f.size:
            self._reported[id(f)] = f.done
            self.emit("bytes", repo, f)

    def _finish(self, repo: RepoPull, f: PullFile, partial: Path) -> None:
        """The hash is the hub's: the partial becomes the blob (huggingface_hub's permissions),
        its pages leave the page cache, the record says so."""
        blob = cache.blob_path(repo.ref.repo, f.etag)
        _cache_mode(partial)
        os.replace(partial, blob)
        _evict_quietly(evict, blob)
        f.state, f.done, f.content = "done", f.size, None
        self.mark_verified(repo, f)
        self.emit("done", repo, f)

    # -- errors with what to do

    def _disk_error(self, exc: OSError, repo: RepoPull, f: PullFile, partial: Path) -> SparkitError:
        held = partial.stat().st_size if partial.is_file() else 0
        where, free = self.plan.disk()
        if disk_full(exc):
            return PreflightError(
                f"the disk filled while writing {repo.ref}: {f.path} ({partial}): {held} of its {f.size} bytes are "
                f"kept, {gib(free)} free on {where}",
                hint=f"free {gib(max(0, f.size - held))} or more there, then `{self.command}` again: it resumes this "
                     f"file at byte {held} and keeps the {self.verified} file(s) already verified")
        return SparkitError(f"cannot write {partial} ({exc.strerror or exc}) while pulling {repo.ref}: {f.path}",
                            hint=f"check the Hugging Face cache {cache.hub_cache()} (HF_HUB_CACHE) is writable")

    def _restarted(self, f: PullFile) -> None:
        """The server answered a Range request with the whole file: it counts from its first byte again."""
        f.done = self._reported[id(f)] = 0

    def _too_long(self, exc: transfer.TooLong, repo: RepoPull, f: PullFile, partial: Path) -> SparkitError:
        partial.unlink(missing_ok=True)
        f.state, f.note = "failed", f"the hub sent more than the {f.size} bytes it listed ({exc.how})"
        self.emit("failed", repo, f)
        return DataError(f"{repo.ref}: {f.path}: {f.note}; the download stopped there and nothing of it was kept",
                         hint="the hub's listing and its file disagree (a broken or hostile hub or mirror behind "
                              "HF_ENDPOINT): try again later, or report it to the repository")

    def _drop(self, repo: RepoPull, f: PullFile) -> None:
        """The connection dropped mid-file: resumed from the byte it holds."""
        f.dropped += 1
        self.emit("dropped", repo, f)

    def _dropped(self, exc: BaseException, repo: RepoPull, f: PullFile, partial: Path) -> SparkitError:
        held = partial.stat().st_size if partial.is_file() else 0
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = "the hub" if offline() else _endpoint()
        return HubError(f"the connection to {where} dropped while downloading {repo.ref}: {f.path} and did not "
                        f"recover ({reason}); {held} of its {f.size} bytes are kept",
                        hint=f"check the network, then `{self.command}` again: it resumes {f.path} at byte {held} "
                             f"and keeps the {self.verified} file(s) already verified")

    # -- the whole pull

    def run(self) -> None:
        for repo in self.plan.repos:
            self.open_record(repo)
        for repo, f in self.plan.files:
            if f.state == "verify":
                self.verify_present(repo, f)
        if self.plan.check_only:
            return
        queue = [(r, f) for r, f in self.plan.files if f.state == "queued"]
        if queue:
            self._fetch_all(queue)
        for repo in self.plan.repos:
            if repo.online:
                self._link(repo)
            self.close_record(repo, all(f.state in ("present", "done") for f in repo.files))

    def _fetch_all(self, queue: list[tuple[RepoPull, PullFile]]) -> None:
        """Fetch `queue` on `workers` threads. The main thread only waits (in short sleeps that a
        signal ends), so Ctrl-C lands there and nowhere in the workers' locks: it stops the queue
        (no queued file gets a HEAD or a GET), hangs up the transfers in flight (their partial
        downloads keep what arrived) and returns once the workers have stopped. A failed file
        stops the others the same way."""
        todo, failures = collections.deque(queue), []
        taking, finished = threading.Lock(), threading.Event()
        running = [min(self.workers, len(queue))]

        def work() -> None:
            try:
                while not self.cancel.is_set():
                    with taking:
                        if not todo:
                            return
                        repo, f = todo.popleft()
                    self.fetch(repo, f)
            except transfer.Stopped:
                pass
            except BaseException as exc:  # the first failure stops every other file
                failures.append(exc)
                self._stop()
            finally:
                with taking:
                    running[0] -= 1
                    if not running[0]:
                        finished.set()

        try:
            for n in range(running[0]):
                interrupts.held(threading.Thread(target=work, name=f"sparkit-pull-{n}", daemon=True).start)
            interrupts.wait_until(finished)
        except BaseException:  # Ctrl-C (SIGTERM, SIGHUP): stop, let the workers leave, then go
            self._stop()
            self.emit("stopping", None, None)
            interrupts.wait_until(finished)  # they leave at once; a second Ctrl-C here leaves without them
            raise
        if failures:
            self.emit("stopping", None, None)
            raise failures[0]

    def _stop(self) -> None:
        self.cancel.set()
        self.hangups.hang_up_all()

    def _link(self, repo: RepoPull) -> None:
        """The snapshot's symlinks, as huggingface_hub makes them (`snapshots/<commit>/<path>`, a
        relative link to `blobs/<etag>`), each to the blob this pull or an earlier one verified,
        made under a temporary name and renamed into place (never half made). No request: the
        hub was asked once per file, and its answer is not asked again."""
        for f in repo.files:
            if f.state not in ("present", "done"):
                raise SparkitError(f"{repo.ref}: {f.path} is not verified; the snapshot is not linked to it")
            pointer = repo.snapshot / f.path
            blob = cache.blob_path(repo.ref.repo, f.etag)
            target = os.path.relpath(blob, pointer.parent)
            if pointer.is_symlink() and os.readlink(pointer) == target:
                continue
            pointer.parent.mkdir(parents=True, exist_ok=True)
            temporary = pointer.with_name(f".{pointer.name}.{os.getpid()}.link")
            temporary.unlink(missing_ok=True)
            try:
                os.symlink(target, temporary)
                os.replace(temporary, pointer)
            except OSError as exc:
                temporary.unlink(missing_ok=True)
                raise SparkitError(f"cannot link {pointer} ({exc.strerror or exc}) while pulling {repo.ref}",
                                   hint=f"check the Hugging Face cache {cache.hub_cache()} (HF_HUB_CACHE) is "
                                        "writable") from None
        self.emit("linked", repo, None)


def run_pull(plan: PullPlan, *, progress: ProgressFn | None = None, workers: int = 4,
             command: str = "sparkit pull") -> PullResult:
    """Verify, fetch and link what `plan` says; `plan.check_only` verifies only. Raises HubError
    (exit 9), PreflightError (the disk, exit 4), DataError (a file that does not match the hub's
    hash twice, exit 8), KeyboardInterrupt; whatever was verified stays verified and recorded,
    and a partial download stays for the next pull to resume. `command` is what a message tells
    the user to run again."""
    remote._client()  # quiet huggingface_hub before it is used from the worker threads
    start = time.monotonic()
    runner = _Runner(plan, progress, workers, command)
    runner.run()
    files = [cache.blob_path(r.ref.repo, f.etag) for r, f in plan.files]

    cached, _ = residency([p for p in files if p.is_file()])
    return PullResult(plan, time.monotonic() - start, sum(f.fetched for _, f in plan.files),
                      sum(f.refetched for _, f in plan.files), runner.verified, cached)


# ------------------------------------------------------------------------------ helpers

def _xet_available() -> bool:
    """hf_xet is installed and not turned off (HF_HUB_DISABLE_XET), as huggingface_hub decides."""
    from huggingface_hub.utils import is_package_available

    disabled = (os.environ.get("HF_HUB_DISABLE_XET") or "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return not disabled and is_package_available("hf_xet")


def _endpoint() -> str:
    return endpoint()


def _origin(url: str) -> tuple[str, str, int | None]:
    parsed = urlparse(url)
    return parsed.scheme, (parsed.hostname or "").lower(), parsed.port


def _hf_http_error():
    from huggingface_hub.errors import HfHubHTTPError

    return HfHubHTTPError


def _cache_mode(path: Path) -> None:
    """The mode huggingface_hub gives a blob: that of a new file in its folder (the umask's)."""
    probe = path.with_name(f".mode-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        probe.touch()
        os.chmod(path, probe.stat().st_mode & 0o777)
    except OSError:
        pass
    finally:
        probe.unlink(missing_ok=True)


def _evict_quietly(evict: Callable[[Path], None], path: Path) -> None:
    try:
        evict(path)
    except OSError:
        pass  # a file system without fadvise: the pages stay, nothing else changes


def _remove_blob(repo: RepoPull, f: PullFile) -> None:
    cache.blob_path(repo.ref.repo, f.etag).unlink(missing_ok=True)
    pointer = repo.snapshot / f.path
    if pointer.is_symlink():
        pointer.unlink()


def _progress_tqdm(on_bytes: Callable[[int], None]):
    """A tqdm class for huggingface_hub's own downloads that reports bytes and draws nothing."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Reported(hf_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if n:
                on_bytes(int(n))
            return super().update(n)

    return _Reported


__all__ = ["PullFile", "RepoPull", "PullPlan", "PullResult", "plan_targets", "plan_pull", "check_room", "run_pull"]
