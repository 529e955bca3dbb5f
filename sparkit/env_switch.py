"""One reading of an on/off environment variable, for every place sparkit judges one.

The recipe rules judge SGLANG_* switches a recipe sets (what SGLang will read), the SGLang adapter
and sparkit's plugin the plugin's own SPARKIT_* switches; all of them read a value the same way.
Standard library only: sparkit's plugin imports it inside SGLang's processes.
"""

from __future__ import annotations

# SGLang's own spellings (sglang.srt.environ.EnvBool: true/1/yes/y, false/0/no/n), and on/off.
TRUE_SPELLINGS = ("1", "true", "yes", "y", "on")
FALSE_SPELLINGS = ("0", "false", "no", "n", "off")


def truthy(value: str | None, default: bool = False) -> bool:
    """An environment switch: on for TRUE_SPELLINGS, off for FALSE_SPELLINGS (any case, outer
    spaces ignored); unset, empty or anything else is `default`, as SGLang reads a value it
    cannot parse."""
    text = (value or "").strip().lower()
    if text in TRUE_SPELLINGS:
        return True
    if text in FALSE_SPELLINGS:
        return False
    return default
