"""The notebooks give the same output every run: no progress bars in them, and the nbval sanitizer would
mask one if a checked cell printed it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _code(nb: Path) -> str:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    return "".join("".join(c["source"]) + "\n" for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("nb", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_every_sweep_in_a_notebook_turns_its_progress_bar_off(nb):
    calls = re.findall(r"decode\.sweep\((.*?)\)\n", _code(nb), flags=re.S)
    for call in calls:
        assert "progress=False" in call, f"{nb.name}: decode.sweep({call}) shows a tqdm bar; pass progress=False"


def test_the_sanitizer_masks_tqdm_progress_lines():
    plugin = pytest.importorskip("nbval.plugin")
    text = (NOTEBOOKS / "nbval_sanitize.cfg").read_text(encoding="utf-8")
    rules = [(re.compile(regex), replace) for regex, replace in plugin.get_sanitize_patterns(text)]  # as nbval reads it

    def sanitize(text: str) -> str:
        for regex, replace in rules:
            text = regex.sub(replace, text)
        return text

    lines = ["sweep:   0%|          | 0/27 [00:00<?, ?point/s]",
             "sweep: 100%|██████████| 27/27 [00:03<00:00,  8.90point/s]",
             "sweep:  44%|████▍     | 12/27 [00:01<00:02,  7.1s/point]"]
    assert len({sanitize(x) for x in lines}) == 1
    assert sanitize("opt2 76966 cycles") == "opt2 76966 cycles"
