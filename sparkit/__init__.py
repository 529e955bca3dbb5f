"""sparkit: fast, provably correct batch-1 MoE decoding on a desktop.

The public surface is small on purpose: load a recipe, compile it into a
LaunchPlan, start it as a Run, and check that every optimisation activated.
Heavy dependencies (torch, sglang, textual, scipy) are imported lazily so that
`sparkit --help` starts instantly.
"""

__version__ = "0.1.0"
