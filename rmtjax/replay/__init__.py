"""Replay buffers as pure functions over typed states: `ring` (uniform), `tiered`
(hot/warm/cold keyed on TD error), `ranked` (hot/warm/cold as exact |TD| ranks over one FIFO
ring, re-ranked every few updates) and `prioritized` (sum-tree baseline).

`make_replay(kind, ...)` wraps each in the one interface the value-based agents use:

- `init(example)`, `add(state, batch, td_abs)` (`td_abs` is ignored where `needs_td` is False:
  a uniform buffer keeps no priority, so the agent need not compute one at insertion);
- `sample(state, key, batch_size, beta) -> (batch, info)` with `info.weight` the importance
  weights, and `update(state, info, td_abs, keep=None)`, the write-back of the drawn items' new
  |TD| (only the rows where `keep` is True, when given: rows a learner replaced, e.g. by
  demonstrations, are left as they were);
- diagnostics: `batch_stats(state, info)` (cheap, every iteration), `key_share(state, info,
  key)` (the top-TD share; it costs a quantile over a pool of items, so agents compute it every
  few iterations) and `buffer_stats(state)`.
"""

from __future__ import annotations

from rmtjax.replay.adapters import PrioritizedReplay, TieredReplay
from rmtjax.replay.ranked import RankedReplay
from rmtjax.replay.uniform import UniformInfo, UniformReplay
from rmtjax.replay.util import POOL, TOP_QUANTILE, top_share, write_td

__all__ = ["POOL", "TOP_QUANTILE", "PrioritizedReplay", "RankedReplay", "TieredReplay", "UniformInfo", "UniformReplay", "make_replay",
           "top_share", "write_td"]


def make_replay(kind: str, capacity: int, fractions=(0.01, 0.1, 0.89), proportions=(0.25, 0.35, 0.4), alpha=0.6,
                refresh_every=8):
    if kind == "uniform":
        return UniformReplay(capacity)
    if kind == "tiered":
        return TieredReplay(capacity, fractions, proportions)
    if kind == "ranked":
        return RankedReplay(capacity, fractions, proportions, refresh_every)
    if kind == "prioritized":
        return PrioritizedReplay(capacity, alpha)
    raise ValueError(f"unknown replay {kind!r}; choose uniform, tiered, ranked or prioritized")
