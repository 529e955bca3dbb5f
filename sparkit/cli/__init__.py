"""The command-line layer: thin Typer commands that parse, call the core, and render.

commands/ holds one module per `sparkit` command, named for it, each listed once in
commands/__init__.py (COMMANDS: pip's commands_dict) and imported only when its command runs;
options.py declares the options several commands share (pip's cmdoptions); command_tree.py is
typer's tree with sparkit's command and group classes; main.py is the entry point and its exit
codes. Modules import only light things at top level; what one command needs is imported inside it.
"""
