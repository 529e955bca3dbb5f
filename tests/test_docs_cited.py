"""Every document the code cites is in the repository: a comment that says "see docs/protocols.md"
sends a reader to a file they must be able to open, in a fresh clone."""

from __future__ import annotations

import re

from _shared import REPO_DIR

CITED = re.compile(r"(?<![\w/.-])(?:\.\./)*(?:shared/)?(?:docs/)?([\w-]+\.md)\b")
PLACES = ("sparkit", "tests", "benchmarks", "scripts")
# Markdown files a module names that are not documents of this repository's docs/ folder.
NOT_DOCS = {"README.md", "CHANGELOG.md", "LICENSE.md"}
SELF = __import__("pathlib").Path(__file__).resolve()  # its own examples are not citations


def citations() -> dict[str, set[str]]:
    """document -> the files that cite it (the .md names in sparkit's code, tests, benchmarks, scripts)."""
    found: dict[str, set[str]] = {}
    for place in PLACES:
        for path in (REPO_DIR / place).rglob("*"):
            if (not path.is_file() or path.suffix not in (".py", "") or "__pycache__" in path.parts
                    or path == SELF):
                continue
            text = path.read_text(errors="replace")
            for name in CITED.findall(text):
                if name not in NOT_DOCS:
                    found.setdefault(name, set()).add(path.relative_to(REPO_DIR).as_posix())
    return found


def test_every_cited_document_is_in_docs():
    cited = citations()
    assert {"protocols.md", "sglang-facts.md"} <= set(cited)  # the scan finds the citations it is for
    missing = {name: sorted(where) for name, where in cited.items() if not (REPO_DIR / "docs" / name).is_file()}
    assert not missing, f"cited but not in docs/: {missing}"


def test_citations_name_the_repositorys_docs_folder():
    """`../shared/docs/x.md` or a bare `x.md` points outside the clone or nowhere in particular."""
    loose = re.compile(r"(?:\.\./|shared/docs/|(?<![\w/.-])(?=(?:protocols|sglang-facts)\.md))")
    bad = [(where, line.strip()) for name, files in citations().items() for where in files
           for line in (REPO_DIR / where).read_text(errors="replace").splitlines()
           if name in line and loose.search(line) and f"docs/{name}" not in line]
    assert not bad, bad
