"""The embedded engine: a single-process PyTorch reference engine with SGLang's HTTP API.

Run as `python -m sparkit.engines.embedded --model-path DIR ...` (see server.py for flags).
"""
