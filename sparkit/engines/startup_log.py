"""Reading any engine's startup log, whatever its line formats: the failures every Python engine
shows the same way (its package missing, a flag refused, the port taken, memory exhausted, the
model missing or unreadable), the driver that names the cause of a failed start from an engine's
own ordered patterns, and the log's last lines. Each engine's line formats stay in its adapter's
package (SGLang's, which the embedded engine also writes: sparkit.engines.sglang.log). Pure text -> data.
"""

from __future__ import annotations

import re
import signal

from sparkit.contract.log import Diagnosis

# (pattern, cause, detail, hint): a log line matching `pattern` means `cause`.
DiagnosisPattern = tuple[re.Pattern[str], str, str, str]

NOT_INSTALLED: DiagnosisPattern = (
    re.compile(r"No module named '?(sglang|torch|sparkit)\b"),
    "engine not installed",
    "the engine's Python package is not installed in this environment",
    "install it (e.g. `pip install sglang==0.5.23` or `pip install sparkit[embedded]`)",
)

UNKNOWN_FLAG: DiagnosisPattern = (
    re.compile(r"unrecognized arguments|ambiguous option|error: argument|no such option|invalid choice", re.IGNORECASE),
    "unknown flag",
    "the engine rejected a command-line flag",
    "check the flag against the installed engine version (`sparkit plan` shows the exact argv); remove or rename it in the recipe's engine extras",
)

PORT_IN_USE: DiagnosisPattern = (
    re.compile(r"Address already in use|address already in use|\[Errno 98\]|port \d+ is (?:already )?in use", re.IGNORECASE),
    "port in use",
    "the port is already taken by another process",
    "pick another port with `--port N`, or `--port auto`; `sparkit status` shows running servers",
)

OUT_OF_MEMORY: DiagnosisPattern = (
    re.compile(r"out of memory|OutOfMemoryError|CUDA error: out of memory|Not enough memory|MemoryError|Cannot allocate memory", re.IGNORECASE),
    "out of memory",
    "the engine ran out of memory",
    "lower mem_fraction_static (0.68 on a DGX Spark), the context length or the CUDA graph batch sizes; stop other GPU processes",
)

MISSING_MODEL: DiagnosisPattern = (
    re.compile(
        r"does not appear to have a file named|Repository Not Found|is not a local folder and is not a valid model identifier"
        r"|No such file or directory.*(?:config\.json|model|safetensors)|model path .* does not exist|not a valid model|"
        r"(?:FileNotFoundError|OSError).*(?:config\.json|checkpoint|model)",
        re.IGNORECASE,
    ),
    "missing model",
    "the model (or its draft) could not be found",
    "check model.path in the recipe (a local directory or a hub id already downloaded); `sparkit model make-tiny DIR` builds a tiny-ling",
)

BROKEN_CHECKPOINT: DiagnosisPattern = (
    re.compile(
        r"cannot load the checkpoint|corrupt safetensors|Error while deserializing header|HeaderTooLarge"
        r"|incomplete metadata|safetensors_rust\.SafetensorError",
        re.IGNORECASE,
    ),
    "broken checkpoint",
    "the model's weight files are unreadable (truncated download or not a checkpoint)",
    "re-download the checkpoint; a tiny-ling build: delete its directory and build it again with `sparkit model make-tiny DIR`",
)

_MISSING_MODULE = re.compile(r"No module named '(?P<module>[\w.]+)'")
# The exception that ended a traceback: "ValueError: ...", "torch.OutOfMemoryError: ...".
_EXCEPTION_LINE = re.compile(r"^(?:\[[^\]]*\]\s*)?(?:[\w.]+\.)?(?P<kind>\w*(?:Error|Exception))(?::\s*(?P<message>.*))?$")


def diagnose(log_text: str, returncode: int | None, patterns: list[DiagnosisPattern],
             module_fixes: dict[str, str]) -> Diagnosis:
    """Name the most likely cause of a failed start from the log's last lines: the first of an
    engine's `patterns` (in order) that one of them matches; after NOT_INSTALLED, any missing
    module (with the engine's `module_fixes`, by top-level module); then the exception that ended
    a traceback; then how the process ended."""
    lines = log_text.splitlines()
    for pattern, cause, detail, hint in patterns:
        for line in reversed(lines[-400:]):
            if pattern.search(line):
                return Diagnosis(cause, detail, hint, line.strip())
        if cause == NOT_INSTALLED[1]:  # next most telling: any other missing module
            for line in reversed(lines[-400:]):
                # SGLang 0.5.23 logs the optional models it skips: "Ignore import error when loading
                # sglang.srt.models.midashenglm: No module named 'torchaudio.functional'" (benign)
                if "Ignore import error" in line:
                    continue
                if m := _MISSING_MODULE.search(line):
                    module = m.group("module")
                    fix = module_fixes.get(module.split(".")[0], f"install the package that provides the Python module {module}")
                    return Diagnosis("missing Python module", f"the engine imports {module}, which is not installed",
                                     fix, line.strip())
    for line in reversed(lines[-400:]):
        if m := _EXCEPTION_LINE.match(line.strip()):
            return Diagnosis(
                "engine error",
                f"the engine raised {m.group('kind')}" + (f": {m.group('message')}" if m.group("message") else ""),
                "read the traceback above it in the log (`sparkit logs RUN` shows the whole log)",
                line.strip(),
            )
    if returncode is not None and (returncode < 0 or returncode in (137, 143)):
        # Only the signal is known here: whether the OOM killer sent it is for the kernel to say
        # (sparkit.runs.launcher asks it, sparkit.memory.oom).
        number = -returncode if returncode < 0 else returncode - 128
        return Diagnosis(
            f"killed by {signal_name(number)}",
            f"the engine was killed by {signal_name(number)} (signal {number}) before it became healthy",
            "if nobody stopped it on purpose: a supervisor, a job or session limit, or the OOM killer "
            "(`dmesg | grep -i oom`); `sparkit logs RUN` shows what it did last",
        )
    if returncode is not None:
        return Diagnosis(
            "process exited",
            f"the engine exited with code {returncode} before it became healthy",
            "read the log lines above; `sparkit logs RUN` shows the whole log",
        )
    return Diagnosis(
        "not healthy in time",
        "the engine did not answer /health in time",
        "raise --timeout (first starts compile kernels and capture graphs), or read the log",
    )


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def tail_lines(text: str, n: int = 20) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-n:]
