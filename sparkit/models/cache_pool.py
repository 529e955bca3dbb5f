"""A pool of caches made one per running sequence, for a model whose cache is not a slot of one
buffer (tiny-ling-v3: a KDA recurrent state beside an MLA cache): the same acquire/release/in_use
the engine's scheduler uses on tiny-ling's KVPool, at most `slots` caches out at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SequenceCaches:
    def __init__(self, slots: int, make: Callable[[], Any]):
        self.slots = slots
        self._make = make
        self._out: set[int] = set()

    @property
    def in_use(self) -> int:
        return len(self._out)

    def acquire(self) -> Any:
        if len(self._out) >= self.slots:
            raise RuntimeError(f"every cache slot is in use ({self.slots})")
        cache = self._make()
        self._out.add(id(cache))
        return cache

    def release(self, cache: Any) -> None:
        if id(cache) not in self._out:
            raise ValueError("not a cache of this pool in use")
        self._out.discard(id(cache))
        cache.length = 0
