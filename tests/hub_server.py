"""A local server that speaks the Hugging Face hub's file API, for huggingface_hub's own client.

    python tests/hub_server.py ROOT     (prints "api=PORT cdn=PORT" once both listen)

ROOT/repos.json describes the repositories; each revision's files are a directory:

    {"org/name": {"refs": {"main": COMMIT, "v0": COMMIT}, "gated": false | "auto", "private": false,
                  "unhashed": false, "commits": {COMMIT: "relative/dir/of/its/files"}}}

What the client calls, as the hub answers it (huggingface_hub 2.x: hf_api.py, file_download.py,
utils/_http.py hf_raise_for_status):
- GET  /api/models/{repo}[/revision/{rev}][?blobs=true]   model info: sha, siblings (size, blobId,
       lfs {size, sha256, pointerSize} with blobs)
- GET  /api/models/{repo}/tree/{rev}[/{path}]             the tree (one page)
- POST /api/models/{repo}/paths-info/{rev}                paths-info
- HEAD/GET /{repo}/resolve/{rev}/{path}                   a file stored in git: 200, ETag = its git
       oid, X-Repo-Commit; a file stored in LFS: 302 to the "CDN" (a second port, so another
       origin: the client drops its token there, as for the hub's signed URLs), with X-Linked-Etag
       (the sha256), X-Linked-Size and X-Repo-Commit on the redirect itself
- GET  CDN /lfs/{sha256}                                  the bytes, Range requests answered 206
- errors with the headers the client maps to its exceptions: X-Error-Code RepoNotFound (401
  without a token, 404 with one), GatedRepo (401 without a token, 403 for an account not granted),
  RevisionNotFound and EntryNotFound (404); a token the server does not know is a 401
  "Invalid credentials in Authorization header".
Tokens: "hf_test_granted" may read every repository; "hf_test_not_granted" is a valid account that
was not granted the gated ones.

Faults for the tests (POST /_control on the api port, JSON): {"op": "cut", "path": P, "after": N,
"times": K} closes the connection after N bytes of P's body; "flip" {"path", "offset", "times"}
(times -1: for ever) changes one byte of what is sent; "block" {"path", "after"} stops sending P
after N bytes until "release", then drops the connection (the test kills or interrupts the client
meanwhile); "reset". GET /_control/stats:
bytes of each file's body sent (all requests summed), each request (method, path, range, whether
it carried a token, its status), and whether a block was reached. A repository "unhashed" (the
sparse Ling checkpoint: 60 GB of holes) has stand-in sha256s and refuses whole-file GETs: only its
headers are ever read.

A hostile hub, for the tests that attack the client (issue 40), each scenario switched on by the
test that needs it and gone at "reset":
- {"op": "repo", "repo": R, "files": {path: text, or {"base64": ...}}, "generate": {"count": N,
  "pattern": "f-{:05d}.json"}} serves R from memory (N generated JSON files beside `files`); the
  answer names its commit.
- {"op": "lie", "repo": R, "where": "info" | "listing" | "head", "path": P, "set": {...}, "from": K}:
  the model info says `set` ("sha": ...), P's listing entry says it ("blobId", "size",
  "lfs.sha256", "lfs.size", "rfilename"), or P's HEAD answers carry those headers ("ETag",
  "X-Linked-Etag", "X-Repo-Commit", "X-Linked-Size") from the K-th HEAD of P on (default the
  first). A commit the hub lies about resolves like the real one, so the client gets as far as
  it would with a hub that said it.
- {"op": "extra", "path": P, "bytes": N, "length": "sent" | "none"}: N bytes more than P has,
  with a Content-Length that counts them ("sent") or none at all (the body ends when the server
  closes: an endless file, for the client to stop).
- {"op": "trickle", "path": P, "after": N, "every": S}: after N bytes of P, one byte every S
  seconds until "release" (`blocked` says it began).
- {"op": "norange", "path": P}: a Range request for P is answered with the whole file (200), as
  some CDNs do.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".png", ".msgpack")
LFS_MIN_SIZE = 10 * 1024 * 1024
TOKENS = {"hf_test_granted": "granted", "hf_test_not_granted": "not-granted"}
CHUNK = 64 * 1024


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repos:
    def __init__(self, root: Path):
        self.root = root
        self.spec = json.loads((root / "repos.json").read_text())
        self.files: dict[tuple[str, str], dict[str, dict]] = {}  # (repo, commit) -> path -> meta
        self.by_sha: dict[str, Path] = {}
        for repo, spec in self.spec.items():
            for commit, rel in spec["commits"].items():
                base = root / rel  # an absolute path stays as it is
                entries = {}
                for path in sorted(p for p in base.rglob("*") if p.is_file()):
                    name = path.relative_to(base).as_posix()
                    size = path.stat().st_size
                    lfs = name.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
                    meta = {"path": name, "file": path, "size": size, "lfs": lfs}
                    if lfs:
                        if spec.get("unhashed"):
                            with open(path, "rb") as handle:
                                head = handle.read(65536)
                            sha = hashlib.sha256(f"stand-in:{name}:{size}:".encode() + head).hexdigest()
                        else:
                            sha = _sha256(path)
                        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
                        meta.update(sha256=sha, oid=git_oid(pointer), pointer_size=len(pointer))
                        self.by_sha[sha] = path
                    else:
                        meta.update(oid=git_oid(path.read_bytes()))
                    entries[name] = meta
                self.files[(repo, commit)] = entries

        self.on_disk = set(self.spec)

    def add_memory_repo(self, repo: str, files: dict[str, bytes]) -> str:
        """`repo` served from memory at one commit (its main): {path: bytes}."""
        commit = hashlib.sha1(f"memory:{repo}:{len(files)}".encode()).hexdigest()
        entries = {}
        for name, data in sorted(files.items()):
            lfs = name.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE
            meta = {"path": name, "data": data, "size": len(data), "lfs": lfs}
            if lfs:
                sha = hashlib.sha256(data).hexdigest()
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
                meta.update(sha256=sha, oid=git_oid(pointer), pointer_size=len(pointer))
                self.by_sha[sha] = meta
            else:
                meta.update(oid=git_oid(data))
            entries[name] = meta
        self.spec[repo] = {"refs": {"main": commit}, "commits": {commit: "(memory)"}}
        self.files[(repo, commit)] = entries
        return commit

    def drop_memory_repos(self) -> None:
        for repo in [r for r in self.spec if r not in self.on_disk]:
            for commit in self.spec.pop(repo)["commits"]:
                self.files.pop((repo, commit), None)

    def commit_of(self, repo: str, rev: str, lies: list[dict] = ()) -> str | None:
        spec = self.spec[repo]
        if rev in spec["commits"]:
            return rev
        if any(lie["repo"] == repo and rev in (lie["set"].get("sha"), lie["set"].get("X-Repo-Commit")) for lie in lies):
            return spec["refs"].get("main")
        return spec["refs"].get(rev)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class State:
    def __init__(self, repos: Repos):
        self.lock = threading.Lock()
        self.reset()
        self.repos = repos

    def reset(self):
        with getattr(self, "lock", threading.Lock()):
            self.faults: list[dict] = []
            self.served: dict[str, int] = {}
            self.requests: list[dict] = []
            self.blocked: dict[str, bool] = {}
            self.lies: list[dict] = []
            self.heads: dict[tuple[str, str], int] = {}
            self.release = threading.Event()
            if hasattr(self, "repos"):
                self.repos.drop_memory_repos()

    def stats(self) -> dict:
        with self.lock:
            return {"served": dict(self.served), "requests": list(self.requests), "blocked": dict(self.blocked)}

    def lies_for(self, repo: str, where: str, path: str | None = None, count: int = 1) -> dict:
        """What the hub says instead, for `repo` (its `path`, at the `count`-th request of it)."""
        out: dict = {}
        with self.lock:
            for lie in self.lies:
                if (lie["repo"] == repo and lie["where"] == where and lie.get("path") in (None, path)
                        and count >= lie.get("from", 1)):
                    out.update(lie["set"])
        return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sparkit-test-hub/1"
    state: State
    cdn_base: str
    api_base: str
    is_cdn = False

    def log_message(self, format, *args):  # quiet: the tests read /_control/stats
        pass

    # -- plumbing

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _log(self, status: int) -> None:
        with self.state.lock:
            self.state.requests.append({"method": self.command, "path": urlparse(self.path).path,
                                        "range": self.headers.get("Range"), "token": self._token() is not None,
                                        "status": status, "cdn": self.is_cdn})

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
        self._log(status)
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data, headers: dict | None = None):
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status: int, code: str | None, message: str, headers: dict | None = None):
        h = dict(headers or {})
        if code:
            h["X-Error-Code"] = code
        h["X-Error-Message"] = message
        self._json(status, {"error": message}, h)

    def _access(self, repo: str) -> bool:
        """Answers the error itself and returns False when the token may not read `repo`."""
        spec = self.state.repos.spec.get(repo)
        token = self._token()
        if token is not None and token not in TOKENS:
            self._error(401, None, "Invalid credentials in Authorization header")
            return False
        if spec is None or (spec.get("private") and token is None):
            self._error(401 if token is None else 404, "RepoNotFound", "Repository not found")
            return False
        if spec.get("gated") and not self.is_info:
            if token is None:
                self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access to it and "
                                              "be authenticated to access it. Please log in.")
                return False
            if TOKENS[token] != "granted":
                self._error(403, "GatedRepo", f"Access to model {repo} is restricted and you are not in the "
                                              f"authorized list. Visit {self.api_base}/{repo} to ask for access.")
                return False
        return True

    # -- routes

    def do_POST(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if url.path == "/_control":
            return self._control(json.loads(raw or b"{}"))
        parts = url.path.strip("/").split("/")
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "paths-info":
            self.is_info = True
            repo, rev = "/".join(parts[2:4]), unquote("/".join(parts[5:]))
            if not self._access(repo):
                return
            commit = self.state.repos.commit_of(repo, rev, self.state.lies)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            form = parse_qs(raw.decode())
            files = self.state.repos.files[(repo, commit)]
            return self._json(200, [_tree_entry(files[p]) for p in form.get("paths", []) if p in files])
        return self._error(404, None, "Not found")

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlparse(self.path)
        self.is_info = False
        if self.is_cdn:
            return self._cdn(url)
        if url.path == "/_control/stats":
            return self._json(200, self.state.stats())
        parts = url.path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self.is_info = True
            return self._api(parts[2:], parse_qs(url.query))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), unquote(parts[3]), unquote("/".join(parts[4:])))
        return self._error(404, None, "Not found")

    def _api(self, parts: list[str], query: dict):
        repo = "/".join(parts[:2])
        if not self._access(repo):
            return
        rest = parts[2:]
        rev = "main"
        if rest[:1] == ["revision"]:
            rev, rest = unquote("/".join(rest[1:])), []
        elif rest[:1] == ["tree"]:
            rev = unquote(rest[1]) if len(rest) > 1 else "main"
        commit = self.state.repos.commit_of(repo, rev, self.state.lies)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        files = self.state.repos.files[(repo, commit)]
        if parts[2:3] == ["tree"]:
            prefix = "/".join(parts[4:])
            return self._json(200, [_tree_entry(m) for p, m in files.items() if p.startswith(prefix)])
        spec = self.state.repos.spec[repo]
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for path, meta in files.items():
            entry = {"rfilename": path}
            if blobs:
                entry.update(size=meta["size"] if not meta["lfs"] else meta["pointer_size"], blobId=meta["oid"])
                if meta["lfs"]:
                    entry["lfs"] = {"size": meta["size"], "sha256": meta["sha256"], "pointerSize": meta["pointer_size"]}
            _lie_into(entry, self.state.lies_for(repo, "listing", path))
            siblings.append(entry)
        info = {"_id": repo, "id": repo, "modelId": repo, "sha": commit, "private": bool(spec.get("private")),
                "gated": spec.get("gated") or False, "disabled": False, "siblings": siblings,
                "tags": [], "downloads": 0, "likes": 0, "lastModified": "2026-01-01T00:00:00.000Z"}
        info.update(self.state.lies_for(repo, "info"))
        return self._json(200, info)

    def _resolve(self, repo: str, rev: str, path: str):
        if not self._access(repo):
            return
        commit = self.state.repos.commit_of(repo, rev, self.state.lies)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        meta = self.state.repos.files[(repo, commit)].get(path)
        if meta is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"", {"X-Repo-Commit": commit})
        lies = {}
        if self.command == "HEAD":
            with self.state.lock:
                count = self.state.heads[(repo, path)] = self.state.heads.get((repo, path), 0) + 1
            lies = self.state.lies_for(repo, "head", path, count)
        common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if meta["lfs"]:
            location = f"{self.cdn_base}/lfs/{meta['sha256']}?repo={quote(repo)}&file={quote(path)}&sig=signed"
            return self._send(302, b"", {**common, "Location": location, "ETag": f'"{meta["oid"]}"',
                                         "X-Linked-Etag": f'"{meta["sha256"]}"', "X-Linked-Size": meta["size"], **lies})
        return self._body(f"{repo}/{path}", meta, {**common, "ETag": f'"{meta["oid"]}"', **lies}, unhashed=False)

    def _cdn(self, url):
        parts = url.path.strip("/").split("/")
        query = parse_qs(url.query)
        if len(parts) != 2 or parts[0] != "lfs" or parts[1] not in self.state.repos.by_sha or query.get("sig") != ["signed"]:
            return self._send(403, b"<Error>AccessDenied</Error>", content_type="application/xml")
        repo, path = query["repo"][0], query["file"][0]
        same = [m for (r, _), files in self.state.repos.files.items() if r == repo
                for m in files.values() if m.get("sha256") == parts[1]]
        if not same:
            return self._send(403, b"<Error>AccessDenied</Error>", content_type="application/xml")
        meta = next((m for m in same if m["path"] == path), same[0])  # identical copies share a sha256
        unhashed = bool(self.state.repos.spec[repo].get("unhashed"))
        return self._body(f"{repo}/{path}", meta, {"ETag": f'"{meta["sha256"]}"', "Accept-Ranges": "bytes"}, unhashed)

    def _body(self, key: str, meta: dict, headers: dict, unhashed: bool):
        size = meta["size"]
        start, end = 0, size - 1
        status = 200
        with self.state.lock:
            ignore_range = any(f["op"] == "norange" and f["path"] in (meta["path"], key) for f in self.state.faults)
        wanted = None if ignore_range else self.headers.get("Range")
        if wanted:
            spec = wanted.strip().removeprefix("bytes=")
            first, _, last = spec.partition("-")
            start = int(first) if first else max(0, size - int(last))
            end = min(int(last), size - 1) if first and last else size - 1
            if start >= size:
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{size}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{size}"}
        elif unhashed and self.command == "GET":
            return self._error(500, None, "this test file is only range-read (its sha256 is a stand-in)")
        length = end - start + 1
        with self.state.lock:
            faults = [f for f in self.state.faults if f["path"] == meta["path"] or f["path"] == key]
        extra = next((f for f in faults if f["op"] == "extra"), None)
        self._log(status)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Type", "application/octet-stream")
        if extra is None or self.command == "HEAD" or extra.get("length") == "sent":  # HEAD: the listed size
            self.send_header("Content-Length", str(length + (extra["bytes"] if extra and self.command != "HEAD" else 0)))
        else:  # no length: the body ends when the server closes the connection
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            self._send_range(key, meta, start, length, faults)
            if extra is not None:
                self._send_extra(key, extra["bytes"])
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_range(self, key: str, meta: dict, start: int, length: int, faults: list[dict]) -> None:
        """Bytes [start, start + length) of the file, with the faults asked for: flipped bytes,
        a connection cut at a byte (and at once for a request that starts past it), held, or
        trickled."""
        if any(f["op"] == "cut" and f.get("times", 1) != 0 and start >= f["after"] for f in faults):
            return self._drop()  # the network is still down where this request resumes
        sent = 0
        with (open(meta["file"], "rb") if "file" in meta else io.BytesIO(meta["data"])) as handle:
            handle.seek(start)
            while sent < length:
                position = start + sent
                chunk = bytearray(handle.read(min(CHUNK, length - sent)))
                for fault in faults:
                    if fault["op"] == "flip" and fault.get("times", 1) != 0 and position <= fault["offset"] < position + len(chunk):
                        chunk[fault["offset"] - position] ^= 0xFF
                        self._spend(fault)
                stop = next((f for f in faults if f["op"] in ("cut", "block", "trickle") and f.get("times", 1) != 0
                             and position < f["after"] <= position + len(chunk)), None)
                if stop is None:
                    self._write(key, bytes(chunk))
                    sent += len(chunk)
                    continue
                self._write(key, bytes(chunk[:stop["after"] - position]))
                self._spend(stop)
                self.wfile.flush()
                if stop["op"] == "trickle":
                    return self._trickle(key, meta, handle, length - (stop["after"] - start), stop["every"])
                if stop["op"] == "block":  # hold the connection until released, then drop it
                    with self.state.lock:
                        self.state.blocked[meta["path"]] = True
                    self.state.release.wait()
                return self._drop()

    def _trickle(self, key: str, meta: dict, handle, left: int, every: float) -> None:
        """One byte of the rest every `every` seconds, until released (then the connection drops)."""
        with self.state.lock:
            self.state.blocked[meta["path"]] = True
        while left > 0 and not self.state.release.wait(every):
            self._write(key, handle.read(1))
            self.wfile.flush()
            left -= 1
        self._drop()

    def _send_extra(self, key: str, count: int) -> None:
        """Bytes the file does not have, after it (a hub that sends more than it listed)."""
        while count > 0:
            block = b"\0" * min(CHUNK, count)
            self._write(key, block)
            count -= len(block)
        self.wfile.flush()

    def _spend(self, fault: dict) -> None:
        with self.state.lock:
            if fault.get("times", 1) > 0:
                fault["times"] = fault.get("times", 1) - 1

    def _write(self, key: str, data: bytes) -> None:
        self.wfile.write(data)
        with self.state.lock:
            self.state.served[key] = self.state.served.get(key, 0) + len(data)

    def _drop(self) -> None:
        """The connection ends mid-body, as a dropped network does."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True

    def _control(self, command: dict):
        op = command.get("op")
        if op == "reset":
            self.state.release.set()
            self.state.reset()
        elif op == "release":
            self.state.release.set()
        elif op in ("cut", "flip", "block", "extra", "trickle", "norange"):
            with self.state.lock:
                self.state.faults.append(dict(command))
        elif op == "lie":
            with self.state.lock:
                self.state.lies.append(dict(command))
        elif op == "repo":
            files = {p: (base64.b64decode(v["base64"]) if isinstance(v, dict) else v.encode())
                     for p, v in (command.get("files") or {}).items()}
            many = command.get("generate")
            if many:
                for i in range(many["count"]):
                    files[many["pattern"].format(i)] = json.dumps({"n": i}).encode()
            with self.state.lock:
                commit = self.state.repos.add_memory_repo(command["repo"], files)
            return self._json(200, {"ok": True, "commit": commit})
        else:
            return self._json(400, {"error": f"unknown op {op!r}"})
        return self._json(200, {"ok": True})


def _lie_into(entry: dict, lies: dict) -> None:
    """A listing entry saying what the hub lies: "lfs.sha256" sets entry["lfs"]["sha256"]."""
    for key, value in lies.items():
        outer, _, inner = key.partition(".")
        if inner:
            entry.setdefault(outer, {})[inner] = value
        else:
            entry[key] = value


def _tree_entry(meta: dict) -> dict:
    entry = {"type": "file", "oid": meta["oid"], "size": meta["size"] if not meta["lfs"] else meta["pointer_size"],
             "path": meta["path"]}
    if meta["lfs"]:
        entry["lfs"] = {"oid": meta["sha256"], "size": meta["size"], "pointerSize": meta["pointer_size"]}
    return entry


def main(root: str) -> None:
    state = State(Repos(Path(root)))
    api = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    cdn = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.daemon_threads = cdn.daemon_threads = True
    api_base, cdn_base = f"http://127.0.0.1:{api.server_port}", f"http://127.0.0.1:{cdn.server_port}"
    api.RequestHandlerClass = type("Api", (Handler,), {"state": state, "cdn_base": cdn_base, "api_base": api_base})
    cdn.RequestHandlerClass = type("Cdn", (Handler,), {"state": state, "cdn_base": cdn_base, "api_base": api_base,
                                                       "is_cdn": True})
    threading.Thread(target=cdn.serve_forever, daemon=True).start()
    print(f"api={api.server_port} cdn={cdn.server_port}", flush=True)
    api.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
