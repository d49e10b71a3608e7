"""The claims table's rows read from stored results: each quantitative claim of the design next
to what was measured. It trains nothing.

The suite (`python -m benchmarks suite`) measures most claims in its own runs and writes
results/claims/claims.md with them; the rows whose runs take hours are read here from what their
experiments stored: transfer (results/transfer/transfer_*.npz) and the headline table
(results/headline/headline/*.npz). `python -m benchmarks claims` puts those rows into
results/claims/claims.md again after such a run; the headline experiment does it by itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.lib import runner
from benchmarks.lib.stats import ratio_ci, speedup_cell
from benchmarks.reports import headline_table as headline


TRANSFER_CLAIM = ("Transfer to a related task (frozen feature extractor, progressive unfreezing, a KL term to the "
                  "source policy) adapts 4–8× faster than training from scratch")


def transfer_row(results=None) -> list[str] | None:
    """The transfer claim's row from the runs the transfer experiment saved
    (results/transfer/transfer_cartpole.npz, transfer_acrobot.npz: each variant's per-seed env steps
    to the threshold, censored at its budget), or None when there are none. Read, not rerun: the
    suite's budgets are too small for it. `results`: another results folder."""

    parts, measured = [], []
    # transfer_acrobot_at-130: the Acrobot runs read again at -130 (`--reanalyse`), since none reached -100
    for path in (Path(results or runner.RESULTS) / "transfer" / f"transfer_{task}.npz" for task in ("cartpole", "acrobot", "acrobot_at-130")):
        if not path.exists():
            continue
        with np.load(path) as z:
            reach = {k[len("reach "):]: z[k] for k in z.files if k.startswith("reach ")}
        with np.load(path.with_name(path.name.split("_at")[0].removesuffix(".npz") + ".npz")) as z:  # the curves
            budget = {k: int(z[k + " env_steps"][-1]) for k in reach}
        scratch = reach.pop("from scratch (preset)", None)
        if scratch is None:
            continue
        cells = []
        for name, steps in reach.items():
            cell = speedup_cell(scratch, budget["from scratch (preset)"], steps, budget[name])
            cells.append(f"{name.removeprefix('init_from, ')} {cell}")
            if cell[0].isdigit():
                measured.append(ratio_ci(scratch, steps))
        parts.append(f"{path.stem}: " + "; ".join(cells))
    if not parts:
        return None
    inside = sum(lo >= 4.0 and hi <= 8.0 for _, lo, hi in measured)
    above = sum(lo > 8.0 for _, lo, hi in measured)
    below = sum(hi < 4.0 for _, lo, hi in measured)
    reading = (f"{len(measured)} variant(s) measured on both sides: {above} faster than 8×, {inside} within 4–8×, "
               f"{below} below 4× (whole 95% interval), {len(measured) - above - inside - below} straddling; the rest "
               f"are bounds or unmeasured (their IQM cut off at the budget)")
    text = ("IQM env steps to the threshold, scratch ÷ transferred, 95% bootstrap interval, 8 seeds: "
            + " — ".join(parts))
    return [TRANSFER_CLAIM, text, reading,
            "`python -m benchmarks transfer --task cartpole\\|acrobot --seeds 8` (results/transfer/transfer_*.md)"]


HEADLINE_CLAIM = ("RMT beats PPO and SAC at 1M env steps: LunarLander 285 vs 198 vs 231, BipedalWalker 312 vs 187 "
                  "vs 269, Breakout 452 vs 318 vs 389")


def headline_row(results=None) -> list[str] | None:
    """The headline table's claim from the pieces the headline experiment stored
    (results/headline/headline/), or None when there are none. Read, not rerun: the rows take hours."""
    pieces = headline.load_pieces("headline", results)
    if not pieces:
        return None
    parts, reading = [], []
    for env in headline.BOX2D:
        cells, measured, greedy = [], {}, {}
        for algo in headline.BOX2D[env]:
            got = pieces.get((env, algo))
            claim = headline.CLAIMS.get((env, algo))
            said = f" (claimed {claim})" if claim is not None else ""
            if not got:
                cells.append(f"{algo} not run yet{said}")
                continue
            scores = np.concatenate([p["scores"] for p in got])
            measured[algo] = headline.iqm_ci(scores)
            cell = f"{algo} {headline.fmt(scores)}{said}, {len(scores)} seeds"
            if all(p["eval_scores"] is not None for p in got):
                evals = np.concatenate([p["eval_scores"] for p in got])
                greedy[algo] = headline.iqm_ci(evals)
                cell += f", greedy {headline.fmt(evals)}"
            cells.append(cell)
        parts.append(f"{env.split(':')[1]}: " + "; ".join(cells))
        for what, by in (("", measured), ("greedy evaluation: ", greedy)):
            if "rmt" in by and len(by) > 1:
                beats, loses = _apart(by)
                others = "" if by is measured else f" (of {', '.join(a for a in by if a != 'rmt')})"
                reading.append(f"{env.split(':')[1]}: {what}RMT above {', '.join(beats) or 'none'}, below "
                               f"{', '.join(loses) or 'none'}{others} (95% intervals apart)")
    missing = [f"{e.split(':')[1]} {a}" for e in headline.BOX2D for a in headline.BOX2D[e] if (e, a) not in pieces]
    if missing:
        reading.append(f"not run yet: {', '.join(missing)}")
    return [HEADLINE_CLAIM, "IQM of each seed's last-10% return (and, where run, of its greedy evaluation's mean "
            "return), 95% bootstrap interval, 1M env steps: "
            + " — ".join(parts), "; ".join(reading) or "—",
            "`python -m benchmarks headline` (results/headline/headline.md, run in pieces)"]


def _apart(by: dict) -> tuple[list[str], list[str]]:
    """The agents whose 95% interval lies wholly below / above RMT's, of {algo: (iqm, lo, hi)}."""
    _, lo, hi = by["rmt"]
    return ([a for a, (_, _, h2) in by.items() if a != "rmt" and lo > h2],
            [a for a, (_, l2, _) in by.items() if a != "rmt" and hi < l2])


def upsert_row(row: list[str], path=None) -> None:
    """Put `row` into results/claims/claims.md in place of the row with the same claim, else after
    the table's last row (so a result read from stored runs lands without rerunning the suite)."""
    path = Path(path or runner.RESULTS / "claims" / "claims.md")
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    text = "| " + " | ".join(row) + " |"
    same = [i for i, line in enumerate(lines) if line.startswith(f"| {row[0]} |")]
    if same:
        lines[same[0]] = text
    else:
        last = max(i for i, line in enumerate(lines) if line.startswith("| "))
        lines.insert(last + 1, text)
    path.write_text("\n".join(lines) + "\n")


def add_arguments(ap) -> None:
    pass


def run(args) -> None:
    """Put the rows read from stored results (transfer, headline) into results/claims/claims.md."""
    for row in (transfer_row(), headline_row()):
        if row is not None:
            upsert_row(row)
            print("| " + " | ".join(row) + " |")
