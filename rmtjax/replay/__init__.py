"""Replay buffers as pure functions over typed states: `ring` (uniform), `tiered`
(hot/warm/cold keyed on TD error) and `prioritized` (sum-tree baseline); `stats` holds the
diagnostics they share."""
