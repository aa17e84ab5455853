"""The host side of prefix caching: which device pool entry (`models.prefix.PrefixPool`) holds
which block of which prefix.

Prompts are cut into blocks of B tokens; a prompt's last len % B tokens form a partial block (a
leaf: it never gets children). A block's key is (its parent's key, its tokens), so a key names
the whole prefix up to the block's end (a radix tree over blocks; keys are compared exactly, no
hash collisions). A prompt hits the longest chain of cached whole blocks it starts with, then
the child of the chain's last block (whole or partial) sharing the most tokens with it: every
token it shares with a cached prompt, leaving at least one to prefill (its logits give the
first sampled token). The blocks of its remainder (and its partial block) become new entries
unless cached already. Entries are evicted least recently used first, leaves first (a parent
outlives its children, so every cached block's chain is cached), never one in use by the
prefill being planned.

With a host pool (host_capacity > 0), a device entry evicted goes to a host slot instead (a spill)
and comes back to a device entry when a prompt hits it (a load); the host pool evicts least
recently used leaves for good. Device entries form the top of the tree (an entry is spilled only
when its children are on the host), so a chain is device entries then host slots.

    plans = cache.plan(prompts)       # per prompt: Plan(hit entries, cached tokens, stores)
    moves = cache.take_moves()        # then, in order: ("spill", entry, slot), ("load", slot,
                                      # entry): copy the pool entry / host slot before prefilling
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple


class _Children:
    """A node's children by first token, then tokens: the children sharing a prefix with a
    prompt are one bucket, however many the node has."""

    def __init__(self):
        self._by_first: dict[int, dict[tuple, _Node]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_first)

    def get(self, tokens: tuple) -> _Node | None:
        return self._by_first.get(tokens[0], {}).get(tokens)

    def starting(self, token: int) -> dict[tuple, _Node]:
        """tokens -> child, for the children whose tokens start with `token`."""
        return self._by_first.get(token, {})

    def add(self, tokens: tuple, node: _Node):
        self._by_first.setdefault(tokens[0], {})[tokens] = node

    def remove(self, tokens: tuple):
        bucket = self._by_first[tokens[0]]
        del bucket[tokens]
        if not bucket:
            del self._by_first[tokens[0]]


@dataclasses.dataclass(eq=False)
class _Node:
    key: tuple                  # (parent key or None, block tokens: B, fewer when partial)
    parent: _Node | None
    entry: int                  # pool index, -1 while on the host
    kids: _Children = dataclasses.field(default_factory=_Children)
    host: int = -1              # host slot, -1 while on the device
    device_children: int = 0


class Plan(NamedTuple):
    """A prompt's prefix-cache work: hits, the pool entries of its first `cached` tokens (its
    whole blocks, then the entry holding the cached tokens past them if any); stores, the entry
    to write each block of the prompt from its last whole cached block on to (the partial
    block last), or -1 (cached already, another prompt of this prefill stores it, or the pool
    has no room)."""
    hits: list[int]
    cached: int
    stores: list[int]


@dataclasses.dataclass
class PrefixStats:
    """Counters since the engine started (or `PrefixCache.clear`)."""
    lookups: int = 0            # prompts looked up
    lookup_tokens: int = 0      # their tokens
    hit_tokens: int = 0         # tokens restored from the cache (prefill skipped them)
    evictions: int = 0          # entries forgotten
    spills: int = 0             # entries moved to the host pool
    loads: int = 0              # entries brought back from it
    host_entries: int = 0
    host_capacity: int = 0
    entries: int = 0            # blocks (whole or partial) cached now
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

    def __init__(self, capacity: int, block: int, entry_bytes: int, host_capacity: int = 0):
        self.block = block
        self.capacity = capacity
        self.host_capacity = host_capacity
        self.entry_bytes = entry_bytes
        self.clear()

    def clear(self):
        """Forgets every entry and resets the counters (the pool's contents become garbage)."""
        self._nodes: OrderedDict[tuple, _Node] = OrderedDict()    # least recently used first
        self._root = _Children()                                    # the first blocks
        self._free = list(range(self.capacity - 1, -1, -1))
        self._host_free = list(range(self.host_capacity - 1, -1, -1))
        self._moves = []
        self.stats = PrefixStats(capacity=self.capacity, block=self.block,
                                 entry_bytes=self.entry_bytes,
                                 host_capacity=self.host_capacity)

    def take_moves(self) -> list[tuple[str, int, int]]:
        """The spills and loads the plans since the last call need, in order: ("spill", pool
        entry, host slot) copies the entry to the slot, ("load", host slot, pool entry) back."""
        moves, self._moves = self._moves, []
        return moves

    def plan(self, prompts: Sequence[Sequence[int]],
             counted: Sequence[bool] | None = None) -> list[Plan]:
        """For the prompts of one prefill, a `Plan` each: its cached tokens (every token it
        shares with a cached prompt, at most len - 1) and where its blocks from the last whole
        cached one on go. Lookups see only entries stored by earlier prefills. counted[i] False
        leaves prompt i out of the lookup counters (the engine's re-prefills of finished
        sequences)."""
        B = self.block
        prompts = [tuple(int(t) for t in p) for p in prompts]
        pinned = set()
        hits = []
        for i, p in enumerate(prompts):
            chain, kids = [], self._root
            while (len(chain) + 1) * B < len(p):
                s = len(chain) * B
                node = kids.get(p[s:s + B])
                if node is None or not self._use(node, pinned.union(chain)):
                    break
                chain.append(node)
                kids = node.kids
            base = len(chain) * B
            held, r = self._longest(kids, p[base:len(p) - 1])
            if held is not None and not self._use(held, pinned.union(chain)):
                held, r = None, 0
            chain += [held] if held is not None else []
            pinned.update(chain)
            hits.append((chain, base + r))
            if counted is not None and not counted[i]:
                continue
            self.stats.lookups += 1
            self.stats.lookup_tokens += len(p)
            self.stats.hit_tokens += base + r
        out = []
        for p, (chain, cached) in zip(prompts, hits):
            n = cached // B
            parent = chain[n - 1] if n else None
            stores = []
            for s in range(n * B, len(p), B):
                tokens = p[s:s + B]
                kids = self._root if parent is None else parent.kids
                if len(tokens) < B and any(k[:len(tokens)] == tokens
                                           for k in kids.starting(tokens[0])):
                    break                           # a partial block inside a cached one
                node = kids.get(tokens)
                if node is None:
                    node = self._insert((parent and parent.key, tokens), parent, pinned)
                    if node is None:
                        break
                    stores.append(node.entry)
                elif node.host < 0:                 # stored by an earlier row or prefill
                    stores.append(-1)
                else:                               # no device child under a host entry
                    break
                pinned.add(node)
                parent = node
            blocks = -(-(len(p) - n * B) // B)
            out.append(Plan([node.entry for node in chain], cached,
                            stores + [-1] * (blocks - len(stores))))
        self.stats.host_entries = self.host_capacity - len(self._host_free)
        self.stats.entries = len(self._nodes) - self.stats.host_entries
        return out

    @staticmethod
    def _longest(kids, rest) -> tuple[_Node | None, int]:
        """The child sharing the longest token prefix with rest, and its length (None, 0 when
        none shares a token)."""
        best, most = None, 0
        for tokens, node in kids.starting(rest[0]).items() if rest else ():
            k = next((j for j, (a, b) in enumerate(zip(tokens, rest)) if a != b),
                     min(len(tokens), len(rest)))
            if k > most:
                best, most = node, k
        return best, most

    def _use(self, node, pinned) -> bool:
        """Marks a node hit as most recently used, loading it from the host first if it is
        there (False without room for it)."""
        if node.host >= 0 and not self._load(node, pinned | {node}):
            return False
        self._nodes.move_to_end(node.key)
        return True

    def _load(self, node, pinned) -> bool:
        """Brings a host node back onto a pool entry (False without room)."""
        entry = self._device_entry(pinned)
        if entry is None:
            return False
        self._moves.append(("load", node.host, entry))
        self._host_free.append(node.host)
        node.entry, node.host = entry, -1
        if node.parent is not None:
            node.parent.device_children += 1
        self.stats.loads += 1
        return True

    def _device_entry(self, pinned) -> int | None:
        """A free pool entry, spilling (or evicting) the least recently used unpinned device
        node without device children if none is free; None without room."""
        if self._free:
            return self._free.pop()
        victim = next((n for n in self._nodes.values() if n.host < 0 and n.device_children == 0
                       and n not in pinned), None)
        if victim is None:
            return None
        entry = victim.entry
        if victim.parent is not None:
            victim.parent.device_children -= 1
        if self.host_capacity and not self._host_free:
            leaf = next((n for n in self._nodes.values()     # the host's LRU unpinned leaf
                         if n.host >= 0 and not n.kids and n not in pinned), None)
            if leaf is not None:
                self._host_free.append(self._forget(leaf))
        if self._host_free:
            victim.entry, victim.host = -1, self._host_free.pop()
            self._moves.append(("spill", entry, victim.host))
            self.stats.spills += 1
        else:
            self._forget(victim)
        return entry

    def _forget(self, node) -> int:
        """Drops a leaf; returns its pool entry or host slot (for the caller to reuse)."""
        del self._nodes[node.key]
        (self._root if node.parent is None else node.parent.kids).remove(node.key[1])
        self.stats.evictions += 1
        return node.entry if node.host < 0 else node.host

    def _insert(self, key, parent, pinned) -> _Node | None:
        """A new node for key on a pool entry (`_device_entry`), or None without room."""
        entry = self._device_entry(pinned)
        if entry is None:
            return None
        node = _Node(key, parent, entry)
        (self._root if parent is None else parent.kids).add(key[1], node)
        if parent is not None:
            parent.device_children += 1
        self._nodes[key] = node
        return node
