"""What `sparkit --help` costs against a bare interpreter, as whole processes, paired run by run.

Each of N rounds starts `python -c pass` and `sparkit --help` (the venv's console script, the
interpreter beside this one; its output to /dev/null, or with --tty to a pseudo-terminal, as a
person sees it) one after the other, in alternating order, and reads each child's CPU time
(user + system, from wait4): a busy machine slows both of a pair alike, so the ratio of a pair
holds where either figure alone would not. Prints every pair and the medians side by side; the
figure is the median of the ratios (issue 36: at most 3x).

    python benchmarks/cli_startup.py --runs 30
    python benchmarks/cli_startup.py --runs 30 --tty
    python benchmarks/cli_startup.py -- up --help        # any other command line instead of --help
"""

from __future__ import annotations

import argparse
import os
import pty
import statistics
import sys
from pathlib import Path


def cpu_seconds(argv: list[str], tty: bool) -> float:
    """The CPU time (user + system) of one run of `argv`, its output thrown away."""
    if tty:
        pid, master = pty.fork()
        if pid == 0:
            os.execv(argv[0], argv)
        while True:  # drain, or the child blocks on a full terminal
            try:
                if not os.read(master, 65536):
                    break
            except OSError:
                break
        os.close(master)
    else:
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(argv[0], argv)
    _, _, usage = os.wait4(pid, 0)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="paired rounds (default 30)")
    parser.add_argument("--tty", action="store_true", help="give each child a pseudo-terminal as its stdout")
    parser.add_argument("--sparkit", default=str(Path(sys.executable).parent / "sparkit"),
                        help="the console script (default: the one beside this interpreter)")
    parser.add_argument("args", nargs="*", default=["--help"], help="sparkit's arguments (default: --help)")
    opts = parser.parse_args()
    bare = [sys.executable, "-c", "pass"]
    measured = [opts.sparkit, *opts.args]
    cpu_seconds(bare, opts.tty), cpu_seconds(measured, opts.tty)  # warm the page cache: not counted
    rows = []
    for index in range(opts.runs):
        if index % 2:
            command = cpu_seconds(measured, opts.tty)
            base = cpu_seconds(bare, opts.tty)
        else:
            base = cpu_seconds(bare, opts.tty)
            command = cpu_seconds(measured, opts.tty)
        rows.append((base, command))
    label = "sparkit " + " ".join(opts.args)
    print(f"{'run':>4}  {'python -c pass':>15}  {label:>15}  ratio" + ("  (on a pty)" if opts.tty else ""))
    for index, (base, command) in enumerate(rows, 1):
        print(f"{index:>4}  {base * 1000:>12.1f} ms  {command * 1000:>12.1f} ms  {command / base:5.2f}x")
    bases, commands = [b for b, _ in rows], [c for _, c in rows]
    ratios = [c / b for b, c in rows]
    print(f"median {statistics.median(bases) * 1000:>10.1f} ms  {statistics.median(commands) * 1000:>12.1f} ms  "
          f"{statistics.median(ratios):5.2f}x  (median of the {len(rows)} paired ratios; load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
