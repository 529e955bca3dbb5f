"""The command-line layer: thin Typer commands that parse, call the core, and render.

Each command group lives in its own module exposing `register(app)`. Modules import
only light things at top level; heavy imports happen inside the command bodies.
"""
