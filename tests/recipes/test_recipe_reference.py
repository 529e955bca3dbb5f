"""docs/recipe-reference.md is generated from the schema docstrings and must be current."""

from __future__ import annotations

import subprocess
import sys

from _shared import REPO_DIR


def test_recipe_reference_is_up_to_date():
    proc = subprocess.run([sys.executable, str(REPO_DIR / "scripts" / "gen_recipe_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_schema_field_has_a_docstring():
    from pydantic import BaseModel

    from sparkit.recipes import schema

    for model in vars(schema).values():
        if isinstance(model, type) and issubclass(model, BaseModel) and model.__module__ == schema.__name__:
            if model is schema._Strict:
                continue
            for name, info in model.model_fields.items():
                assert info.description, f"{model.__name__}.{name} has no docstring"
