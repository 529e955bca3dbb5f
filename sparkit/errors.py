"""The one exception hierarchy of sparkit.

Every error a user can cause or meet is a `SparkitError` whose `str()` is a
complete, user-facing message (what is wrong, where, how to fix it). The CLI
maps each class to a documented exit code and never shows a traceback for
them:

    SparkitError           1   anything else sparkit reports
    ├── UsageError         2   bad command-line usage (a flag, a --set key the schema lacks)
    ├── RecipeError        3   a recipe file is invalid (file:line:col key: message)
    ├── PreflightError     4   the host cannot run the plan (GPUs, memory, port, model), or cannot
    │                          hold a model `sparkit pull` fetches (disk space, before or during it)
    ├── LaunchError        5   the engine did not start or did not become healthy
    ├── CheckFailed        6   the server runs but a startup check failed
    ├── EngineError        7   no server to talk to (none running, nothing answered at the URL),
    │                          or the server answered with an error / went away
    ├── DataError          8   an input data file (GSM8K, bench JSON) is unusable; a model file that
    │                          does not match the hub's hash twice, or is sent longer than listed; a
    │                          model's config.json, index or safetensors header no checkpoint has (not
    │                          JSON, nested too deep, an absurd shape): the file is the problem
    ├── HubError           9   the model hub: not reachable (offline, no network), refused (401/403,
    │                          gated), or has no such repository, revision or file (404); or its
    │                          answer holds an id, hash, size or file name no hub sends, or its HEAD
    │                          disagrees with its listing: the hub is the problem
    └── StateError        10   sparkit's own directories (SPARKIT_HOME or the default state,
                               data and cache directories, a run directory) are unsafe to use
                               (another user owns them or can write them, or a link to them; a
                               link stands where a file should) or cannot be written (a full
                               disk, `eval`'s results included)

Exit code 130 means interrupted (Ctrl-C).
"""

from __future__ import annotations


class SparkitError(Exception):
    """Base class: `message` is shown to the user as is; `hint` is an optional fix."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(SparkitError):
    exit_code = 2


class RecipeError(SparkitError):
    """A recipe problem. `location` is 'file:line:col' when known, `key` the dotted path."""

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.file, self.line, self.column, self.key = file, line, column, key
        where = ""
        if file:
            where = file
            if line is not None:
                where += f":{line}"
                if column is not None:
                    where += f":{column}"
        prefix = " ".join(p for p in (where, key) if p)
        full = f"{prefix}: {message}" if prefix else message
        super().__init__(full, hint=hint)


class PreflightError(SparkitError):
    exit_code = 4


class LaunchError(SparkitError):
    exit_code = 5


class CheckFailed(SparkitError):
    exit_code = 6


class EngineError(SparkitError):
    exit_code = 7


class DataError(SparkitError):
    exit_code = 8


class HubError(SparkitError):
    """The Hugging Face hub (or the HF_ENDPOINT mirror) could not be reached, refused the request,
    or has no such repository, revision or file. The message names the repository (and file)."""

    exit_code = 9


class StateError(SparkitError):
    """sparkit's own state cannot be trusted or written; the message names the path."""

    exit_code = 10


EXIT_INTERRUPTED = 130
