"""Loading recipes: YAML with positions, `extends` chains, `--set` overrides, validation.

Every problem is a RecipeError that names `file:line:col key.path`, so a user
can jump straight to it. Precedence: command line (--set) > recipe > base > defaults.
"""

from __future__ import annotations

import difflib
import errno
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import RecipeError, UsageError
from sparkit.paths import repo_recipes_dir
from sparkit.recipes.schema import Recipe

DEFAULT_RECIPE = "tiny"
"""The shipped recipe `sparkit up` uses with no argument (tiny-ling on the embedded engine)."""

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Origin:
    """Where a value came from: a file position, or a --set argument."""

    file: str
    line: int | None = None
    column: int | None = None


@dataclass
class LoadedRecipe:
    recipe: Any  # sparkit.recipes.schema.Recipe
    name: str
    path: Path | None
    chain: list[Path]  # this file first, then its bases in extends order
    origins: dict[KeyPath, Origin] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # how the recipe and its bases were found

    def origin(self, *key: str) -> Origin | None:
        """The position of a key path, or of its nearest recorded parent."""
        path = tuple(key)
        while path:
            if path in self.origins:
                return self.origins[path]
            path = path[:-1]
        return Origin(str(self.path)) if self.path else None

    def error(self, key: str, message: str, *, hint: str | None = None) -> RecipeError:
        """A RecipeError located at a dotted key of this recipe."""
        where = self.origin(*key.split(".")) if key else None
        return RecipeError(
            message,
            file=where.file if where else None,
            line=where.line if where else None,
            column=where.column if where else None,
            key=key or None,
            hint=hint,
        )

    def resolved(self) -> dict[str, Any]:
        """The fully resolved recipe as plain data (after extends, overrides and defaults)."""
        return self.recipe.model_dump(mode="json")


# ---------------------------------------------------------------- shipped recipes


def shipped_recipes() -> list[tuple[str, Path]]:
    """(name, path) of every shipped recipe. The name is `folder/stem`, or just `stem`
    when the file is named after its folder (recipes/tiny/tiny.yaml is `tiny`, and `tiny/tiny`
    names it too)."""
    root = repo_recipes_dir()
    out = []
    for path in root.glob("**/*.yaml"):
        out.append((_shipped_name(path, root), path))
    # By name: the ladder reads in order (spark-humming before spark-humming-fp8head).
    return sorted(out)


def _shipped_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    if len(rel.parts) == 2 and rel.parts[0] == rel.parts[1]:
        return rel.parts[1]
    return rel.as_posix()


def _shipped_by_name() -> dict[str, Path]:
    """Every name a shipped recipe answers to: its name and its `folder/stem` form."""
    root = repo_recipes_dir()
    names: dict[str, Path] = {}
    for name, path in shipped_recipes():
        names[name] = path
        names.setdefault(path.relative_to(root).with_suffix("").as_posix(), path)
    return names


STDIN_NAMES = ("-", "/dev/stdin")
"""Recipe arguments that mean standard input (`sparkit plan - < mine.yaml`, `... | sparkit plan -`)."""

STDIN_FILE = "<stdin>"
"""How a recipe read from standard input is named in messages."""

_FILE_SUFFIXES = (".yaml", ".yml")


def names_a_file(ref: str) -> bool:
    """`extends:` and recipe arguments name a file as a path: absolute, starting with `./`,
    `../` or `~`, or ending in .yaml / .yml (relative to the recipe's own directory, for
    `extends`). Anything else is a recipe name (`tiny`, `ling-3.0-flash/spark-optimized`)."""
    return (ref.startswith(("/", "./", "../", "~")) or ref in (".", "..") or ref.endswith(_FILE_SUFFIXES)
            or ref in STDIN_NAMES)


def _inherited_descriptor(text: str) -> int | None:
    """The descriptor a path like /dev/stdin, /dev/fd/N or /proc/self/fd/N names (a pipe
    from the shell: `<(...)`, `| sparkit plan /dev/stdin`), else None."""
    if text in STDIN_NAMES:
        return 0
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if text.startswith(prefix) and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return None


def _stat(path: Path, shown: str) -> os.stat_result | None:
    """os.stat, None when nothing is there; any other failure (a name over NAME_MAX, a path
    through a file, no permission) is a RecipeError naming the file."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        hint = ("a file name is at most 255 bytes (NAME_MAX) and a path at most 4096"
                if exc.errno == errno.ENAMETOOLONG else None)
        raise RecipeError(f"cannot read recipe: {exc.strerror or exc}", file=shown, hint=hint) from None


@dataclass(frozen=True)
class Resolved:
    """Where a recipe reference led: the file (or the descriptor it was read from), and a
    warning when the reference was a name that a local file shadows."""

    path: Path
    warning: str | None = None
    descriptor: int | None = None


def resolve_ref(ref: str | Path, *, relative_to: Path | None = None) -> Path:
    """The file a recipe reference names (see `resolve`)."""
    return resolve(str(ref), relative_to=relative_to).path


def resolve(ref: str, *, relative_to: Path | None = None, referrer: Path | None = None) -> Resolved:
    """A recipe reference -> its file.

    A path (see `names_a_file`) is that file, relative to `relative_to` (the directory of the
    recipe whose `extends` it is) or else the current directory. A name is a shipped recipe
    (`tiny`, `tiny/tiny`, `ling-3.0-flash/spark-optimized`, or a unique file stem), whatever
    files lie around: a file `tiny` in the current directory cannot replace the shipped
    `tiny` under a recipe that says `extends: tiny` (it gets a warning). On the command line
    (`relative_to` None) a name that is no shipped recipe may still be a file in the current
    directory (`sparkit plan myrecipe`). `referrer`: the recipe whose `extends` this is (a file
    extending the shipped recipe it is named after shadows nothing). Raises RecipeError (no such
    recipe, unreadable path)."""
    text = str(ref)
    base_dir = relative_to if relative_to is not None else Path.cwd()
    if not text.strip():
        raise RecipeError("an empty recipe name", hint="name a .yaml file or a shipped recipe (`sparkit recipes list`)")
    descriptor = _inherited_descriptor(text)
    if descriptor is not None and relative_to is None:
        return Resolved(Path(STDIN_FILE if descriptor == 0 else text), descriptor=descriptor)
    if names_a_file(text):
        candidate = Path(text).expanduser()
        candidate = candidate if candidate.is_absolute() else base_dir / candidate
        if _stat(candidate, text) is not None:
            return Resolved(Path(os.path.abspath(candidate)))
        stem = Path(text).name
        for suffix in _FILE_SUFFIXES:
            stem = stem.removesuffix(suffix)
        if stem in _shipped_by_name():
            hint = f"the shipped recipe is named without a path or suffix: `{stem}`"
        else:
            hint = "a path is relative to " + ("the recipe's own directory" if relative_to is not None
                                                else "the current directory")
        where = display_path(candidate) if relative_to is not None else text
        raise RecipeError(f"no recipe file '{where}'", hint=hint)
    shipped = _shipped_by_name()
    found = shipped.get(text)
    if found is None:
        by_stem = sorted({p for n, p in shipped.items() if n.rsplit("/", 1)[-1] == text})
        found = by_stem[0] if len(by_stem) == 1 else None
    if found is not None:
        return Resolved(found, warning=_shadow_warning(text, found, base_dir, relative_to is not None, referrer))
    if relative_to is None:
        local = base_dir / text
        if _stat(local, text) is not None:
            return Resolved(Path(os.path.abspath(local)))
    close = difflib.get_close_matches(text, sorted(n for n, _ in shipped_recipes()), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "see `sparkit recipes list` for the shipped recipes"
    local = next((base_dir / (text + s) for s in ("", *_FILE_SUFFIXES) if os.path.lexists(base_dir / (text + s))), None)
    if local is not None and relative_to is not None:
        hint = f"a file is named as a path: `extends: ./{local.name}`"
    raise RecipeError(f"no recipe file or shipped recipe named '{text}'", hint=hint)


def _shadow_warning(name: str, shipped: Path, base_dir: Path, extends: bool, referrer: Path | None) -> str | None:
    """A file beside the recipe (or in the current directory) with a shipped recipe's name is
    not what the name means: say so, once, with how to use the file."""
    for suffix in ("", *_FILE_SUFFIXES):
        local = base_dir / (name + suffix)
        try:
            if not os.path.lexists(local) or os.path.samefile(local, shipped) or (
                    referrer is not None and os.path.samefile(local, referrer)):
                continue
        except OSError:
            pass
        where = "beside the recipe" if extends else "in the current directory"
        how = f"`extends: ./{name + suffix}`" if extends else f"`./{name + suffix}`"
        return (f"'{name}' is the shipped recipe {display_path(shipped)}; the file {display_path(local)} {where} "
                f"has the same name and is not used (name it as a path, {how}, to use it)")
    return None


def display_path(path: Path) -> str:
    """Paths relative to the cwd when below it (short messages), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- YAML with positions


MAX_RECIPE_BYTES = 256 * 1024
"""A recipe is a page of YAML; anything this large is the wrong file (or a generated bomb)."""

MAX_NESTING = 32
"""Recipes nest three or four levels deep; the bound keeps YAML's recursive composer (and
sparkit's walk) far from Python's recursion limit."""

_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _loader_class() -> Any:
    """libyaml's safe loader where PyYAML has it (parsing a 200 KB recipe takes 0.05 s of CPU
    instead of several), else the pure-Python one; both build the same nodes and events."""
    import yaml

    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


def _LIBYAML_TEXT(loader: Any) -> bool:
    """The loader is libyaml's, whose text is always valid UTF-8 (no lone surrogates)."""
    return type(loader).__name__ == "CSafeLoader"


def _yaml_error(message: str, file: str, mark: Any, *, hint: str | None = None) -> RecipeError:
    return RecipeError(message, file=file, line=mark.line + 1 if mark else None,
                       column=mark.column + 1 if mark else None, hint=hint)


def _screen_events(text: str, file: str) -> None:
    """Refuse, before anything is built, the YAML features a recipe never needs and that make
    loading explode or recurse: aliases (an alias bomb of a few hundred bytes expands to
    gigabytes; `a: &a [*a]` contains itself), merge keys, explicit tags, deep nesting.
    PyYAML's event parsers are iterative, so this pass is safe on any input."""
    import yaml

    loader = _loader_class()
    try:
        _screen(yaml.parse(text, Loader=loader), file)
    except yaml.MarkedYAMLError as exc:
        # libyaml reads a whole flow collection ahead and stops at its own depth limit (1000):
        # the pure-Python parser, lazier, names the level past MAX_NESTING where it starts.
        if loader is yaml.SafeLoader or "nesting depth" not in str(exc.problem):
            raise
        _screen(yaml.parse(text, Loader=yaml.SafeLoader), file)
        raise


def _screen(events: Any, file: str) -> None:
    import yaml

    depth = 0
    for event in events:
        if isinstance(event, yaml.AliasEvent):
            raise _yaml_error(f"YAML alias '*{event.anchor}': recipes do not use anchors and aliases",
                              file, event.start_mark,
                              hint="write the value out, or share settings with `extends: BASE`")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_NESTING:
                raise _yaml_error(f"nested more than {MAX_NESTING} levels deep", file, event.start_mark,
                                  hint="a recipe nests a few levels (stack.speculative.method); check the brackets")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in ("!", *_PLAIN_TAGS):
            raise _yaml_error(f"YAML tag '{tag}': recipes hold plain values (text, numbers, true/false, lists, "
                              "mappings)", file, event.start_mark, hint="remove the tag")
        if isinstance(event, yaml.ScalarEvent) and event.value == "<<" and event.implicit[0] and not event.style:
            raise _yaml_error("YAML merge key '<<': recipes do not merge mappings inside one file", file,
                              event.start_mark, hint="share settings with `extends: BASE` instead")


def parse_yaml(text: str, file: str) -> tuple[Any, dict[KeyPath, Origin]]:
    """Parse YAML into plain data plus the position of every key (1-based line and
    column of the value, or of the key for mappings)."""
    import yaml

    try:
        _screen_events(text, file)
        loader = _loader_class()(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return {}, {}
            origins: dict[KeyPath, Origin] = {}
            data = _construct(loader, node, (), origins, file)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or "invalid YAML"
        if exc.context:
            problem = f"{problem} ({exc.context})"
        raise _yaml_error(f"YAML syntax error: {problem}", file, exc.problem_mark or exc.context_mark) from None
    except yaml.reader.ReaderError as exc:
        # Control characters (NUL, ESC, DEL...) anywhere in the file; the reader gives an offset.
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise RecipeError(f"character U+{ord(char):04X} is not allowed in YAML", file=file, line=line,
                          column=column, hint="remove it (a control character or a stray byte)") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"invalid YAML: {exc}", file=file) from None
    return data, origins


def _construct(loader: Any, node: Any, path: KeyPath, origins: dict[KeyPath, Origin], file: str) -> Any:
    import yaml

    if path not in origins:
        origins[path] = Origin(file, node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.ScalarNode) and node.tag == _STR_TAG:
        if not _LIBYAML_TEXT(loader):  # libyaml refuses a surrogate escape itself: its text needs no check
            _check_scalar(node.value, file, node, path)
        return node.value  # what the constructor would return, without its bookkeeping (16000 keys add up)
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                raise _yaml_error("a key must be a plain name", file, key_node.start_mark)
            key = key_node.value
            child = path + (key,)
            where = Origin(file, value_node.start_mark.line + 1, value_node.start_mark.column + 1)
            if not _LIBYAML_TEXT(loader):
                _check_scalar(key, file, key_node, child)
            if key in result:
                raise RecipeError(
                    "duplicate key (the second one would silently win)",
                    file=file, line=key_node.start_mark.line + 1, column=key_node.start_mark.column + 1,
                    key=".".join(child),
                )
            # Scalars point at the value; mappings and lists at their key.
            if not isinstance(value_node, yaml.ScalarNode):
                where = Origin(file, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            origins[child] = where
            result[key] = _construct(loader, value_node, child, origins, file)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, path + (str(i),), origins, file) for i, item in enumerate(node.value)]
    if node.tag == _TIMESTAMP_TAG:
        return node.value  # a date-like value is text to a recipe (YAML would build a datetime)
    try:
        value = loader.construct_object(node, deep=True)
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        reason = "a number too long to read" if "digits" in str(exc) else str(exc)
        raise RecipeError(f"unreadable value: {reason}", file=file, line=node.start_mark.line + 1,
                          column=node.start_mark.column + 1, key=".".join(path) or None) from None
    _check_scalar(value, file, node, path)
    return value


def _text_problem(value: Any) -> str | None:
    """Why a scalar is no value a recipe can hold: text with a lone UTF-16 surrogate (YAML's
    "\\ud800" escape makes one; it cannot be encoded, printed or passed to a process), or a
    float that is not finite (1e309 reads as infinity, .nan as NaN: no setting means either)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (f"contains the lone UTF-16 surrogate \\u{ord(value[exc.start]):04x}, which is not text "
                    "(write the character itself, or a surrogate pair)")
    elif isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number (the largest float is about 1.8e308)"
    return None


def _check_scalar(value: Any, file: str, node: Any, path: KeyPath) -> None:
    problem = _text_problem(value)
    if problem:
        raise RecipeError(f"unreadable value: {problem}", file=file, line=node.start_mark.line + 1,
                          column=node.start_mark.column + 1, key=".".join(path) or None)


def _check_text(value: Any, key: str) -> None:
    """_text_problem over a --set value (keys and items included), a RecipeError naming --set."""
    for item in _walk_values(value):
        problem = _text_problem(item)
        if problem:
            raise RecipeError(f"unreadable value: {problem}", file="--set", key=key)


def _walk_values(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        else:
            yield node


# ---------------------------------------------------------------- extends and merge


MAX_EXTENDS_DEPTH = 32
"""Recipes extend a few levels (the shipped ladder: four); a longer chain is generated or a
mistake, and the bound keeps loading linear and far from any recursion limit."""


@dataclass
class _Layer:
    """One file of an extends chain, parsed."""

    path: Path
    file: str  # as messages name it
    data: dict[str, Any]
    origins: dict[KeyPath, Origin]
    warning: str | None = None  # how its `extends` was resolved, when a local file was passed over


def _load_chain(resolved: Resolved) -> tuple[dict[str, Any], dict[KeyPath, Origin], list[Path], list[str]]:
    """Read the recipe and its bases (iteratively: a chain cannot recurse), then merge them from
    the deepest base up. Returns the merged data, the origin of every key, the chain (this file
    first) and the warnings resolving it gave."""
    layers: list[_Layer] = []
    seen: dict[Path, int] = {}
    current, warning = resolved, None
    while True:
        layer = _read_layer(current)
        layer.warning = warning
        if layer.path in seen:
            cycle = " -> ".join([lay.file for lay in layers] + [layer.file])
            raise RecipeError(f"cyclic extends: {cycle}", file=layers[0].file, key="extends",
                              hint="remove one of the extends so the chain ends at a recipe without one")
        seen[layer.path] = len(layers)
        layers.append(layer)
        base_ref = layer.data.get("extends")
        if base_ref is None:
            break
        o = layer.origins[("extends",)]
        if not isinstance(base_ref, str):
            raise RecipeError("extends must be a file path or a shipped recipe name", file=o.file, line=o.line,
                              column=o.column, key="extends")
        if len(layers) >= MAX_EXTENDS_DEPTH:
            raise RecipeError(f"the extends chain is longer than {MAX_EXTENDS_DEPTH} recipes "
                              f"({layers[0].file} -> {layers[1].file} -> ... -> {layer.file} -> {base_ref})",
                              file=o.file, line=o.line, column=o.column, key="extends",
                              hint="a recipe extends a few others at most: merge the chain into fewer files")
        relative_to = layer.path.parent if layer.file != STDIN_FILE else Path.cwd()
        try:
            current = resolve(base_ref, relative_to=relative_to, referrer=layer.path)
        except RecipeError as exc:
            names = " -> ".join(lay.file for lay in layers) + f" -> {base_ref}"
            raise RecipeError(f"extends '{base_ref}' not found ({exc.message}; chain: {names})", file=o.file,
                              line=o.line, column=o.column, key="extends", hint=exc.hint) from None
        info = _stat(current.path, display_path(current.path))
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise RecipeError(f"extends '{base_ref}' is not a recipe file: it is {_file_kind(info.st_mode)}",
                              file=o.file, line=o.line, column=o.column, key="extends",
                              hint="name a .yaml file or a shipped recipe")
        warning = current.warning
    warnings = [f"{lay_before.file}:{lay_before.origins[('extends',)].line} extends: {lay.warning}"
                for lay_before, lay in zip(layers, layers[1:]) if lay.warning]
    merged, merged_origins = layers[-1].data, dict(layers[-1].origins)
    merged_origins.pop(("extends",), None)
    for layer in reversed(layers[:-1]):
        merged = deep_merge(merged, layer.data, merged_origins, layer.origins)
        merged.pop("extends", None)
    if "extends" in layers[0].data:
        merged_origins[("extends",)] = layers[0].origins[("extends",)]
    else:
        merged_origins.pop(("extends",), None)
    return merged, merged_origins, [lay.path for lay in layers], warnings


def _read_layer(resolved: Resolved) -> _Layer:
    path = resolved.path
    file = str(path) if resolved.descriptor is not None else display_path(path)
    try:
        if resolved.descriptor is not None:
            text = _read_descriptor(resolved.descriptor, file)
        else:
            text = _read_recipe_text(path, file)
    except OSError as exc:
        raise RecipeError(f"cannot read recipe: {exc.strerror or exc}", file=file) from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"not a text (UTF-8) file: undecodable byte at offset {exc.start}", file=file,
                          hint="a recipe is a YAML file; did you pass the wrong path?") from None
    data, origins = parse_yaml(text, file)
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a mapping of keys (engine, model, stack, ...)", file=file, line=1, column=1)
    _normalise(data)
    return _Layer(path if resolved.descriptor is not None else Path(os.path.realpath(path)), file, data, origins)


def _read_descriptor(fd: int, file: str) -> str:
    """A recipe from an inherited descriptor (standard input, `<(...)`): a pipe or a file,
    never a terminal (nobody would type a recipe there), bounded like a file."""
    info = os.fstat(fd)
    if not (stat.S_ISFIFO(info.st_mode) or stat.S_ISREG(info.st_mode) or stat.S_ISSOCK(info.st_mode)):
        raise RecipeError(f"not a recipe: it is {_file_kind(info.st_mode)}", file=file,
                          hint="pipe a recipe in (`sparkit plan - < mine.yaml`) or pass a .yaml file")
    chunks, size = [], 0
    while size <= MAX_RECIPE_BYTES:
        chunk = os.read(fd, MAX_RECIPE_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_RECIPE_BYTES:
        raise RecipeError(f"larger than {MAX_RECIPE_BYTES // 1024} KiB: not a recipe", file=file,
                          hint="a recipe is a page of YAML; did you pipe the wrong file?")
    return b"".join(chunks).decode("utf-8")


def _read_recipe_text(path: Path, file: str) -> str:
    """A recipe's text: a regular file of bounded size (a FIFO would block the open, /dev/zero
    never ends, a directory is a mistaken path)."""
    info = _stat(path, file)
    if info is None:
        raise RecipeError("cannot read recipe: No such file or directory", file=file)
    if not stat.S_ISREG(info.st_mode):
        raise RecipeError(f"not a recipe file: it is {_file_kind(info.st_mode)}", file=file,
                          hint="pass a .yaml file or a shipped recipe name (`sparkit recipes list`)")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(MAX_RECIPE_BYTES + 1)
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError(f"larger than {MAX_RECIPE_BYTES // 1024} KiB: not a recipe", file=file,
                          hint="a recipe is a page of YAML; did you pass the wrong path?")
    return raw.decode("utf-8")


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _normalise(data: dict[str, Any]) -> None:
    """Expand shorthands so that a base and a child merge key by key."""
    stack = data.get("stack")
    if isinstance(stack, dict) and isinstance(stack.get("speculative"), str):
        stack["speculative"] = {"method": stack["speculative"]}


def _switches_decoder(path: KeyPath, base: dict[str, Any], over: dict[str, Any]) -> bool:
    """A child that changes speculative.method replaces the base's speculative section:
    NEXTN's step numbers mean nothing to DSpark."""
    return path == ("stack", "speculative") and "method" in over and over.get("method") != base.get("method")


def deep_merge(base: dict[str, Any], over: dict[str, Any], origins: dict[KeyPath, Origin],
               over_origins: dict[KeyPath, Origin], prefix: KeyPath = ()) -> dict[str, Any]:
    """`over` wins; mappings merge key by key, everything else (lists too) is replaced. `origins`
    (the base's, updated in place) follows: a replaced value's positions are the ones below it in
    `over`. Linear in the size of both (the positions below a key are found by walking its value,
    not by scanning every recorded position)."""
    result = dict(base)
    for key, value in over.items():
        path = prefix + (key,)
        if isinstance(value, dict) and isinstance(result.get(key), dict) and not _switches_decoder(path, result[key], value):
            result[key] = deep_merge(result[key], value, origins, over_origins, path)
            if path in over_origins:
                origins.setdefault(path, over_origins[path])
        else:
            if key in result:
                for p in _paths_below(result[key], path):
                    origins.pop(p, None)
            for p in _paths_below(value, path):
                if p in over_origins:
                    origins[p] = over_origins[p]
            result[key] = value
    return result


def _paths_below(value: Any, path: KeyPath) -> Iterator[KeyPath]:
    """`path` and the key path of everything inside `value` (as parse_yaml records them)."""
    stack = [(value, path)]
    while stack:
        node, where = stack.pop()
        yield where
        if isinstance(node, dict):
            stack.extend((v, where + (k,)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, where + (str(i),)) for i, v in enumerate(node))


# ---------------------------------------------------------------- --set


def apply_override(data: dict[str, Any], origins: dict[KeyPath, Origin], assignment: str) -> None:
    """Apply one `--set a.b=c` (c is read as YAML: 3, 0.68, true, [a, b], "x")."""
    import yaml

    if "=" not in assignment:
        raise UsageError(f"--set {assignment!r}: expected KEY.PATH=VALUE", hint="e.g. --set stack.lm_head=fp8")
    key, _, raw = assignment.partition("=")
    key = key.strip()
    parts = tuple(key.split("."))
    if not key or any(not p for p in parts):
        raise UsageError(f"--set {assignment!r}: empty key path", hint="e.g. --set server.port=30001")
    _check_set_path(key, parts)
    try:
        _screen_events(raw, "--set")
        value = yaml.safe_load(raw) if raw.strip() else ""
        _check_text(value, key)
    except RecipeError as exc:
        raise UsageError(f"--set {key}: {str(exc).splitlines()[0].split(': ', 1)[-1]}", hint=exc.hint) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--set {assignment!r}: value is not valid YAML ({getattr(exc, 'problem', exc)})",
                         hint="quote strings that contain ':' or '#'") from None
    except ValueError:  # YAML's int() of more than sys.get_int_max_str_digits() digits
        raise UsageError(f"--set {key}: the number has too many digits to be read ({len(raw.strip())} characters)",
                         hint="give a value the key can take (`sparkit plan RECIPE --json` shows the current one)") from None
    target = data
    for i, part in enumerate(parts[:-1]):
        nxt = target.get(part)
        if nxt is None:
            nxt = target[part] = {}
        elif not isinstance(nxt, dict):
            if part == "speculative" and isinstance(nxt, str):  # bare-method shorthand
                nxt = target[part] = {"method": nxt}
            else:
                raise UsageError(f"--set {assignment!r}: '{'.'.join(parts[: i + 1])}' is a value, not a section")
        target = nxt
    if parts[-1] in target:
        for p in _paths_below(target[parts[-1]], parts):
            origins.pop(p, None)
    target[parts[-1]] = value
    origins[parts] = Origin("--set")


def _check_set_path(key: str, parts: KeyPath) -> None:
    """A --set key that the schema does not have is a mistake on the command line (exit 2),
    found before the value is applied; a bad value for a real key stays a recipe error (exit 3)."""
    import typing

    from pydantic import BaseModel

    model: Any = Recipe
    for i, part in enumerate(parts):
        fields = model.model_fields
        section = ".".join(parts[:i])
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1, cutoff=0.5)
            raise UsageError(
                f"--set {key}: unknown key '{part}'" + (f"; did you mean '{close[0]}'?" if close else ""),
                hint=f"keys {'in ' + section if section else 'at the top level'}: " + ", ".join(fields)
                + " (docs/recipe-reference.md lists them all)",
            )
        if parts == ("extends",):
            raise UsageError("--set extends: the base of a recipe is chosen in its file, not on the command line",
                             hint="write a recipe with `extends: BASE` and pass that file")
        annotation = fields[part].annotation
        candidates = [annotation, *typing.get_args(annotation)]
        sub = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if sub is not None:
            model = sub
            continue
        if any(typing.get_origin(c) is dict or c is dict for c in candidates):
            return  # a free-form mapping (server.env, model.overrides): its keys are the user's
        if i < len(parts) - 1:
            raise UsageError(f"--set {key}: '{'.'.join(parts[: i + 1])}' is a value, not a section")
        return


# ---------------------------------------------------------------- validation


def _validate(data: dict[str, Any], origins: dict[KeyPath, Origin], fallback_file: str | None) -> Any:
    from pydantic import ValidationError

    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # Every problem, each with its own file:line:col key, so that one edit fixes them all;
        # the error's fields (file, line, key) are the first one's.
        located = [_recipe_error(err, tuple(str(p) for p in err["loc"]), origins, fallback_file) for err in errors]
        error = located[0]
        error.message += "".join(f"\n  also {other.message}" for other in located[1:])
        raise error from None


def _recipe_error(err: dict[str, Any], loc: KeyPath, origins: dict[KeyPath, Origin], fallback_file: str | None) -> RecipeError:
    kind = err["type"]
    value = err.get("input")
    # Pydantic reports model_validator("before") failures at the model's path; strip
    # nothing else. Find the closest position we recorded.
    where = None
    probe = loc
    while probe:
        if probe in origins:
            where = origins[probe]
            break
        probe = probe[:-1]
    if where is None:
        where = origins.get((), Origin(fallback_file) if fallback_file else None)
    key = ".".join(loc)
    hint = None
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.5)
        message = f"unknown key '{loc[-1]}'"
        if close:
            message += f"; did you mean '{close[0]}'?"
        hint = "allowed keys here: " + ", ".join(allowed)
    elif kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        allowed = ", ".join(v.strip().strip("'") for v in expected.replace(" or ", ", ").split(","))
        message = f"{_shown(value)} is not one of {allowed}"
    elif kind == "value_error":  # a validator's own sentence, which names the value
        message = str(err.get("ctx", {}).get("error", err["msg"]))
    elif kind == "missing":
        message = "is required"
        if loc == ("model",):
            hint = "add e.g. `model: {path: inclusionAI/Ling-3.0-flash}`"
    else:
        message = f"{err['msg'][0].lower()}{err['msg'][1:]} (got {_shown(value)})"
    return RecipeError(message, file=where.file if where else None, line=where.line if where else None,
                       column=where.column if where else None, key=key, hint=hint)


def _shown(value: Any, limit: int = 80) -> str:
    """A value as an error message quotes it: its repr, cut to `limit` characters (a list of
    20000 flags is named by its length, not printed)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} items)" if isinstance(value, (list, dict)) else ""
    return text[: limit - 3] + "..." + size


def _fields_at(loc: KeyPath) -> list[str]:
    """The keys allowed in the section at `loc` (for did-you-mean)."""
    import typing

    from pydantic import BaseModel

    model: Any = Recipe
    for part in loc:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return []
        annotation = fields[part].annotation
        candidates = [annotation, *typing.get_args(annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


# ---------------------------------------------------------------- public


def load_recipe(ref: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedRecipe:
    """Load a recipe file or shipped name, follow `extends`, apply `--set` overrides and
    validate. Raises RecipeError (file:line:col key: message) or UsageError (bad --set)."""
    resolved = resolve(str(ref))
    data, origins, chain, warnings = _load_chain(resolved)
    if resolved.warning:
        warnings.insert(0, resolved.warning)
    for assignment in overrides:
        apply_override(data, origins, assignment)
    data.pop("extends", None)
    path = chain[0]
    shown = str(path) if resolved.descriptor is not None else display_path(path)
    recipe = _validate(data, origins, shown)
    if chain[1:]:
        recipe = recipe.model_copy(update={"extends": str(display_path(chain[1]))})
    root = repo_recipes_dir()
    try:
        name = _shipped_name(path, root.resolve())
    except ValueError:
        name = path.stem if resolved.descriptor is None else "stdin"
    return LoadedRecipe(recipe=recipe, name=name, path=path if resolved.descriptor is None else None, chain=chain,
                        origins=origins, overrides=list(overrides), warnings=warnings)
