"""The exact re-scoring rule of the FP8 lm_head, as numbers (sparkit.kernels.fp8_linear explains it):
shared by the torch path, the Triton kernels and the recipe schema, torch-free."""

# Candidates re-scored per row by default (recipe key stack.lm_head_exact_top_k).
DEFAULT_EXACT_TOP_K = 4
# Tokens re-scored per best vocabulary stretch: its best and its runner-up (near-ties between
# neighbouring ids, such as the digits "3" and "4", fall in one stretch).
TOKENS_PER_STRETCH = 2
