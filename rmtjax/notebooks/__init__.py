"""The example notebooks, shipped with the package: `rmtjax notebooks DEST` copies them out.

`01_quickstart.ipynb`, `02_sweeps.ipynb`, `03_inside_rmt.ipynb` (see docs/guides/notebooks.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def paths() -> list[Path]:
    """The bundled notebooks, in order."""
    return sorted(Path(__file__).parent.glob("*.ipynb"))


def copy_to(dest) -> list[Path]:
    """Copy the notebooks into `dest` (created if missing); a notebook already there is kept
    and not overwritten. Returns the paths in `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for p in paths():
        target = dest / p.name
        if not target.exists():
            shutil.copyfile(p, target)
        out.append(target)
    return out
