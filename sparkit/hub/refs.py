"""A hub reference: `org/name` or `org/name@revision` (a branch, a tag or a commit).

A recipe's `model.path` (and `stack.speculative.draft_model`) names one when it is neither a local
directory nor one of sparkit's built-in models (`sparkit:...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REVISION = "main"
# What the hub accepts as a repository id: a namespace and a name.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# A git ref or a commit: branch and tag names (slashes allowed, as in refs/pr/1), no spaces.
_REVISION = re.compile(r"^[A-Za-z0-9._-][A-Za-z0-9._/-]*$")
# A git sha1 (a commit, and the object id of a file stored in git), matched whole (fullmatch).
COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubRef:
    repo: str  # org/name
    revision: str | None = None  # None: the repository's default branch

    @property
    def rev(self) -> str:
        return self.revision or DEFAULT_REVISION

    @property
    def pinned(self) -> bool:
        """The revision is a full commit hash (immutable: no hub request needed to resolve it)."""
        return bool(self.revision and COMMIT.fullmatch(self.revision))

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def parse_hub_ref(text: str) -> HubRef | None:
    """`org/name[@revision]` as a HubRef; None for anything else (a path, a built-in model)."""
    text = str(text).strip()
    if not text or text.startswith((".", "/", "~", "sparkit:")):
        return None
    repo, sep, revision = text.partition("@")
    if not _REPO_ID.match(repo) or ".." in repo:
        return None
    if sep and (not _REVISION.match(revision) or ".." in revision or revision.endswith("/")):
        return None
    return HubRef(repo, revision if sep else None)


def model_hub_ref(path: str | None) -> HubRef | None:
    """The hub reference a recipe's model path names, or None when it names a local directory
    (which wins: `org/name` may also be a relative path) or a built-in model."""
    if not path:
        return None
    if Path(path).expanduser().is_dir():
        return None
    return parse_hub_ref(path)


__all__ = ["HubRef", "parse_hub_ref", "model_hub_ref", "DEFAULT_REVISION", "COMMIT"]
