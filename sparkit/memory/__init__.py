"""Memory: what this machine can give an engine, what a recipe's engine will take, and a guard
that keeps a unified-memory box from wedging while an engine loads.

    meminfo     /proc/meminfo as numbers (MemAvailable, MemFree, page cache, swap)
    pagecache   which of a file's pages sit in the page cache (mincore) and evicting them
                (posix_fadvise DONTNEED: no root needed)
    checkpoint  where a recipe's checkpoint is on disk (a local directory, a sparkit build, the
                Hugging Face cache), or why it cannot be read
    model_shape what config.json says the KV cache and linear-attention state hold per token
    fit         the memory fit of a plan: every term (weights from the safetensors headers, KV,
                runtime headroom, the OS floor) and the verdict under the engine's semantics
    picture     the honest memory picture: MemAvailable, the page cache (and how much of it is
                the model's own files), swap, and what NVML / CUDA would claim
    guard       the load guard `launch` runs while the engine loads and warms up

Everything here returns data; only sparkit.cli renders it.
"""
