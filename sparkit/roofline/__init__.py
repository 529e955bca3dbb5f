"""What decode speed a recipe can reach on a machine, and where the bytes of a step go.

Batch-1 decoding is memory-bound: each step reads the weights it uses once, so a step cannot
take less than (bytes read) / (memory bandwidth). The package computes that bound per recipe:

- `layout`: which tensors a decode step reads, from a checkpoint's config.json and safetensors
  headers (sparkit.checkpoint_headers), grouped by role (attention, dense MLP, shared expert, router,
  routed experts per MoE layer, lm_head, the MTP layer, KV cache and linear-attention state).
- `profiles`: declared layouts of models whose checkpoints are not on this machine (the shipped
  Ling recipes point at hub ids): Ling-3.0-flash's documented shapes, clearly labelled.
- `estimate`: bytes per step for a recipe's stack on its engine (stored dtypes, an FP8 lm_head,
  TP sharding), speculative decoding (the verify step reads the experts k+1 tokens touch, the
  draft reads the MTP layer and the lm_head each step), tok/s as a function of accept length
  and the break-even accept length.
- `bandwidth`: the memory bandwidth a target has (spec sheets, or what `sparkit doctor
  --bandwidth` measured on this host).
- `published`: the two studies' measured figures, to check the model against.

Nothing here imports torch: `sparkit plan` stays fast. Only the bandwidth measurement does.
"""
