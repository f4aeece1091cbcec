"""What every test shares: the figures a test opened are closed after it (pyplot keeps each one open until
told, and a test file drawing many would pile them up)."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt = sys.modules.get("matplotlib.pyplot")  # a test that drew nothing need not import it
    if plt is not None:
        plt.close("all")
