"""The meta-controller and the curriculum: signals -> bounded hyperparameter moves, in the loop.

- `config`: the `meta:` and `curriculum:` config sections and their checks;
- `core`: the typed per-seed `MetaState`, the `Signals` read from an iteration's metrics and
  the pure `update(meta_state, signals, hparams) -> (meta_state, hparams)` of the `rules` and
  `bandit` modes; `pbt_round` (across seeds) and `curriculum_update`;
- `controller`: what the driver calls: wraps the batched agent state with the meta state and
  applies the update after every vmapped agent step.
"""
