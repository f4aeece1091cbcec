"""How long a slider move in the calibration panel takes, end to end, in a real browser.

``kbwork bench --suite panel`` starts JupyterLab (:mod:`kbwork.bench.browser`), runs a one-cell
notebook that shows a :class:`~kbwork.widgets.CalibrationPanel` at kv length 32k, and moves the FIXED
slider one step at a time with the keyboard. Each move is timed inside the page, from the
``keydown`` on the slider handle to the first animation frame after both the summary text has
changed and the figure image has its new picture decoded. After a first, untimed move (it warms
the kernel's caches), the moves run in passes; the figure is the lowest pass median, as in the
decode benchmark (a slowdown lasting seconds on a shared machine spoils one pass, not the figure).
In this process it also times :meth:`CalibrationPanel.update` without a browser, split into
simulation, drawing and PNG.

This is a benchmark, not a test: it prints figures and asserts nothing about speed.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import browser

PANEL_CELL = ("from kbwork.widgets import CalibrationPanel\n"
              "panel = CalibrationPanel(kv_len={kv_len}, tile=128, group=8)\n"
              "panel")
FIXED_HANDLE = ".kbwork-fixed .noUi-handle"
LOAD_TIMEOUT = 300   # s, kernel start, imports and the first panel on a loaded 2-core machine
MOVE_TIMEOUT = 60    # s, one move

# Arms one measurement in the page: t0 at the keydown on the slider handle; done at the first frame
# after the summary text differs from now and the figure <img> shows a new, decoded picture. Works
# whether the figure is refreshed in place (same <img>, new src) or replaced by a new element.
_ARM_JS = r"""(handleSelector) => {
    const summary = () => document.querySelector('.kbwork-summary');
    const root = summary().parentElement;
    const image = () => {
        const fig = root.querySelector('.kbwork-figure');
        return fig ? (fig.tagName === 'IMG' ? fig : fig.querySelector('img')) : root.querySelector('img');
    };
    const st = window.__kbMove = {t0: null, textAt: null, imageAt: null, done: null, text: null};
    const oldText = summary().innerText;
    const oldSrc = image() ? image().src : null;
    let decodingEl = null, decodingSrc = null, painting = false;
    const finish = () => {
        if (painting || st.textAt === null || st.imageAt === null) return;
        painting = true;
        requestAnimationFrame(() => { st.done = performance.now(); st.text = summary().innerText; obs.disconnect(); });
    };
    const check = () => {
        if (st.textAt === null && summary().innerText !== oldText) st.textAt = performance.now();
        const img = image();
        // an <img> may be rendered and replaced again before it decodes: decode whichever is current
        if (st.imageAt === null && img && img.src && img.src !== oldSrc
                && (img !== decodingEl || img.src !== decodingSrc)) {
            const src = decodingSrc = img.src;
            decodingEl = img;
            img.decode().then(() => {
                if (img.isConnected && img.src === src && st.imageAt === null) {
                    st.imageAt = performance.now();
                    finish();
                }
            }, () => { decodingEl = null; setTimeout(check, 20); });  // detached or not ready: look again
        }
        finish();
    };
    const obs = new MutationObserver(check);
    obs.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true,
                                attributeFilter: ['src']});
    document.querySelector(handleSelector).addEventListener(
        'keydown', () => { st.t0 = performance.now(); }, {capture: true, once: true});
}"""


def browser_latency(kv_len: int = 32768, moves: int = 9, passes: int = 2,
                    server_env: dict[str, str] | None = None, screenshot: Path | None = None) -> dict[str, Any]:
    """End-to-end latency (ms) of one-step FIXED slider moves at ``kv_len``, in JupyterLab in Chromium.

    Args:
        kv_len: the panel's kv length.
        moves, passes: ``passes`` runs of ``moves`` timed moves each (FIXED 38, 37, ...), after an
            untimed first move from the default 40 to 39 that warms the kernel's caches.
        server_env: extra environment for JupyterLab and its kernel (e.g. another ``PYTHONPATH``
            to time another checkout of kbwork).
        screenshot: where to save a PNG of the page after the last move.

    Returns:
        ``{"kv_len", "median_ms" (the lowest pass median), "text_ms" (the same, to the summary text
        alone), "pass_medians_ms", "moves_ms" (every timed move, in order), "summary" (the last
        summary text)}``.

    Raises:
        BrowserError: JupyterLab or Chromium could not be started, or is not installed.
        AssertionError: the panel did not appear or a move did not finish within ``MOVE_TIMEOUT``.
    """
    missing = browser.missing_prerequisites()
    if missing:
        raise browser.BrowserError("the panel benchmark needs " + "; ".join(missing))
    with tempfile.TemporaryDirectory(prefix="kbwork-panel-bench-") as tmp:
        tmp = Path(tmp)
        root = tmp / "root"
        root.mkdir()
        browser.write_notebook(root / "panel.ipynb", [PANEL_CELL.format(kv_len=kv_len)])
        with browser.jupyter_lab(root, tmp / "home", env=server_env) as (url, _log):
            with browser.chromium_page(tmp / "profile") as page:
                return _measure(page, url, kv_len, moves, passes, screenshot)


def _measure(page: Any, url: str, kv_len: int, moves: int, passes: int, screenshot: Path | None) -> dict[str, Any]:
    browser.run_all(page, url, "panel.ipynb")
    browser.wait_for_text(page, page.locator(".kbwork-summary"), "gate", LOAD_TIMEOUT)
    page.wait_for_function(browser.KERNEL_IDLE_JS, timeout=LOAD_TIMEOUT * 1000, polling=250)
    handle = page.locator(FIXED_HANDLE)
    handle.scroll_into_view_if_needed()
    handle.focus()
    totals, texts, summary = [], [], ""
    for i in range(moves * passes + 1):
        page.evaluate(_ARM_JS, FIXED_HANDLE)
        handle.press("ArrowLeft")
        try:
            page.wait_for_function("() => window.__kbMove.done !== null", timeout=MOVE_TIMEOUT * 1000,
                                   polling=50)
        except Exception as exc:  # playwright's TimeoutError: say how far the move got
            raise AssertionError(f"move {i + 1} did not finish within {MOVE_TIMEOUT} s: "
                                 f"{page.evaluate('() => window.__kbMove')}") from exc
        st = page.evaluate("() => window.__kbMove")
        summary = st["text"]
        if i:  # the first move warms the kernel (plan templates, fonts) and is not counted
            totals.append(st["done"] - st["t0"])
            texts.append(st["textAt"] - st["t0"])
        page.wait_for_timeout(300)  # the kernel settles between moves: each move is a move on its own
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    medians = [statistics.median(totals[k * moves:(k + 1) * moves]) for k in range(passes)]
    text_medians = [statistics.median(texts[k * moves:(k + 1) * moves]) for k in range(passes)]
    return {"kv_len": kv_len, "median_ms": round(min(medians), 1), "text_ms": round(min(text_medians), 1),
            "pass_medians_ms": [round(m, 1) for m in medians], "moves_ms": [round(t, 1) for t in totals],
            "summary": summary}


def kernel_latency(kv_len: int = 32768, moves: int = 9, passes: int = 2) -> dict[str, Any]:
    """:meth:`CalibrationPanel.update` (ms) for one-step FIXED moves with its widgets built, no browser.

    Each figure is the lowest pass median: ``update_ms`` the whole call, ``simulate_ms``,
    ``draw_ms`` and ``png_ms`` its parts (the panel's :attr:`~kbwork.widgets.CalibrationPanel.timings`).
    """
    from ..widgets import CalibrationPanel

    panel = CalibrationPanel(kv_len=kv_len)
    panel.widget()  # the image and summary widgets are what a move refreshes
    panel.update(fixed=panel.values["fixed"] - 1)  # warm
    passes_of: list[dict[str, float]] = []
    for _ in range(passes):
        times: dict[str, list[float]] = {"update": [], "simulate": [], "draw": [], "png": []}
        for _ in range(moves):
            t0 = time.perf_counter()
            panel.update(fixed=panel.values["fixed"] - 1)
            times["update"].append(time.perf_counter() - t0)
            for part in ("simulate", "draw", "png"):
                times[part].append(panel.timings[part])
        passes_of.append({k: statistics.median(v) * 1e3 for k, v in times.items()})
    return {f"{k}_ms": round(min(p[k] for p in passes_of), 1) for k in ("update", "simulate", "draw", "png")}


def main(kv_lens: list[int], moves: int, passes: int, out: Path | None) -> int:
    """Print (and with ``out`` write ``panel.json`` into) both latencies for each kv length; 0 on success.

    Raises:
        BrowserError: JupyterLab or Chromium could not be started, or is not installed.
    """
    import json
    import platform

    from .. import atomic

    rows = []
    for kv in kv_lens:
        row = {"kv_len": kv, **kernel_latency(kv, moves, passes), **browser_latency(kv, moves, passes)}
        rows.append(row)
        print(f"kv_len {kv}: a FIXED slider move takes {row['median_ms']} ms from the keypress to the new figure "
              f"(summary text: {row['text_ms']} ms; lowest of {passes} pass medians {row['pass_medians_ms']}, "
              f"{moves} moves each).\n  In the kernel, update() takes {row['update_ms']} ms: simulation "
              f"{row['simulate_ms']} ms, figure {row['draw_ms']} ms, PNG {row['png_ms']} ms.")
    if out is not None:
        result = {"rows": rows, "machine": {"python": platform.python_version(), "platform": platform.platform(),
                                            "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out / "panel.json", json.dumps(result, indent=1))
        print(f"\nwrote {out / 'panel.json'}")
    return 0
