"""The small models sparkit builds, trains and ships itself, so that everything it does runs on a
laptop or in CI: tiny-ling (tiny_ling/) today. Each model's package holds its model code, its
builder (deterministic training on the CPU, a quality gate), its checkpoint format and its
Hugging Face export; the engines that serve them sit above (sparkit.engines.embedded)."""
