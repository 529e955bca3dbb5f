"""Paths every test may need. Import as `from _shared import GSM8K_DIR` (tests/ is on sys.path;
`from _shared import` is ambiguous once sub-folders have their own conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
# The workplace's shared folder (GPU session kits and logs); no test needs it to exist.
SHARED_DIR = Path(os.environ.get("SPARKIT_SHARED_DIR", REPO_DIR.parent / "shared"))
# GSM8K as shipped with sparkit (a fresh clone anywhere has it).
GSM8K_DIR = REPO_DIR / "sparkit" / "evals" / "data" / "gsm8k"


def near_tie_states(weight, n: int, seed: int, noise: float = 0.005):
    """[n, K] bf16 hidden states on weight's device whose two best tokens under the head `weight`
    ([N, K]; random pairs) are a few hundredths of a logit apart at about 20 logits, far above
    the rest: where per-row e4m3 rounding flips the bf16 argmax often enough to see (~14% of
    states on a CPU check). The exact re-scoring tests need such states."""
    import torch

    g = torch.Generator(device=weight.device).manual_seed(seed)
    w = weight.float()
    a = torch.randint(0, w.shape[0], (n,), generator=g, device=weight.device)
    b = torch.randint(0, w.shape[0], (n,), generator=g, device=weight.device)
    x = 20.0 * (w[a] / w[a].pow(2).sum(1, keepdim=True) + w[b] / w[b].pow(2).sum(1, keepdim=True))
    x = x + torch.randn(n, w.shape[1], generator=g, device=weight.device) * noise
    return x.to(torch.bfloat16)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(args: list[str], env: dict[str, str], columns: int, timeout: float = 60) -> str:
    """Run a command on a real pseudo-terminal `columns` wide (stdin, stdout and stderr), as a
    person at a terminal would; return what it drew, escape sequences removed."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    import select
    import time

    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 0.5)[0]:
                continue
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        if proc.poll() is None and time.monotonic() >= deadline:
            proc.kill()
    assert proc.wait(timeout=10) == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r", "")


def fill_disk(directory: Path, leave: int = 0, *, chunk: int = 4096) -> Path:
    """Fill the file system `directory` is on (a small tmpfs in the tests), then free `leave` bytes
    (tmpfs counts whole pages). Returns the filler file: unlink it to free the disk."""
    filler = Path(directory) / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while handle.write(b"\0" * chunk):
                pass
        except OSError:
            pass
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler

