"""The host side of prefix caching: which device pool entry (`models.prefix.PrefixPool`) holds
which block of which prefix.

Prompts are cut into blocks of B tokens. A block's key is (its parent's key, its tokens), so a
key names the whole prefix up to the block's end (a radix tree over blocks; keys are compared
exactly, no hash collisions). A prompt hits the longest chain of cached blocks it starts with,
leaving at least one token to prefill (its logits give the first sampled token); the blocks of
its remainder that lie inside the prompt become new entries. Entries are evicted least recently
used first, leaves first (a parent outlives its children, so every cached block's chain is
cached), never one in use by the prefill being planned.

    plan = cache.plan(prompts)        # per prompt: (hit entries, entries to store or -1)
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence


@dataclasses.dataclass(eq=False)
class _Node:
    key: tuple                  # (parent key or None, block tokens)
    parent: "_Node | None"
    entry: int                  # pool index
    children: int = 0


@dataclasses.dataclass
class PrefixStats:
    """Counters since the engine started (or `PrefixCache.clear`)."""
    lookups: int = 0            # prompts looked up
    lookup_tokens: int = 0      # their tokens
    hit_tokens: int = 0         # tokens restored from the cache (prefill skipped them)
    evictions: int = 0
    entries: int = 0            # blocks cached now
    capacity: int = 0           # entries the pool holds
    block: int = 0              # tokens per entry
    entry_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Hit tokens over looked-up tokens (0 before any lookup)."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), hit_rate=self.hit_rate,
                    bytes=self.entries * self.entry_bytes)


class PrefixCache:
    """Index of a pool of `capacity` entries of `block` tokens (see the module docstring)."""

    def __init__(self, capacity: int, block: int, entry_bytes: int):
        self.block = block
        self.capacity = capacity
        self.entry_bytes = entry_bytes
        self.clear()

    def clear(self):
        """Forgets every entry and resets the counters (the pool's contents become garbage)."""
        self._nodes: OrderedDict[tuple, _Node] = OrderedDict()    # least recently used first
        self._free = list(range(self.capacity - 1, -1, -1))
        self.stats = PrefixStats(capacity=self.capacity, block=self.block,
                                 entry_bytes=self.entry_bytes)

    def plan(self, prompts: Sequence[Sequence[int]],
             counted: Sequence[bool] | None = None) -> list[tuple[list[int], list[int]]]:
        """For the prompts of one prefill: per prompt (hits, stores). hits: the pool entries of
        its longest cached chain of blocks (at most (len - 1) // B of them); stores: one per
        block of the prompt after those, the entry to write it to, or -1 (another prompt of
        this prefill stores it, or the pool has no room). Lookups see only entries stored by
        earlier prefills. counted[i] False leaves prompt i out of the lookup counters (the
        engine's re-prefills of decoded blocks)."""
        B = self.block
        blocks = [[tuple(int(t) for t in p[i:i + B]) for i in range(0, len(p) - B + 1, B)]
                  for p in prompts]
        pinned = set()
        hits = []
        for i, (p, bl) in enumerate(zip(prompts, blocks)):
            chain, key = [], None
            for tokens in bl[:(len(p) - 1) // B]:
                node = self._nodes.get((key, tokens))
                if node is None:
                    break
                self._nodes.move_to_end(node.key)
                chain.append(node)
                key = node.key
            pinned.update(chain)
            hits.append(chain)
            if counted is not None and not counted[i]:
                continue
            self.stats.lookups += 1
            self.stats.lookup_tokens += len(p)
            self.stats.hit_tokens += len(chain) * B
        out = []
        for chain, bl in zip(hits, blocks):
            parent = chain[-1] if chain else None
            stores = []
            for tokens in bl[len(chain):]:
                key = (parent and parent.key, tokens)
                node = self._nodes.get(key)
                if node is None:
                    node = self._insert(key, parent, pinned)
                    if node is None:
                        break
                    stores.append(node.entry)
                else:                               # stored by an earlier row of this prefill
                    stores.append(-1)
                pinned.add(node)
                parent = node
            out.append(([n.entry for n in chain], stores + [-1] * (len(bl) - len(chain)
                                                                    - len(stores))))
        self.stats.entries = len(self._nodes)
        return out

    def _insert(self, key, parent, pinned) -> _Node | None:
        """A new node for key on a free entry (evicting the least recently used unpinned leaf
        if none is free), or None without room."""
        if not self._free:
            victim = next((n for n in self._nodes.values()
                           if n.children == 0 and n not in pinned), None)
            if victim is None:
                return None
            del self._nodes[victim.key]
            if victim.parent is not None:
                victim.parent.children -= 1
            self._free.append(victim.entry)
            self.stats.evictions += 1
        node = _Node(key, parent, self._free.pop())
        if parent is not None:
            parent.children += 1
        self._nodes[key] = node
        return node
