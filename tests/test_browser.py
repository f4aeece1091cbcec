"""End to end: JupyterLab in headless Chromium runs notebooks/03_calibration.ipynb and its panels work.

Starts JupyterLab (``kbwork.bench.browser``, shared with the panel benchmark) serving a *copy* of the
notebook with its saved outputs and widget state removed (so nothing in the browser can come from the
committed file, and nothing is ever saved back into it), drives Debian's ``chromium`` with the Python
``playwright`` package (its own browser download is not used) and runs all cells. Then, with the
keyboard on the sliders: FIXED 40 -> 0 changes the ratio to the closed form at FIXED 0 and the gate to
FAIL, and the figure changes in place (the same ``<img>``, a new picture); R -> 0 as well gives
"ratio undefined" and FAIL with no error anywhere in the notebook; the three-variant panel shows a1 and
the gate report and follows its own FIXED slider. Behaviour only: nothing here is timed (the
benchmark, ``kbwork bench --suite panel``, times slider moves).

Run it alone with ``python -m pytest -m browser``. Needs ``chromium`` (``apt-get install chromium``;
``.ci/run`` installs it), ``playwright`` (the ``test`` extra) and ``jupyterlab``. Without them the
test is skipped, except under CI (``CI`` set) where it fails and says what is missing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kbwork.bench import browser

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "03_calibration.ipynb"
LIVE_PANEL_TIMEOUT = 240     # s, kernel start + imports + the panel cells (2-core CI machine)
UPDATE_TIMEOUT = 240         # s, the first slider change waits for the rest of Run All in the kernel queue
MOVE_TIMEOUT = 120           # s, a later slider change
RATIO_RE = re.compile(r"dispatch ratio opt3/opt2 = ([0-9.]+) \(closed form ([0-9.]+)\); "
                      r"gate opt3 > 2 x opt2: (PASS|FAIL)")

# The panel's figure <img>: marked once, so a later look can tell the same element from a new one.
MARK_FIGURE_JS = "(img) => { img.__kbworkMark = true; return img.src; }"
FIGURE_STATE_JS = "(img) => [img.isConnected && img.__kbworkMark === true, img.src, img.naturalWidth]"


@pytest.fixture(scope="module")
def chromium_path() -> str:
    missing = browser.missing_prerequisites()
    if missing:
        msg = "browser test needs " + "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"{msg} (CI is set, so this is an error, not a skip; .ci/run should install them)",
                        pytrace=False)
        pytest.skip(msg)
    return browser.chromium_executable()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium_path):
    """A running JupyterLab serving a stripped copy of 03_calibration.ipynb; yields (base_url, log path)."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    browser.stripped_copy(NOTEBOOK, root / NOTEBOOK.name)
    try:
        with browser.jupyter_lab(root, base / "home") as (url, log):
            yield url, log
    except browser.BrowserError as exc:  # the server did not start: say why, without a traceback
        pytest.fail(str(exc), pytrace=False)


def _expected_texts() -> tuple[str, str]:
    """What the panel must show at FIXED 40 and after FIXED -> 0, from the same logic without a browser."""
    from kbwork.widgets import CalibrationPanel

    panel = CalibrationPanel(kv_len=4096, tile=128, group=8, draw=False)
    before = panel.ratio_text()
    panel.update(fixed=0)
    return before, panel.ratio_text()


def _ratio(text: str) -> re.Match:
    m = RATIO_RE.search(text)
    assert m, f"no ratio line in the summary text {text!r}"
    return m


def _press(panel, control: str, key: str, readout: str) -> None:
    """Focus ``control``'s slider handle in ``panel`` and press ``key``; wait for the readout to agree."""
    from playwright.sync_api import expect

    handle = panel.locator(f".kbwork-{control} .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    handle.press(key)
    expect(panel.locator(f".kbwork-{control} .widget-readout")).to_have_text(readout)


def _wait_new_figure(page, figure, old_src: str) -> None:
    """Wait until the marked figure <img> shows a picture other than ``old_src``; it must be the same element."""
    page.wait_for_function(
        "([img, old]) => !img.isConnected || (img.src !== old && img.complete && img.naturalWidth > 0)",
        arg=[figure.element_handle(), old_src], timeout=MOVE_TIMEOUT * 1000, polling=100)
    same, src, width = figure.evaluate(FIGURE_STATE_JS)
    assert same, "the figure <img> was replaced; the panel should refresh the one it has"
    assert src != old_src and width > 0


def test_calibration_notebook_panels_in_the_browser(lab, chromium_path, tmp_path):
    url, log = lab
    expected_before, expected_after = _expected_texts()
    assert "PASS" in expected_before and "FAIL" in expected_after
    shot = tmp_path / "failure.png"
    with browser.chromium_page(tmp_path / "chromium-profile", chromium_path) as page:
        try:
            step = "opening the notebook and running all cells"
            browser.run_all(page, url, NOTEBOOK.name, idle_timeout=LIVE_PANEL_TIMEOUT)
            # the copy carries no outputs: any panel on screen is live from this kernel
            panels = page.locator(".kbwork-panel")
            first, three = panels.nth(0), panels.nth(1)

            step = "waiting for the live panel to say PASS"
            summary = first.locator(".kbwork-summary")
            got = _ratio(browser.wait_for_text(page, summary, "PASS", LIVE_PANEL_TIMEOUT))
            assert got.group(0) == expected_before, (got.group(0), expected_before)
            figure = first.locator("img.kbwork-figure")
            old_src = figure.evaluate(MARK_FIGURE_JS)
            assert old_src, "the panel shows no figure"

            step = "moving FIXED to 0 (Home on the slider handle)"
            _press(first, "fixed", "Home", "0")

            step = "waiting for the ratio to change and the gate to FAIL"
            got = _ratio(browser.wait_for_text(page, summary, "gate opt3 > 2 x opt2: FAIL", UPDATE_TIMEOUT))
            assert got.group(1) == "1.087" and got.group(2) == "1.087", got.group(0)
            assert got.group(0) == expected_after, (got.group(0), expected_after)

            step = "waiting for the same figure element to show the new picture"
            _wait_new_figure(page, figure, old_src)
            old_src = figure.evaluate("(img) => img.src")

            step = "moving R to 0 as well: every dispatch costs 0"
            _press(first, "r", "Home", "0.0000")
            text = browser.wait_for_text(page, summary, "ratio undefined", MOVE_TIMEOUT)
            assert "gate opt3 > 2 x opt2: FAIL" in text and "FIXED 0 cycles, R 0 cycles/byte" in text, text
            _wait_new_figure(page, figure, old_src)
            assert first.locator(".kbwork-message").inner_text().strip() == ""

            step = "the three-variant panel"
            summary3 = three.locator(".kbwork-summary")
            text = browser.wait_for_text(page, summary3, "PASS", MOVE_TIMEOUT)
            for part in ("a1 ", "a1 > 2 x opt2", "opt3 > 2 x a1", "dispatch ratio opt3/opt2 = 4.126"):
                assert part in text, (part, text)
            figure3 = three.locator("img.kbwork-figure")
            old_src = figure3.evaluate(MARK_FIGURE_JS)
            _press(three, "fixed", "Home", "0")
            text = browser.wait_for_text(page, summary3, "gate opt3 > 2 x opt2: FAIL", MOVE_TIMEOUT)
            assert "dispatch ratio opt3/opt2 = 1.087" in text and "FIXED 0 cycles" in text, text
            _wait_new_figure(page, figure3, old_src)

            step = "checking that nothing went wrong anywhere in the notebook"
            errors = page.locator(browser.ERROR_OUTPUT)
            assert errors.count() == 0, "error output in the notebook:\n" + errors.first.inner_text()[-3000:]
            assert all(m.strip() == "" for m in page.locator(".kbwork-message").all_inner_texts())
        except Exception as exc:
            try:
                page.screenshot(path=str(shot), full_page=True)
                where = f"screenshot {shot}"
            except Exception as shot_exc:  # noqa: BLE001 - the browser itself may be gone
                where = f"no screenshot ({shot_exc!r})"
            raise AssertionError(f"browser test failed while {step}: {exc}\n{where}\n"
                                 f"JupyterLab log {log}:\n{browser.tail(log, 25)}") from exc
