"""Named spans in a model's forward pass, seen by torch.profiler while a profile runs (the embedded
engine's `/start_profile`, sparkit.engines.embedded.profiling) and costing one check otherwise."""

from __future__ import annotations

import contextlib


def span(name: str):
    """A profiler span named `name` while a profile runs; nothing otherwise (a check per call)."""
    import torch

    if not torch.autograd._profiler_enabled():
        return contextlib.nullcontext()
    return torch.profiler.record_function(name)
