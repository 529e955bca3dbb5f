"""GSM8K accuracy check, one module per job: data (the split files), answers (extraction),
prompts (few-shot exemplars and prompts), eval_settings (what is hashed), results_file (the
results file), evaluate (a resumable run against a server) and summary.

The protocol (docs/protocols.md) is NVIDIA's published Spark check: all 1319 test questions,
5-shot chain of thought, temperature 0.6 / top_p 0.95 / top_k 29, through the chat template. It
fixes what common scripts get wrong: exemplars come from the *train* split and never from the
questions being evaluated; extraction keeps negatives and decimals; both a strict and a flexible
extraction are reported.

Results file (JSONL, appended as each question finishes, so a crash or Ctrl-C loses nothing):

    {"type": "header", "settings": {...}, "settings_hash": "...", "session": "...", "server": {...}, ...}
    {"type": "result", "id": 17, "prompt_sha": "...", "output": "...", "strict": "18", "flexible": "18",
     "gold": "18", "correct": {"strict": true, "flexible": true}, "completion_tokens": 212, ...}

A header line is written by every session (the first run and each --resume); resuming checks
that the settings hash matches the first header, so a file never mixes two protocols.
"""
