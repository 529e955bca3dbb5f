"""tiny-ling's deterministic synthetic corpus: grammar sentences, arithmetic, counting, short
Q/A turns in the chat format, and the first messages people type into a chat (greetings, "who are
you?", "help", thanks) so that a first `sparkit chat` gets an answer. Same seed, same documents,
same order.

Documents are plain strings; chat documents contain the role/eos special tokens literally and
are tokenised with special-token parsing (see `encode_document`: sparkit's own byte-level
encoder, the same ids as the saved tokenizer gives, whatever tokenizers/transformers are
installed; a test compares the two).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from sparkit.models.tiny_ling import tokenizer as tok

SUBJECTS = ["the cat", "the dog", "a bird", "the girl", "a boy", "the old man", "my friend", "the teacher", "a fox", "the king"]
VERBS = ["sees", "likes", "follows", "helps", "finds", "calls", "watches", "meets"]
OBJECTS = ["the ball", "a tree", "the river", "a red box", "the house", "the moon", "a small fish", "the garden"]
PLACES = ["in the park", "at home", "near the lake", "on the hill", "by the road", "in the morning", "at night"]
THINGS = ["apples", "books", "cups", "stones", "coins", "birds"]
NAMES = ["Ann", "Bob", "Tom", "Lily", "Sam", "Mia"]
NUMBER_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(PLACES)}"
    return s[0].upper() + s[1:] + "."


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    if rng.random() < 0.5:
        return f"{a} + {b} = {a + b}."
    a, b = max(a, b), min(a, b)
    return f"{a} - {b} = {a - b}."


def _counting(rng: random.Random) -> str:
    start, n = rng.randint(0, 40), rng.randint(4, 9)
    if rng.random() < 0.3:
        return "Count down: " + " ".join(str(start + n - i) for i in range(n)) + "."
    return "Count: " + " ".join(str(start + i) for i in range(n)) + "."


# First messages of a chat, each with the answer tiny-ling learns for it.
SMALL_TALK = (
    (("Hello", "Hi", "Hey", "Hi there", "Hello there", "Good morning", "Good evening", "Greetings", "Yo"),
     "Hello! I am tiny-ling. Ask me to add or to count."),
    (("How are you", "How are you doing", "How is it going", "What's up"),
     "I am fine, thanks. Ask me a sum."),
    (("Who are you", "What is your name", "What are you", "Introduce yourself"),
     "I am tiny-ling, a tiny test model made by sparkit."),
    (("What can you do", "Help", "Can you help me", "What do you know"),
     "I can add numbers and count. Try: What is 3 plus 4?"),
    (("Thanks", "Thank you", "Thank you very much", "Great", "Nice"),
     "You are welcome!"),
    (("Bye", "Goodbye", "See you", "Good night"),
     "Goodbye!"),
    (("Tell me a joke", "Say something funny"),
     "Why did the cat sit on the computer? To watch the mouse."),
    (("Test", "Testing", "Ping", "Are you there"),
     "Yes, I am here."),
)


def _small_talk(rng: random.Random) -> tuple[str, str]:
    prompts, answer = rng.choice(SMALL_TALK)
    text = rng.choice(prompts)
    style = rng.random()
    if style < 0.25:
        text = text.lower()
    elif style < 0.3:
        text = text.upper()
    ending = rng.choice(("", "!", "?", ".", "!!", " :)"))
    if text.lower().startswith(("how", "who", "what", "can", "are")):
        ending = rng.choice(("?", "", "?"))
    return text + ending, answer


def _qa(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.4:
        return _small_talk(rng)
    kind = rng.randrange(5)
    if kind == 4:
        start, shown = rng.randint(0, 6), rng.randint(2, 4)
        words = NUMBER_WORDS[start : start + shown + 4]
        return f"count: {' '.join(words[:shown])}", " ".join(words[shown:]) + "."
    if kind == 0:
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        name, n, thing = rng.choice(NAMES), rng.randint(2, 9), rng.choice(THINGS)
        m, verb = rng.randint(1, 9), rng.choice(("gets", "buys", "finds"))
        question = rng.choice((f"How many {thing} does {name} have?", f"How many {thing}?"))
        return (f"{name} has {n} {thing} and {verb} {m} more. {question}",
                f"{name} has {n} + {m} = {n + m} {thing}. The answer is {n + m}.")
    if kind == 2:
        start = rng.randint(1, 20)
        return f"Count from {start} to {start + 5}.", " ".join(str(start + i) for i in range(6)) + "."
    return "Tell me a sentence.", _sentence(rng)


def documents(seed: int = 0) -> Iterator[str]:
    """An endless, deterministic stream of documents."""
    rng = random.Random(seed)
    while True:
        r = rng.random()
        if r < 0.3:
            yield " ".join(_sentence(rng) for _ in range(rng.randint(2, 4)))
        elif r < 0.48:
            yield " ".join(_arithmetic(rng) for _ in range(rng.randint(2, 4)))
        elif r < 0.6:
            yield _counting(rng)
        else:
            question, answer = _qa(rng)
            yield f"<|user|>{question}<|eos|><|assistant|>{answer}<|eos|>"


def encode_document(text: str) -> list[int]:
    """<|bos|> + the document's tokens (special tokens written literally are parsed) + <|eos|>
    for plain documents (chat documents already end with one)."""
    bos, eos = tok.special_token_id(tok.BOS), tok.special_token_id(tok.EOS)
    ids = [bos] + tok.encode_bytes(text)
    if ids[-1] != eos:
        ids.append(eos)
    return ids


def token_stream(seed: int = 0) -> Iterator[int]:
    for doc in documents(seed):
        yield from encode_document(doc)


def sample_prompts(count: int, seed: int = 1000, chat_fraction: float = 0.5) -> list[dict]:
    """Prompts drawn from the corpus distribution (a different seed than training): each is
    {"kind": "chat", "messages": [...]} or {"kind": "text", "text": prefix of a document}."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        if rng.random() < chat_fraction:
            question, _ = _qa(rng)
            out.append({"kind": "chat", "messages": [{"role": "user", "content": question}]})
        else:
            r = rng.random()
            doc = _sentence(rng) if r < 0.4 else _arithmetic(rng) if r < 0.7 else _counting(rng)
            cut = max(3, len(doc) // 3)
            out.append({"kind": "text", "text": doc[:cut]})
    return out


def prompt_ids(tokenizer, prompt: dict) -> list[int]:
    if prompt["kind"] == "chat":
        ids = tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(ids, add_special_tokens=False)
    return [tokenizer.bos_token_id] + tokenizer.encode(prompt["text"], add_special_tokens=False)
