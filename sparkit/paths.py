"""Where sparkit keeps things on disk.

`SPARKIT_HOME`, when set, roots everything (tests and CI set it to a temporary
directory so that nothing leaks between runs). Otherwise the platform's user
directories are used.
"""

from __future__ import annotations

import os
from pathlib import Path


def _home() -> Path | None:
    value = os.environ.get("SPARKIT_HOME")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Built models (tiny-ling) and other regenerable artefacts."""
    home = _home()
    if home:
        return home / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sparkit"))


def data_dir() -> Path:
    """User data worth keeping: chat history, eval and bench results by default."""
    home = _home()
    if home:
        return home / "data"
    from platformdirs import user_data_dir

    return Path(user_data_dir("sparkit"))


def runs_dir() -> Path:
    """One sub-directory per started server (see sparkit.runs)."""
    home = _home()
    if home:
        return home / "runs"
    from platformdirs import user_state_dir

    return Path(user_state_dir("sparkit")) / "runs"


def repo_recipes_dir() -> Path:
    """The shipped recipes (top-level `recipes/` of the source tree)."""
    return Path(__file__).resolve().parent.parent / "recipes"


# ---------------------------------------------------------------- privacy of sparkit's state
#
# Runs hold plans, logs and startup checks; the data dir holds chat conversations, eval and bench
# results; the cache holds built models and downloads. All of it is private to its user whatever
# the umask: directories 0700, files 0600. Files a user names elsewhere (--out ./x.json) follow
# the user's umask. Every writer of sparkit goes through the helpers below, so this rule is
# written once.

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def state_roots() -> list[Path]:
    """The directories sparkit owns (everything below them is private)."""
    home = _home()
    if home:
        return [Path(os.path.abspath(home))]
    return [Path(os.path.abspath(p)) for p in (cache_dir(), data_dir(), runs_dir().parent)]


def is_state(path: str | Path) -> bool:
    """`path` is sparkit's own state (below one of state_roots())."""
    path = Path(os.path.abspath(path))
    return any(path == root or root in path.parents for root in state_roots())


def _tighten(path: Path, mode: int) -> None:
    try:
        st = path.stat()
        if st.st_uid == os.geteuid() and (st.st_mode & 0o777) != mode:
            os.chmod(path, mode)
    except OSError:
        pass


def ensure_dir(path: str | Path) -> Path:
    """`path` as an existing directory. Below sparkit's roots every directory from the root down
    is made (or tightened to) 0700; elsewhere missing parents follow the umask."""
    path = Path(os.path.abspath(path))
    root = next((r for r in state_roots() if path == r or r in path.parents), None)
    if root is None:
        path.mkdir(parents=True, exist_ok=True)
        return path
    if not root.parent.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
    chain = [root, *reversed([p for p in path.parents if root in p.parents])]
    if path != root:
        chain.append(path)
    for directory in chain:
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE)
            os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask
        except FileExistsError:
            _tighten(directory, PRIVATE_DIR_MODE)
    return path


_OPEN_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL, "r+": os.O_RDWR}


def open_output(path: str | Path, mode: str = "w", **kwargs):
    """open(path, mode) for writing; a file of sparkit's state is created (or tightened to) 0600
    and its directory made private. Modes: w, a, x, r+, with b for bytes."""
    path = Path(path)
    base = mode.replace("b", "").replace("t", "")
    if base not in _OPEN_FLAGS:
        raise ValueError(f"open_output: unsupported mode {mode!r}")
    if not is_state(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, mode, **kwargs)
    ensure_dir(path.parent)
    fd = os.open(path, _OPEN_FLAGS[base] | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and (st.st_mode & 0o777) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)  # written by an older sparkit under the umask
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def write_atomic(path: str | Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Replace `path` with `data` so that a reader sees the old file or the new one, never half
    of one; the temporary file is removed when the write fails (a full disk, say)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            with open_output(tmp, "wb") as handle:
                handle.write(data)
        else:
            with open_output(tmp, "w", encoding=encoding) as handle:
                handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def make_private_tree(path: str | Path) -> None:
    """Directories 0700 and files 0600 below `path` (what a third-party writer, torch or a
    tokenizer, left under the umask); only for sparkit's own state."""
    path = Path(path)
    if not is_state(path):
        return
    _tighten(path, PRIVATE_DIR_MODE if path.is_dir() else PRIVATE_FILE_MODE)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            _tighten(Path(dirpath) / name, PRIVATE_DIR_MODE)
        for name in filenames:
            if not os.path.islink(os.path.join(dirpath, name)):
                _tighten(Path(dirpath) / name, PRIVATE_FILE_MODE)
