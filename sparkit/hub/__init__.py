"""Models from the Hugging Face hub, on disk before launch: `sparkit pull`.

    refs.py     a hub reference, `org/name[@revision]`, and which model paths are one
    files.py    which files of a repository the engine reads (config, tokenizer, chat template,
                generation config, remote code, the safetensors shards the index names)
    cache.py    the Hugging Face cache as huggingface_hub lays it out (blobs, snapshots, refs),
                sparkit's record of what it verified, and whether a model is complete here
    untrusted.py  what a hub says, checked before it names a path or a byte count (commits, git
                oids and sha256s are hex of their length, sizes are sizes, file names stay inside)
    remote.py   the hub through huggingface_hub: listings with sizes and LFS sha256 (checked),
                the safetensors headers by range requests (the memory fit without a local copy),
                and its errors as one HubError each
    transfer.py one file's bytes into its partial download: as they arrive, never past the listed
                size, resumed by Range, stopped at once from another thread
    pull.py     the pull: room first, resumable downloads, verification against the hub's hashes,
                the page cache dropped after each verified file, the snapshot linked from them

Only remote.py, transfer.py and pull.py import huggingface_hub (and only when called): `sparkit
--help`, the recipe compiler and the memory fit of a local checkpoint never do.
"""
