"""DSpark block drafts (SGLang 0.5.23's LingDSparkModel), sparkit's own: a few Qwen3-shaped layers
that draft a block of tokens at once from the target's captured layer outputs, with a Markov head
and a confidence head, computing with the target's embedding and lm_head modules.

config: the config.json keys and tensor names SGLang reads (torch-free); model: the PyTorch draft
(what it sees and predicts); target: the targets a draft is built for (tiny-ling today);
training: the data and objective; builder: deterministic builds, the gate, the cache;
checkpoint: its files (SGLang's layout: a build is what SGLang loads); checkpoints/: the shipped
draft for tiny-ling."""
