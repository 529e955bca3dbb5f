"""The load guard against a real process that allocates memory step by step (the stand-in engine
of tests/memory/standin_engine.py), started through sparkit's own `launch`: prints the guard's
log and the error `sparkit up` would show.

    python3 benchmarks/memory_guard_standin.py [--below-mib 512] [--max-mib 1536]

The floor is set `--below-mib` under what is available now, so the run takes about that much
memory before the guard stops it (keep it small on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--below-mib", type=int, default=512)
    parser.add_argument("--max-mib", type=int, default=1536)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="guard-standin-"))
    os.environ["SPARKIT_HOME"] = str(work / "home")

    from sparkit.contract.plan import Expectations, LaunchPlan
    from sparkit.errors import LaunchError
    from sparkit.memory.meminfo import read_meminfo
    from sparkit.memory.units import gib
    from sparkit.runs import free_port, launch, list_runs, stop

    ckpt = work / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    with open(ckpt / "model.safetensors", "wb") as handle:  # 64 MiB of "weights", in the page cache
        handle.write(os.urandom(64 << 20))
        handle.flush()
        os.fsync(handle.fileno())
    floor = read_meminfo().available - (args.below_mib << 20)
    port = free_port()
    plan = LaunchPlan(
        engine="embedded", argv=[sys.executable, str(REPO / "tests" / "memory" / "standin_engine.py"), str(port), "32",
                                 str(args.max_mib), "0", str(work / "allocated")],
        env={}, host="127.0.0.1", port=port, model=str(ckpt), served_model_name="stand-in", recipe_name="stand-in",
        recipe_path=None, expectations=Expectations(),
        recipe={"server": {"memory_guard": {"enabled": True, "floor_gib": floor / 1024**3}}})
    try:
        run = launch(plan, timeout=120)
        print("the engine became ready: the guard did not stop it")
        stop(run)
    except LaunchError as exc:
        print(f"error: {exc}\n")
    run = list_runs()[-1]
    print(f"stand-in allocated {gib(int((work / 'allocated').read_text()))} before it was stopped\n")
    print(f"{run.path / 'memory-guard.jsonl'}:")
    for line in (run.path / "memory-guard.jsonl").read_text().splitlines():
        event = json.loads(line)
        extra = {k: v for k, v in event.items() if k not in ("t_s", "event", "available", "free", "page_cache")}
        shown = ", ".join(f"{k}={g2(v) if k.endswith(('bytes', 'below', 'floor', 'used', 'available', 'free')) else v}"
                          for k, v in extra.items())
        print(f"  {event['t_s']:6.2f}s {event['event']:5}  available {g2(event['available']):>10}  free "
              f"{g2(event['free']):>10}  {shown}")


def g2(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


if __name__ == "__main__":
    main()
