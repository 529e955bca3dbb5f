"""sparkit's version (pyproject.toml's `version`; tests/test_library.py keeps them equal)."""

__version__ = "0.1.0"
