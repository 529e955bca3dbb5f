"""What the builder's quality gate measures on a saved build of a built-in model, through the embedded engine
(what `sparkit up` will serve): the held-out loss, the greedy NEXTN accept length and a reply to
each greeting of the corpus. The builder (sparkit.models.builder) sits below the
engines and is handed `measure_quality` by whoever asks for a gated build."""

from __future__ import annotations

from pathlib import Path

from sparkit.models.checkpoint import load_checkpoint


def measure_quality(directory: Path, seed: int = 0, heldout_sequences: int = 8, prompts: int = 12) -> dict:
    """Held-out loss (next-token, nats/token) and greedy NEXTN 3/1/4 accept length of the saved
    checkpoint, through the embedded engine (what `sparkit up` will serve)."""
    import torch
    import torch.nn.functional as F

    from sparkit.engines.embedded.api import SamplingParams
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts, token_stream

    _, model = load_checkpoint(directory)
    from sparkit.models.tiny_ling.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(directory)
    stream = token_stream(seed=10_000 + seed)  # documents the training never saw
    batch = torch.tensor([[next(stream) for _ in range(129)] for _ in range(heldout_sequences)])
    with torch.inference_mode():
        logits = model.logits(model.forward_hidden(batch[:, :-1]))
        loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)))
    engine = EmbeddedEngine(EngineConfig(model_path=str(directory), device="cpu", lm_head_dtype="bf16",
                                         speculative_algorithm="NEXTN", speculative_num_steps=3))
    tokens = verify_steps = 0
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    for prompt in sample_prompts(prompts, seed=20_000 + seed):
        for step in engine.generate(prompt_ids(tokenizer, prompt), params, lambda: False):
            if step.verify_step:
                verify_steps += 1
                tokens += len(step.token_ids)
    accept = tokens / verify_steps if verify_steps else 0.0
    unanswered = []
    short = SamplingParams(temperature=0.0, max_new_tokens=8)
    for text in greeting_probes():
        ids = prompt_ids(tokenizer, {"kind": "chat", "messages": [{"role": "user", "content": text}]})
        reply = [t for step in engine.generate(ids, short, lambda: False) for t in step.token_ids]
        if not reply or reply[0] == tokenizer.eos_token_id:
            unanswered.append(text)
    return {"heldout_loss": round(loss, 4), "accept_length": round(accept, 3),
            "greetings": len(greeting_probes()), "unanswered_greetings": unanswered,
            "probe": f"{prompts} held-out prompts, greedy NEXTN 3/1/4, {verify_steps} verify steps"}


def greeting_probes() -> list[str]:
    """Each first message of the corpus's small talk, bare and with the usual punctuation."""
    from sparkit.models.tiny_ling.corpus import SMALL_TALK

    out = []
    for prompts, _ in SMALL_TALK:
        for text in prompts:
            out += [text, text + "!", text + "?", text.lower()]
    return out


def measure_draft_quality(draft_dir: Path, target_dir: Path, prompts: int = 12, seed: int = 20_000) -> dict:
    """A DSpark draft's greedy accept length on held-out prompts of its target's corpus, and the
    target's own NEXTN 3/1/4 on the same prompts, through the embedded engine (bf16, 48 tokens
    each, EOS ignored as the startup probe ignores it)."""
    from sparkit.engines.embedded.api import SamplingParams
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts
    from sparkit.models.tiny_ling.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    ids = [prompt_ids(tokenizer, p) for p in sample_prompts(prompts, seed=seed)]
    params = SamplingParams(temperature=0.0, max_new_tokens=48, ignore_eos=True)
    figures = {}
    for name, extra in (("accept_length", {"speculative_algorithm": "DSPARK", "speculative_draft_model_path": str(draft_dir)}),
                        ("nextn_accept_length", {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3})):
        engine = EmbeddedEngine(EngineConfig(model_path=str(target_dir), device="cpu", lm_head_dtype="bf16", **extra))
        tokens = verify_steps = 0
        for prompt in ids:
            for step in engine.generate(prompt, params, lambda: False):
                if step.verify_step:
                    verify_steps += 1
                    tokens += len(step.token_ids)
        figures[name] = round(tokens / verify_steps, 3) if verify_steps else 0.0
        figures[name.replace("accept_length", "verify_steps")] = verify_steps
    figures["probe"] = f"{prompts} held-out prompts (corpus seed {seed}), greedy, 48 tokens, EOS ignored"
    return figures
