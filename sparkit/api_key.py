"""Which API key, from where: the one resolver that the launcher, the run store (`sparkit
status`), every client command (chat, eval, bench, check, tune, verify, ladder) and the embedded
engine ask.

The key a server enforces (what `sparkit up` hands the engine it starts):
  the recipe's `server.api_key_env` names the variable that holds it. A recipe that names none
  gets a server with no key: every variable the engine would read a key from by itself
  (`EngineAdapter.key_env`: $SPARKIT_API_KEY for the embedded engine; SGLang reads none, its key
  comes only by --api-key) and $SPARKIT_API_KEY for every engine are removed from the environment
  it starts in, so that a key exported for the clients never becomes one the server demands.

The key a client sends, the first of:
  1. the command's `--api-key` option;
  2. for a server sparkit started (a run, or a `--url` that is a live run's URL): the variable
     its recipe's `server.api_key_env` names, read in this shell; no key if the recipe names none;
  3. for a `--url` server sparkit did not start: $SPARKIT_API_KEY.

The embedded engine run by hand (`python -m sparkit.engines.embedded`): its `--api-key` flag,
else $SPARKIT_API_KEY.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

KEY_ENV = "SPARKIT_API_KEY"  # the clients' variable for a --url server, and the embedded engine's own


def recipe_key(api_key_env: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The key a recipe's `server.api_key_env` names, from the environment; None when the recipe
    names no variable or the variable is unset or empty."""
    if not api_key_env:
        return None
    return (os.environ if environ is None else environ).get(api_key_env) or None


def client_key(option: str | None, *, started_by_sparkit: bool, api_key_env: str | None = None,
               environ: Mapping[str, str] | None = None) -> str | None:
    """The key a client command sends (the module's precedence): `option` (--api-key), else the
    run's recipe variable `api_key_env` when sparkit started the server, else $SPARKIT_API_KEY."""
    if option:
        return option
    if started_by_sparkit:
        return recipe_key(api_key_env, environ)
    return (os.environ if environ is None else environ).get(KEY_ENV) or None


def engine_key(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The key the embedded engine enforces: its --api-key flag, else $SPARKIT_API_KEY (which
    `sparkit up` sets only when the recipe names a key)."""
    return flag or (os.environ if environ is None else environ).get(KEY_ENV) or None


def engine_environ(environ: Mapping[str, str], engine_key_env: Iterable[str]) -> dict[str, str]:
    """`environ` without $SPARKIT_API_KEY and the variables the engine reads a key from by itself:
    the environment a server starts in before sparkit delivers the recipe's key (if it names one).
    SGLang reads no key variable; the clients' one is dropped for it too, so that no engine sees a
    key its recipe did not name."""
    drop = {KEY_ENV, *engine_key_env}
    return {name: value for name, value in environ.items() if name not in drop}
