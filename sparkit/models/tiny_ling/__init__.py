"""tiny-ling: Ling-3.0-flash in miniature (a BailingMoeV2), the embedded engine's model.

model: the PyTorch model (target + NextN draft); builder: trains a build by steps, gates and
caches it; corpus and tokenizer: what it trains on and reads; quant: the weight formats it loads
in; checkpoint: its files on disk; formats: how a checkpoint is recognised before torch loads;
hf_checkpoint and hf_quantized: its Hugging Face export, bf16 and the published quantised layouts;
checkpoints/: the shipped build."""
