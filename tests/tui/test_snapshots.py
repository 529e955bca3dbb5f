"""Snapshots of the chat's main screens (pytest-textual-snapshot).

The states are deterministic: a conversation reopened from the store with its
stored figures, a run directory with recorded startup checks, no live server
(health polling off), fixed timestamps shown in UTC. Regenerate after a
deliberate change with `pytest tests/tui/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import time

import pytest

from sparkit.runs import Run
from sparkit.tui.app import create_app
from sparkit.tui.history import ChatStore

SIZE = (120, 36)
DEAD_URL = "http://127.0.0.1:9"  # never contacted: health polling is off
T0 = 1_790_000_000.0

REPLY = """Batch-1 decode speed is bounded by memory bandwidth: every token reads the active weights.

- **MoE backend**: humming reads MXFP4 experts
- **FP8 lm_head**: halves the 805 MB head read
- **NEXTN MTP**: commits several tokens per verify step

```python
tok_s = tokens / (t_last - t_first)  # TTFT excluded
```
"""


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def metrics(tokens: int, seconds: float, accept: float | None, ttft: float = 0.05) -> dict:
    return {"t_start": 0.0, "t_first": ttft, "t_last": ttft + seconds, "output_tokens": tokens,
            "accept_length": accept, "exact": True, "status": "done"}


def prepared(tmp_path):
    store_path = tmp_path / "chat.sqlite3"
    store = ChatStore(store_path)
    older = store.new_conversation("what is a tiny MoE?")
    store.add_message(older, "user", "what is a tiny MoE?")
    store.add_message(older, "assistant", "A mixture of experts small enough for a laptop.", metrics=metrics(12, 0.2, 2.1))
    cid = store.new_conversation("why is batch-1 decode slow?")
    store.add_message(cid, "user", "why is batch-1 decode slow?")
    store.add_message(cid, "assistant", REPLY, metrics=metrics(96, 0.95, 2.68))
    store.add_message(cid, "user", "and with speculative decoding?")
    store.add_message(cid, "assistant", "Each verify step checks the draft's three tokens and",
                      status="stopped", metrics={**metrics(11, 0.2, None), "status": "stopped"})
    store._db.execute("UPDATE conversations SET created_at = ?, updated_at = ? WHERE id = ?", (T0, T0, older))
    store._db.execute("UPDATE conversations SET created_at = ?, updated_at = ? WHERE id = ?", (T0 + 3600, T0 + 3600, cid))
    store._db.commit()
    run = Run(id="20261129-ling", recipe_name="ling-flash-spark", recipe_path=None, engine="sglang", url="", host="", port=0, root=tmp_path / "runs")
    run.write_json("meta.json", {"recipe_name": "ling-flash-spark", "engine": "sglang"})
    run.write_json("plan.json", {"recipe_name": "ling-flash-spark", "engine": "sglang", "served_model_name": "ling-3.0-flash",
                                 "provisions": [{"optimisation": "moe_backend=humming"}, {"optimisation": "lm_head=fp8"},
                                                {"optimisation": "speculative=nextn"}]})
    run.write_json("checks.json", [
        {"name": "moe_backend", "title": "MoE backend", "status": "pass", "detail": "humming"},
        {"name": "lm_head", "title": "FP8 lm_head", "status": "pass", "detail": "fp8"},
        {"name": "draft_head", "title": "draft shares lm_head", "status": "pass", "detail": "same module"},
        {"name": "accept", "title": "accept length", "status": "fail", "detail": "1.00, expected >= 2.0"},
    ])
    return store_path, cid, run


@pytest.fixture(autouse=True)
def steady_cursor(monkeypatch):
    """An Input's cursor blinks on a 0.5 s timer, so a screen that takes longer to settle (a busy
    machine) was caught with it off, another time on. Drawn steadily, as on focus, every snapshot
    is the same however long the screen took."""
    from textual.widgets import Input

    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


@pytest.fixture(autouse=True)
def no_press_flash(monkeypatch):
    """A pressed Button shows its -active style for 0.2 s on a timer, so a snapshot taken right
    after a click caught it lit one time and unlit another (CI failed on it). Without the flash
    the pressed button is drawn as it rests, whatever the machine's speed."""
    from textual.widgets import Button

    monkeypatch.setattr(Button, "_start_active_affect", lambda self: None)


def app_for(tmp_path, *, open_conversation: bool = True):
    store_path, cid, run = prepared(tmp_path)
    return create_app(DEAD_URL, model="ling-3.0-flash", run=run, store_path=store_path, health_interval=None,
                      open_conversation=cid if open_conversation else None)


def test_reopened_conversation_with_metrics_and_startup_checks(snap_compare, tmp_path, utc):
    assert snap_compare(app_for(tmp_path), terminal_size=SIZE)


def test_new_chat(snap_compare, tmp_path, utc):
    assert snap_compare(app_for(tmp_path, open_conversation=False), terminal_size=SIZE)


def test_history_list(snap_compare, tmp_path, utc):
    assert snap_compare(app_for(tmp_path, open_conversation=False), press=["ctrl+o"], terminal_size=SIZE)


def test_settings_panel_rejects_a_bad_value(snap_compare, tmp_path, utc):
    async def bad_top_p(pilot):
        # Steps, not time: on a loaded machine one pause may not be enough for the dialog to mount
        # or for the click's message to be handled, so wait (boundedly) for each state to appear.
        await pilot.press("ctrl+t")
        for _ in range(200):
            await pilot.pause()
            if pilot.app.screen.query("#set-top_p"):
                break
        field = pilot.app.screen.query_one("#set-top_p")
        field.value = "0"
        await pilot.click("#settings-save")
        error = pilot.app.screen.query_one("#settings-error")
        for _ in range(200):
            await pilot.pause()
            if str(error.render()).strip():
                break
        await pilot.pause()

    assert snap_compare(app_for(tmp_path), run_before=bad_top_p, terminal_size=SIZE)


@pytest.mark.slow
def test_reopened_conversation_at_80x24(snap_compare, tmp_path, utc):
    """The smallest common terminal: the reply's figures whole (units and accept length), the
    connection state; the session figures and the sparkline only where they fit."""
    assert snap_compare(app_for(tmp_path), terminal_size=(80, 24))
