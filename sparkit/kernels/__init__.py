"""GPU kernels shared by the embedded engine and the SGLang plugin, each with a torch fallback."""
