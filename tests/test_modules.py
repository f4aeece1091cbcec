"""Modules of one concern (DESIGN §19): ``analysis/`` and ``plots/`` are split by what they compute and draw,
no module of theirs is over 900 lines, none of their functions is named for a decode variant, the packages
still export every name they did as single modules, and docs/architecture.md names each module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import kbwork.analysis  # noqa: E402
import kbwork.plots  # noqa: E402
from kbwork import layering  # noqa: E402
from kbwork.kernels.gqa_decode import VARIANTS  # noqa: E402

PACKAGES = (kbwork.analysis, kbwork.plots)
MODULES = [f"{p.__name__}.{m.name}" for p in PACKAGES for m in pkgutil.iter_modules(p.__path__)]
MAX_LINES = 900

#: What each package exported when it was one module: the split keeps every name where it was.
EXPORTED = {
    kbwork.analysis: (
        "CONTENDED Explanation GATE_FACTOR PATH_COLUMNS SATURATED SPEEDUP_RANGE WAIT_COLUMNS attribution "
        "attribution_gap attribution_table attribution_wide channel_steps channels channels_over_time check_what_if "
        "closed_form closed_form_per_tile closed_form_per_tile_from_program command_bytes_per_tile contention "
        "contention_words dispatch_per_tile dispatch_per_tile_from_run explain explain_all gate path_contention "
        "path_cycles ratio_grid top_waits utilization utilization_over_time utilization_wide waits what_if winners"),
    kbwork.plots: (
        "AXIS_WORDS CAUSE_COLORS DensityWarning ENGINE_COLORS HOLD_COLOR HOLD_OFFSET PALETTE STAGE_COLORS "
        "TENSOR_HATCH VALUE_WORDS VARIANT_COLORS attribution attribution_figure axis_label commands_per_tile "
        "compare_gantt contention cycle_axis cycles_bars describe device_gantt dispatch_per_tile facet_title gantt "
        "gantt_or_utilization gate_map ping_pong_gain ratio_heatmaps ratio_norm scaling text_color tile_window "
        "tokens_per_s tokens_per_s_grid too_dense utilization_over_time variant_ratio what_if winner_map"),
}


@pytest.mark.parametrize("module", MODULES)
def test_no_module_is_over_900_lines(module):
    path = importlib.import_module(module).__file__
    with open(path, encoding="utf-8") as f:
        n = sum(1 for _ in f)
    assert n <= MAX_LINES, f"{module} has {n} lines; split it by what it computes or draws (DESIGN §19)"


def test_the_packages_are_split():
    for package in PACKAGES:
        with open(package.__file__, encoding="utf-8") as f:
            assert sum(1 for _ in f) < 100, f"{package.__name__}/__init__.py should only re-export its modules"


@pytest.mark.parametrize("module", MODULES)
def test_no_function_is_named_for_a_decode_variant(module):
    """A function computes something of any variant; what it compares is a baseline and a candidate."""
    word = re.compile(r"(?:^|_)(?:" + "|".join(map(re.escape, VARIANTS)) + r")(?:$|_)")
    mod = importlib.import_module(module)
    bad = []
    for name, obj in vars(mod).items():
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or obj.__module__ != module:
            continue
        names = [name, *inspect.signature(obj).parameters] if inspect.isfunction(obj) else [name]
        bad += [f"{name}: {n}" for n in names if word.search(n)]
    assert not bad, f"{module}: named for a decode variant: {bad}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_name_the_package_exported_is_still_there(package):
    missing = [n for n in EXPORTED[package].split() if not hasattr(package, n)]
    assert not missing, f"{package.__name__} no longer has {missing}"
    assert inspect.isfunction(package.gantt if package is kbwork.plots else package.attribution)  # not the module


def test_importing_kbwork_still_loads_no_plots():
    code = "import sys, kbwork, kbwork.analysis\nprint('matplotlib' in sys.modules, 'kbwork.plots' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=layering.PACKAGE_DIR.parent)
    assert p.returncode == 0 and p.stdout.split() == ["False", "False"], p.stderr


def test_the_architecture_page_names_every_module_of_both_packages():
    text = (layering.PACKAGE_DIR.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [m for m in MODULES if f"`{m.split('.')[-1]}`" not in text and f"{m.split('.')[-1]}.py" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"
