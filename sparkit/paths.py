"""Where sparkit keeps things on disk.

`SPARKIT_HOME`, when set, roots everything (tests and CI set it to a temporary
directory so that nothing leaks between runs). Otherwise the platform's user
directories are used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path

from sparkit.errors import StateError


def _home() -> Path | None:
    value = os.environ.get("SPARKIT_HOME")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Built models (tiny-ling) and other regenerable artefacts."""
    return trusted_root(_cache_dir())


def data_dir() -> Path:
    """User data worth keeping: chat history, eval and bench results by default."""
    return trusted_root(_data_dir())


def runs_dir() -> Path:
    """One sub-directory per started server (see sparkit.runs)."""
    return trusted_root(_state_dir()) / "runs"


def _cache_dir() -> Path:
    home = _home()
    if home:
        return home / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sparkit"))


def _data_dir() -> Path:
    home = _home()
    if home:
        return home / "data"
    from platformdirs import user_data_dir

    return Path(user_data_dir("sparkit"))


def _state_dir() -> Path:
    home = _home()
    if home:
        return home
    from platformdirs import user_state_dir

    return Path(user_state_dir("sparkit"))


def repo_recipes_dir() -> Path:
    """The shipped recipes: the top-level `recipes/` of a source tree (an editable install, or
    `python -m sparkit` in a checkout), else the copy a wheel carries in the package
    (`sparkit/_shipped_recipes`, a link to `recipes/` in the source tree)."""
    package = Path(__file__).resolve().parent
    source_tree = package.parent / "recipes"
    return source_tree if source_tree.is_dir() else package / "_shipped_recipes"


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
    return [Path(os.path.abspath(p)) for p in (_cache_dir(), _data_dir(), _state_dir())]


def is_state(path: str | Path) -> bool:
    """`path` is sparkit's own state (below one of state_roots())."""
    path = Path(os.path.abspath(path))
    return any(path == root or root in path.parents for root in state_roots())


def _tighten(path: Path, mode: int) -> None:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return  # never chmod through a link (it would change what the link points at)
        if st.st_uid == os.geteuid() and (st.st_mode & 0o777) != mode:
            os.chmod(path, mode)
    except OSError:
        pass


# ---------------------------------------------------------------- trusting sparkit's state
#
# Run records name processes that `down` signals, and sparkit writes logs and results into its
# directories: a directory another user owns, or can write to, lets that user forge a record or
# plant a link that sparkit then writes through. As ssh does with ~/.ssh, such a directory is
# refused (StateError, exit 10) with the command that fixes it; files are opened without following
# links, and what was opened is checked.


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _who_writes(mode: int) -> str:
    return " and ".join(w for w, bit in (("its group", 0o020), ("every user", 0o002)) if mode & bit)


def _unsafe(path: Path, st: os.stat_result, what: str) -> StateError | None:
    me = os.geteuid()
    if st.st_uid != me:
        return StateError(
            f"{what} {path} belongs to {_user(st.st_uid)}, not to you ({_user(me)}): sparkit does not use state "
            "another user controls (a forged run record there would have `down` signal their choice of process)",
            hint=f"point SPARKIT_HOME at a directory of your own, or, if it is yours: chown -R {os.geteuid()} {path}")
    if st.st_mode & 0o022:
        return StateError(
            f"{what} {path} is writable by {_who_writes(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o}): another "
            "user could plant or replace files in it",
            hint=f"chmod go-w {path} (sparkit keeps its state at 0700), after checking nothing was planted there")
    return None


def check_private_dir(path: str | Path, what: str = "sparkit's directory") -> None:
    """`path`, an existing directory below a state root, is the user's own, writable by nobody
    else, and no link (a link could lead anywhere); raises StateError."""
    path = Path(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{what} {path} is a symbolic link (to {os.readlink(path)}): sparkit does not follow links "
                         "inside its state", hint=f"remove the link ({path}) and run the command again")
    problem = _unsafe(path, st, what)
    if problem:
        raise problem


def trusted_root(root: Path) -> Path:
    """`root` (SPARKIT_HOME, or the default cache, data or state directory), checked: when it
    exists it must be the user's and writable by nobody else, and every directory above it must
    belong to the user or root and be writable by nobody else (or sticky, as /tmp is), since
    whoever can rename an ancestor can swap the root. A link on the way (the root itself, or a
    directory above it) must be the user's or root's, and both where it is and where it leads are
    checked: another user's link could be pointed elsewhere after the check. Returns `root`;
    raises StateError."""
    written = Path(os.path.abspath(root))
    _check_links(written)
    try:
        st = os.stat(written)  # the root itself may be a link (~/.cache to another disk): its target counts
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StateError(f"sparkit's state directory {written}: {exc.strerror}",
                         hint="point SPARKIT_HOME at a directory of your own") from None
    absolute = written
    if st is not None:
        problem = _unsafe(written, st, "sparkit's state directory")
        if problem:
            raise problem
        absolute = Path(os.path.realpath(written))
    for ancestor in dict.fromkeys([*written.parents, *absolute.parents]):  # where a link is, and where it leads
        try:
            up = os.stat(ancestor)
        except OSError:
            continue  # not there yet (created 0700 by ensure_dir) or not ours to see
        if up.st_uid not in (0, os.geteuid()):
            raise StateError(f"{ancestor}, above sparkit's state directory {absolute}, belongs to {_user(up.st_uid)}: "
                             "that user could replace the state directory",
                             hint="point SPARKIT_HOME at a directory below your own home")
        if up.st_mode & 0o022 and not up.st_mode & stat.S_ISVTX:
            raise StateError(f"{ancestor}, above sparkit's state directory {absolute}, is writable by "
                             f"{_who_writes(up.st_mode)} (mode {stat.S_IMODE(up.st_mode):04o}) without the sticky bit: "
                             "another user could rename the state directory and put their own in its place",
                             hint=f"chmod go-w {ancestor}, or chmod +t {ancestor} (as /tmp is)")
    return root


def _check_links(path: Path) -> None:
    """Every symbolic link on the way to `path` (itself included) belongs to the user or root."""
    for step in [*reversed(path.parents), path]:
        try:
            st = os.lstat(step)
        except OSError:
            return  # not there (yet): nothing below it is either
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            raise StateError(
                f"{step}, on the way to sparkit's state directory {path}, is a symbolic link that belongs to "
                f"{_user(st.st_uid)} (to {os.readlink(step)}): that user can point it at another directory at any "
                "time, their own with a forged record in it",
                hint="point SPARKIT_HOME at the directory itself (its realpath, if the directory is yours), "
                     "not through another user's link")


def ensure_dir(path: str | Path) -> Path:
    """`path` as an existing directory. Below sparkit's roots every directory from the root down
    is made (or tightened to) 0700 and checked to be the user's own and no link (StateError
    otherwise); elsewhere missing parents follow the umask."""
    path = Path(os.path.abspath(path))
    root = next((r for r in state_roots() if path == r or r in path.parents), None)
    if root is None:
        path.mkdir(parents=True, exist_ok=True)
        return path
    trusted_root(root)
    if not root.parent.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        trusted_root(root)  # what was just made above it is the user's
    chain = [root, *reversed([p for p in path.parents if root in p.parents])]
    if path != root:
        chain.append(path)
    for directory in chain:
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE)
            os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask
        except FileExistsError:
            _tighten(directory, PRIVATE_DIR_MODE)
        except OSError as exc:  # a full disk, a read-only file system
            raise write_error(directory, exc) from None
        if directory == root:
            trusted_root(root)  # made by someone else between the check and the mkdir: refused here
        else:
            check_private_dir(directory)
    return path


_OPEN_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL, "r+": os.O_RDWR, "r": os.O_RDONLY}


def open_output(path: str | Path, mode: str = "w", **kwargs):
    """open(path, mode) for writing; a file of sparkit's state is created (or tightened to) 0600,
    its directory made private, and it is opened without following a link: a link, or a file
    another user owns or that has other names (hard links), is refused (StateError) before
    anything is written. Modes: w, a, x, r+, with b for bytes."""
    path = Path(path)
    base = mode.replace("b", "").replace("t", "")
    if base not in _OPEN_FLAGS or base == "r":
        raise ValueError(f"open_output: unsupported mode {mode!r}")
    if not is_state(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, mode, **kwargs)
    ensure_dir(path.parent)
    # O_TRUNC waits until the file is known to be the right one.
    flags = (_OPEN_FLAGS[base] & ~os.O_TRUNC) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = _open_state_file(path, flags, mode)
    try:
        if _OPEN_FLAGS[base] & os.O_TRUNC:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def open_state(path: str | Path, mode: str = "r", **kwargs):
    """open(path, "r") for a file of sparkit's state, refusing a link or a file that is not the
    user's own (what another user planted is not read as a record). Outside the state: open()."""
    path = Path(path)
    if not is_state(path):
        return open(path, mode, **kwargs)
    return os.fdopen(_open_state_file(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode), mode, **kwargs)


def _open_state_file(path: Path, flags: int, mode: str) -> int:
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise StateError(f"{path} is a symbolic link (to {os.readlink(path)}): sparkit does not write or read its "
                             "state through links", hint=f"remove the link ({path}) and run the command again") from None
        if exc.errno in _FULL or exc.errno == errno.EROFS:
            raise write_error(path, exc) from None
        raise
    try:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = StateError(f"{path} is not a regular file", hint=f"remove it ({path}) and run the command again")
        elif st.st_uid != os.geteuid():
            problem = _unsafe(path, st, "the file")
        elif st.st_nlink > 1 and not (flags & os.O_EXCL):
            problem = StateError(f"{path} has {st.st_nlink} names (hard links): writing it would change the other "
                                 "files too", hint=f"remove it ({path}) and run the command again")
        if problem:
            raise problem
        if (st.st_mode & 0o777) != PRIVATE_FILE_MODE and mode[0] != "r":
            os.fchmod(fd, PRIVATE_FILE_MODE)  # written by an older sparkit under the umask
        return fd
    except BaseException:
        os.close(fd)
        raise


_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """The write failed because the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in _FULL

MIN_FREE_BYTES = 1024 * 1024
"""What a start needs free beside its run: the plan, the record and the first log lines."""


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding `path` (its nearest
    existing ancestor); None where the OS cannot tell."""
    path = Path(os.path.abspath(path))
    for candidate in (path, *path.parents):
        try:
            vfs = os.statvfs(candidate)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return vfs.f_bavail * vfs.f_frsize
    return None


def write_error(path: str | Path, exc: OSError) -> Exception:
    """A failed write as a user reads it, naming the file and what to do: a StateError for
    sparkit's own state (exit 10), else the OSError with its file name (the CLI names it)."""
    path = Path(path)
    reason = exc.strerror or str(exc)
    if not is_state(path):
        return OSError(exc.errno, reason, str(path))
    where = path.parent
    if exc.errno in _FULL:
        hint = f"free space on the file system holding {where} (`df -h {where}`), then run the command again"
    elif exc.errno == errno.EROFS:
        hint = f"{where} is on a read-only file system: point SPARKIT_HOME at a writable directory"
    else:
        hint = f"check {where} and the disk it is on, then run the command again"
    return StateError(f"cannot write {path}: {reason}", hint=hint)


def write_atomic(path: str | Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Replace `path` with `data` so that a reader sees the old file or the new one, never half
    of one; the temporary file is removed when the write fails (a full disk, say). The temporary
    file is created new (O_EXCL): a link planted under its name is never written through.

    On a full disk a file of sparkit's state that already has room for `data` (a run record
    rewritten with a new state: one block) is rewritten in place rather than left saying what is
    no longer true. Anything else that cannot be written raises `write_error` (StateError for
    the state, naming the file and the fix)."""
    path = Path(path)
    raw = data if isinstance(data, bytes) else data.encode(encoding)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    created = False
    try:
        if is_state(tmp):
            ensure_dir(tmp.parent)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a torn one of a crashed process with this pid (or a planted link)
        with open_output(tmp, "xb") as handle:
            created = True
            handle.write(raw)
        os.replace(tmp, path)
    except OSError as exc:
        if created:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if exc.errno in _FULL and is_state(path) and _rewrite_in_place(path, raw):
            return path
        raise write_error(path, exc) from None
    except BaseException:
        if created:
            tmp.unlink(missing_ok=True)
        raise
    return path


def _rewrite_in_place(path: Path, raw: bytes) -> bool:
    """Overwrite an existing state file whose blocks already hold `raw` (no new space needed);
    False when it has no room or this fails too."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_blocks * 512 < len(raw):
            return False
        with open_output(path, "r+b") as handle:
            handle.write(raw)
            handle.truncate()
        return True
    except (OSError, StateError):
        return False


def make_private_tree(path: str | Path) -> None:
    """Directories 0700 and files 0600 below `path` (what a third-party writer, torch or a
    tokenizer, left under the umask); only for sparkit's own state."""
    path = Path(path)
    if not is_state(path):
        return
    _tighten(path, PRIVATE_DIR_MODE if path.is_dir() else PRIVATE_FILE_MODE)
    for dirpath, dirnames, filenames in os.walk(path):  # os.walk does not descend into links
        for name in dirnames:
            _tighten(Path(dirpath) / name, PRIVATE_DIR_MODE)
        for name in filenames:
            if not os.path.islink(os.path.join(dirpath, name)):
                _tighten(Path(dirpath) / name, PRIVATE_FILE_MODE)
