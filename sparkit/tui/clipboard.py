"""Copying text out of the chat.

The app always sends OSC 52 (App.copy_to_clipboard: works in most terminals,
through ssh and tmux with `set -g set-clipboard on`). Because some terminals
ignore OSC 52 (macOS Terminal), the text is also piped to a system clipboard
tool when one is on PATH (wl-copy, xclip, xsel, pbcopy), and always written to
data_dir()/last-copy.txt so that it can be recovered whatever the terminal does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)

CLIPBOARD_TOOLS = (
    ("wl-copy", []),
    ("xclip", ["-selection", "clipboard"]),
    ("xsel", ["--clipboard", "--input"]),
    ("pbcopy", []),
)


def code_blocks(markdown: str) -> list[str]:
    """Contents of the fenced code blocks, in order (an unclosed last fence counts too)."""
    blocks = [m.group(2) for m in _FENCE.finditer(markdown)]
    fences = re.findall(r"^(?:```|~~~)", markdown, re.MULTILINE)
    if len(fences) % 2 == 1:  # a reply stopped inside a code block
        tail = markdown[[m.start() for m in re.finditer(r"^(?:```|~~~)", markdown, re.MULTILINE)][-1]:]
        blocks.append(tail.split("\n", 1)[1] if "\n" in tail else "")
    return blocks


def last_copy_path() -> Path:
    from sparkit.paths import data_dir

    return data_dir() / "last-copy.txt"


def copy_fallback(text: str) -> list[str]:
    """Write the text to last-copy.txt and to a clipboard tool if present; return where it went."""
    where: list[str] = []
    path = last_copy_path()
    from sparkit.paths import ensure_dir, open_output

    ensure_dir(path.parent)
    with open_output(path, "w") as handle:
        handle.write(text)
    where.append(str(path))
    for tool, args in CLIPBOARD_TOOLS:
        exe = shutil.which(tool)
        if not exe:
            continue
        try:
            subprocess.run([exe, *args], input=text.encode(), timeout=2, check=True,
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            where.append(tool)
        except (OSError, subprocess.SubprocessError):
            pass
        break
    return where
