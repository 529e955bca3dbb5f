"""What a hub says, checked before it names a path or a byte count.

A hub (or the mirror HF_ENDPOINT names) is input like any other. Its ids become file names in
the Hugging Face cache (`blobs/<etag>`, `snapshots/<commit>/<path>`, `.locks/.../<etag>.lock`)
and in sparkit's own (`pulls/.../<commit>.json`, `hub-headers/.../<commit>.json`), and its sizes
bound what a download may write. Unchecked, an etag that is an absolute path replaces the
cache's root: a hostile hub had `sparkit pull` delete the user's files and `sparkit plan`
overwrite them. Each value is checked against what a Hugging Face hub sends:

    a commit (sha, X-Repo-Commit)        40 lowercase hex digits (a git sha1)
    a git object id (blobId, ETag)       40 lowercase hex digits
    an LFS sha256 (lfs.sha256, X-Linked-Etag)  64 lowercase hex digits
    a size (size, lfs.size)              an integer from 0 to MAX_FILE_BYTES
    a file name (rfilename)              relative and /-separated, no empty, `.` or `..` part, no NUL

Anything else is a HubError (exit 9) naming the hub, the repository, the file and the field, and
showing the value as Python writes it (a hostile string never reaches the terminal raw).
"""

from __future__ import annotations

import re
from typing import Any

from sparkit.errors import HubError
from sparkit.hub.refs import COMMIT

SHA256 = re.compile(r"[0-9a-f]{64}")
# 1 TiB: twenty times the largest safetensors shard of a real checkpoint, and what a size must be
# below before sparkit counts disk or bytes by it.
MAX_FILE_BYTES = 1 << 40
MAX_NAME_BYTES = 255  # a file system's NAME_MAX, for each part of a file name
SHOWN_CHARS = 80
HINT = ("HF_ENDPOINT must point at a Hugging Face hub (or a mirror that speaks its API): a hub that sends this is "
        "broken or hostile, and nothing it named was read, written or deleted")


def shown(value: Any, width: int = SHOWN_CHARS) -> str:
    """`value` as Python writes it, cut to `width`: control characters and escapes stay visible,
    and a hash reads as its first digits."""
    text = value if isinstance(value, str) and (COMMIT.fullmatch(value) or SHA256.fullmatch(value)) else repr(value)
    return text if len(text) <= width else text[:width] + "..."


def refused(where: str, field: str, value: Any, what: str) -> HubError:
    return HubError(f"{where}: {field} {shown(value)} is not {what}", hint=HINT)


def commit(value: Any, where: str, field: str = "sha") -> str:
    if not (isinstance(value, str) and COMMIT.fullmatch(value)):
        raise refused(where, field, value, "a commit (40 hex digits)")
    return value


def git_oid(value: Any, where: str, field: str = "blobId") -> str:
    if not (isinstance(value, str) and COMMIT.fullmatch(value)):
        raise refused(where, field, value, "a git object id (40 hex digits)")
    return value


def sha256(value: Any, where: str, field: str = "lfs.sha256") -> str:
    if not (isinstance(value, str) and SHA256.fullmatch(value)):
        raise refused(where, field, value, "a sha256 (64 hex digits)")
    return value


def is_etag(value: Any) -> bool:
    """A blob's name in the Hugging Face cache: a git object id or an LFS sha256."""
    return isinstance(value, str) and bool(COMMIT.fullmatch(value) or SHA256.fullmatch(value))


def size(value: Any, where: str, field: str = "size") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FILE_BYTES:
        raise refused(where, field, value, f"a size (an integer from 0 to {MAX_FILE_BYTES} bytes)")
    return value


def file_name(value: Any, where: str, field: str = "rfilename") -> str:
    """A path inside a snapshot: relative, its parts neither empty nor `.` nor `..`."""
    parts = value.split("/") if isinstance(value, str) else []
    if (not parts or "\0" in value or any(p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
                                          for p in parts)):
        raise refused(where, field, value, "a file name inside the repository")
    return value


__all__ = ["commit", "git_oid", "sha256", "size", "file_name", "is_etag", "shown", "refused", "MAX_FILE_BYTES",
           "SHA256"]
