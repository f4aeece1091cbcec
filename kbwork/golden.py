"""Golden op_logs: the canonical CSVs of the benches, committed under ``data/golden/``.

``kbwork golden --check`` re-simulates every golden bench and compares byte
for byte; ``kbwork golden --update`` rewrites them (do this only on purpose,
and say why in the commit message).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Callable

from . import atomic
from .config import DATA_DIR
from .sim import Simulator

GOLDEN_DIR = DATA_DIR / "golden"


def golden_benches() -> dict[str, Callable[[], str]]:
    """Name -> function returning the bench's canonical op_log CSV (timing mode)."""
    from . import decode
    from .kernels.gemm import BENCHES

    out: dict[str, Callable[[], str]] = {}
    for name, fn in BENCHES.items():
        out[name] = (lambda fn=fn: fn(Simulator(mode="timing")).run.to_csv())
    out["decode_opt3_small"] = lambda: decode.run("opt3", kv_len=512, mode="timing").to_csv()
    out["decode_opt2_small"] = lambda: decode.run("opt2", kv_len=512, mode="timing").to_csv()
    return out


def check(directory: Path = GOLDEN_DIR) -> list[str]:
    """Compare every golden; return a list of human-readable problems (empty when all match)."""
    problems = []
    for name, make in golden_benches().items():
        path = directory / f"{name}.csv"
        got = make()
        if not path.exists():
            problems.append(f"{name}: no golden at {path} (run `kbwork golden --update`)")
            continue
        want = path.read_text()
        if got != want:
            diff = list(difflib.unified_diff(want.splitlines(), got.splitlines(), "golden", "now", n=0, lineterm=""))
            problems.append(f"{name}: op_log differs from {path} ({len(diff)} diff lines); first:\n  "
                            + "\n  ".join(diff[:8]))
    return problems


def update(directory: Path = GOLDEN_DIR) -> list[str]:
    """Rewrite every golden (each atomically); return the names whose content changed.

    Raises:
        OSError: a golden cannot be written; the goldens not yet rewritten, and
            the one that failed, keep their previous content.
    """
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, make in golden_benches().items():
        path = directory / f"{name}.csv"
        text = make()
        if not path.exists() or path.read_text() != text:
            atomic.write_text(path, text)  # a failed write leaves the previous golden whole
            changed.append(name)
    return changed
