"""Loading recipes: YAML with positions, `extends` chains, `--set` overrides, validation.

Every problem is a RecipeError that names `file:line:col key.path`, so a user
can jump straight to it. Precedence: command line (--set) > recipe > base > defaults.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import RecipeError, UsageError
from sparkit.paths import repo_recipes_dir

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
    when the file is named after its folder (recipes/tiny/tiny.yaml is `tiny`)."""
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


def resolve_ref(ref: str | Path, *, relative_to: Path | None = None) -> Path:
    """A file path (absolute, relative to `relative_to` or the cwd) or a shipped name."""
    text = str(ref)
    candidates: list[Path] = []
    if relative_to is not None:
        candidates.append(relative_to / text)
    candidates.append(Path(text))
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    for candidate in candidates:
        # It exists but is no file: say so rather than "no recipe named" (a directory, a FIFO, /dev/zero).
        if text.strip() and candidate.exists():
            return candidate.resolve()
    shipped = dict(shipped_recipes())
    stem = text[:-5] if text.endswith(".yaml") else text
    if stem in shipped:
        return shipped[stem]
    by_stem = [p for n, p in shipped.items() if n.rsplit("/", 1)[-1] == stem]
    if len(by_stem) == 1:
        return by_stem[0]
    names = sorted(shipped)
    close = difflib.get_close_matches(stem, names, n=1)
    hint = f"did you mean '{close[0]}'?" if close else "see `sparkit recipes list` for the shipped recipes"
    raise RecipeError(f"no recipe file or shipped recipe named '{text}'", hint=hint)


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
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _yaml_error(message: str, file: str, mark: Any, *, hint: str | None = None) -> RecipeError:
    return RecipeError(message, file=file, line=mark.line + 1 if mark else None,
                       column=mark.column + 1 if mark else None, hint=hint)


def _screen_events(text: str, file: str) -> None:
    """Refuse, before anything is built, the YAML features a recipe never needs and that make
    loading explode or recurse: aliases (an alias bomb of a few hundred bytes expands to
    gigabytes; `a: &a [*a]` contains itself), merge keys, explicit tags, deep nesting.
    PyYAML's event parser is iterative, so this pass is safe on any input."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
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
        if isinstance(event, yaml.ScalarEvent) and event.value == "<<" and event.implicit[0] and event.style is None:
            raise _yaml_error("YAML merge key '<<': recipes do not merge mappings inside one file", file,
                              event.start_mark, hint="share settings with `extends: BASE` instead")


def parse_yaml(text: str, file: str) -> tuple[Any, dict[KeyPath, Origin]]:
    """Parse YAML into plain data plus the position of every key (1-based line and
    column of the value, or of the key for mappings)."""
    import yaml

    try:
        _screen_events(text, file)
        loader = yaml.SafeLoader(text)
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

    origins.setdefault(path, Origin(file, node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                raise _yaml_error("a key must be a plain name", file, key_node.start_mark)
            key = key_node.value
            child = path + (key,)
            where = Origin(file, value_node.start_mark.line + 1, value_node.start_mark.column + 1)
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
        return loader.construct_object(node, deep=True)
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        reason = "a number too long to read" if "digits" in str(exc) else str(exc)
        raise RecipeError(f"unreadable value: {reason}", file=file, line=node.start_mark.line + 1,
                          column=node.start_mark.column + 1, key=".".join(path) or None) from None


# ---------------------------------------------------------------- extends and merge


def _load_chain(path: Path, seen: list[Path]) -> tuple[dict[str, Any], dict[KeyPath, Origin], list[Path]]:
    if path in seen:
        cycle = " -> ".join(display_path(p) for p in seen + [path])
        raise RecipeError(f"cyclic extends: {cycle}", file=display_path(seen[0]), key="extends",
                          hint="remove one of the extends so the chain ends at a recipe without one")
    file = display_path(path)
    try:
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
    chain = [path]
    base_ref = data.get("extends")
    if base_ref is None:
        return data, origins, chain
    if not isinstance(base_ref, str):
        o = origins[("extends",)]
        raise RecipeError("extends must be a file path or a shipped recipe name", file=o.file, line=o.line,
                          column=o.column, key="extends")
    try:
        base_path = resolve_ref(base_ref, relative_to=path.parent)
    except RecipeError as exc:
        o = origins[("extends",)]
        names = " -> ".join(display_path(p) for p in seen + [path]) + f" -> {base_ref}"
        raise RecipeError(f"extends '{base_ref}' not found (chain: {names})", file=o.file, line=o.line,
                          column=o.column, key="extends", hint=exc.hint) from None
    if not base_path.is_file():
        o = origins[("extends",)]
        kind = _file_kind(base_path.stat().st_mode)
        raise RecipeError(f"extends '{base_ref}' is not a recipe file: it is {kind}", file=o.file, line=o.line,
                          column=o.column, key="extends", hint="name a .yaml file or a shipped recipe")
    base, base_origins, base_chain = _load_chain(base_path, seen + [path])
    merged_origins = dict(base_origins)
    merged = deep_merge(base, data, merged_origins, origins)
    merged.pop("extends", None)
    merged_origins.pop(("extends",), None)
    if "extends" in data:
        merged_origins[("extends",)] = origins[("extends",)]
    return merged, merged_origins, chain + base_chain


def _read_recipe_text(path: Path, file: str) -> str:
    """A recipe's text: a regular file of bounded size (a FIFO would block the open, /dev/zero
    never ends, a directory is a mistaken path)."""
    import os
    import stat

    info = path.stat()
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
    import stat

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
    """`over` wins; mappings merge key by key, everything else (lists too) is replaced."""
    result = dict(base)
    for key, value in over.items():
        path = prefix + (key,)
        if isinstance(value, dict) and isinstance(result.get(key), dict) and not _switches_decoder(path, result[key], value):
            result[key] = deep_merge(result[key], value, origins, over_origins, path)
            if path in over_origins:
                origins.setdefault(path, over_origins[path])
        else:
            result[key] = value
            for p in [p for p in origins if p[: len(path)] == path]:
                del origins[p]
            for p, o in over_origins.items():
                if p[: len(path)] == path:
                    origins[p] = o
    return result


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
    except RecipeError as exc:
        raise UsageError(f"--set {key}: {str(exc).splitlines()[0].split(': ', 1)[-1]}", hint=exc.hint) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--set {assignment!r}: value is not valid YAML ({getattr(exc, 'problem', exc)})",
                         hint="quote strings that contain ':' or '#'") from None
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
    target[parts[-1]] = value
    for p in [p for p in origins if p[: len(parts)] == parts]:
        del origins[p]
    origins[parts] = Origin("--set")


def _check_set_path(key: str, parts: KeyPath) -> None:
    """A --set key that the schema does not have is a mistake on the command line (exit 2),
    found before the value is applied; a bad value for a real key stays a recipe error (exit 3)."""
    import typing

    from pydantic import BaseModel

    from sparkit.recipes.schema import Recipe

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

    from sparkit.recipes.schema import Recipe

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
        message = f"{value!r} is not one of {allowed}"
    elif kind == "value_error":  # a validator's own sentence, which names the value
        message = str(err.get("ctx", {}).get("error", err["msg"]))
    elif kind == "missing":
        message = "is required"
        if loc == ("model",):
            hint = "add e.g. `model: {path: inclusionAI/Ling-3.0-flash}`"
    else:
        message = f"{err['msg'][0].lower()}{err['msg'][1:]} (got {value!r})"
    return RecipeError(message, file=where.file if where else None, line=where.line if where else None,
                       column=where.column if where else None, key=key, hint=hint)


def _fields_at(loc: KeyPath) -> list[str]:
    """The keys allowed in the section at `loc` (for did-you-mean)."""
    import typing

    from pydantic import BaseModel

    from sparkit.recipes.schema import Recipe

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
    path = resolve_ref(ref)
    data, origins, chain = _load_chain(path, [])
    for assignment in overrides:
        apply_override(data, origins, assignment)
    data.pop("extends", None)
    recipe = _validate(data, origins, display_path(path))
    if chain[1:]:
        recipe = recipe.model_copy(update={"extends": str(display_path(chain[1]))})
    root = repo_recipes_dir()
    try:
        name = _shipped_name(path, root.resolve())
    except ValueError:
        name = path.stem
    return LoadedRecipe(recipe=recipe, name=name, path=path, chain=chain, origins=origins, overrides=list(overrides))
