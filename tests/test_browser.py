"""End to end: JupyterLab in headless Chromium runs notebooks/03_calibration.ipynb and the FIXED slider works.

Starts JupyterLab on 127.0.0.1 (a free port, no token, a throw-away HOME and Jupyter dirs) serving a
*copy* of the notebook with its saved outputs and widget state removed (so nothing in the browser can
come from the committed file, and nothing is ever saved back into it), drives Debian's ``chromium``
with the Python ``playwright`` package (its own browser download is not used), runs all cells, checks
the panel's summary says PASS, moves the FIXED slider to 0 with the keyboard and waits for the ratio
to change to the closed form at FIXED 0 and the verdict to FAIL.

Run it alone with ``python -m pytest -m browser``. Needs ``chromium`` (``apt-get install chromium``;
``.ci/run`` installs it), ``playwright`` (the ``test`` extra) and ``jupyterlab``. Without them the
test is skipped, except under CI (``CI`` set) where it fails and says what is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "03_calibration.ipynb"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SERVER_START_TIMEOUT = 120   # s, JupyterLab up and answering /api/status
LIVE_PANEL_TIMEOUT = 240     # s, kernel start + imports + the panel cell (2-core CI machine)
UPDATE_TIMEOUT = 240         # s, the slider change waits for the rest of Run All in the kernel queue
RATIO_RE = re.compile(r"dispatch ratio opt3/opt2 = ([0-9.]+) \(closed form ([0-9.]+)\); "
                      r"gate opt3 > 2 x opt2: (PASS|FAIL)")

# kernel connected and idle: the toolbar indicator and the status bar ("Python 3 (ipykernel) | Idle")
KERNEL_IDLE_JS = r"""() => {
    const ind = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
    const items = Array.from(document.querySelectorAll('.jp-StatusBar-TextItem'));
    return !!ind && ind.dataset.status === 'idle' && items.some(e => /\|\s*Idle\s*$/.test(e.textContent));
}"""
ERROR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'


# --- prerequisites ---------------------------------------------------------------------------------
def _chromium() -> str | None:
    """Debian's chromium on PATH, or the executable named by ``KBWORK_CHROMIUM``."""
    override = os.environ.get("KBWORK_CHROMIUM")
    if override:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("chromium")


def _missing_prerequisites() -> list[str]:
    missing = []
    if _chromium() is None:
        missing.append("Debian's chromium (install: apt-get install -y chromium; "
                       "or point KBWORK_CHROMIUM at a Chromium executable)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append('the Python package playwright (install: pip install -e ".[test]")')
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        missing.append('jupyterlab (install: pip install -e ".[test]")')
    return missing


@pytest.fixture(scope="module")
def chromium_path() -> str:
    missing = _missing_prerequisites()
    if missing:
        msg = "browser test needs " + "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"{msg} (CI is set, so this is an error, not a skip; .ci/run should install them)",
                        pytrace=False)
        pytest.skip(msg)
    return _chromium()


# --- JupyterLab ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stripped_copy(src: Path, dst: Path) -> None:
    """The notebook without outputs, execution counts or saved widget state."""
    nb = json.loads(src.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    nb.get("metadata", {}).pop("widgets", None)
    dst.write_text(json.dumps(nb, indent=1), encoding="utf-8")


def _write_settings(settings: Path) -> None:
    """Lab user settings: no news/update checks (closed network), every cell rendered."""
    for rel, value in {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value), encoding="utf-8")


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _http(url: str, method: str = "GET", timeout: float = 5) -> int:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium_path):
    """A running JupyterLab serving a stripped copy of 03_calibration.ipynb; yields (base_url, log path)."""
    base = tmp_path_factory.mktemp("lab")
    home, root = base / "home", base / "root"
    for d in (home, root):
        d.mkdir()
    _stripped_copy(NOTEBOOK, root / NOTEBOOK.name)
    _write_settings(home / "lab-settings")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        HOME=str(home),
        JUPYTER_CONFIG_DIR=str(home / "jupyter-config"),
        JUPYTER_DATA_DIR=str(home / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(home / "jupyter-runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"),
        IPYTHONDIR=str(home / "ipython"),
        MPLCONFIGDIR=str(home / "mpl"),
        JUPYTER_PLATFORM_DIRS="1",
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
        "--ServerApp.disable_check_xsrf=True", "--allow-root",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    log = base / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {proc.returncode} before answering; "
                            f"log {log}:\n{_tail(log)}", pytrace=False)
            try:
                if _http(f"{url}/api/status", timeout=2) == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer {url}/api/status within {SERVER_START_TIMEOUT} s; "
                            f"log {log}:\n{_tail(log)}", pytrace=False)
            time.sleep(0.5)
        yield url, log
    finally:
        _stop(proc, url)


def _stop(proc: subprocess.Popen, url: str) -> None:
    """Ask the server to shut down (it shuts its kernels down), then SIGTERM, then SIGKILL, all bounded."""
    if proc.poll() is None:
        try:
            _http(f"{url}/api/shutdown", method="POST", timeout=5)
        except (urllib.error.URLError, OSError):
            pass
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            pass
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)    # the server's own process group (start_new_session=True)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


# --- the test --------------------------------------------------------------------------------------
def _expected_texts() -> tuple[str, str]:
    """What the panel must show at FIXED 40 and after FIXED -> 0, from the same logic without a browser."""
    from kbwork.widgets import CalibrationPanel

    panel = CalibrationPanel(kv_len=4096, tile=128, group=8, draw=False)
    before = panel.ratio_text()
    panel.update(fixed=0)
    return before, panel.ratio_text()


def _wait_summary(page, word: str, timeout_s: float) -> str:
    """Poll the panel's summary until it contains ``word``; fail fast on a traceback or a broken widget."""
    summary = page.locator(".kbwork-summary")
    deadline = time.monotonic() + timeout_s
    text = None
    while True:
        if summary.count():
            text = summary.first.inner_text()
            if word in text:
                return text
        errors = page.locator(ERROR_OUTPUT, has_text="Traceback")
        if errors.count():
            raise AssertionError("a notebook cell raised:\n" + errors.first.inner_text()[-3000:])
        broken = page.get_by_text("Error displaying widget")
        if broken.count():
            raise AssertionError("the widget did not render: " + broken.first.inner_text())
        if time.monotonic() > deadline:
            raise AssertionError(f"the panel summary did not show {word!r} within {timeout_s} s; "
                                 f"summary text: {text if text is not None else '(no .kbwork-summary on the page)'}")
        page.wait_for_timeout(500)


def _ratio(text: str) -> re.Match:
    m = RATIO_RE.search(text)
    assert m, f"no ratio line in the summary text {text!r}"
    return m


def test_calibration_notebook_fixed_slider_changes_ratio(lab, chromium_path, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, log = lab
    expected_before, expected_after = _expected_texts()
    assert "PASS" in expected_before and "FAIL" in expected_after
    shot = tmp_path / "failure.png"
    with sync_playwright() as pw:
        try:
            context = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=chromium_path, headless=True,
                args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000}, timeout=60_000)
        except Exception as exc:
            raise AssertionError(f"could not launch {chromium_path} through playwright: {exc}") from exc
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)
            try:
                step = "opening the notebook"
                page.goto(f"{url}/lab/tree/{NOTEBOOK.name}", wait_until="domcontentloaded")
                page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible", timeout=120_000)
                # the copy carries no outputs: any panel on screen is live from this kernel
                assert page.locator(".kbwork-summary").count() == 0, "a stale panel is on screen before running"

                step = "waiting for the kernel to be idle"
                # (running before the kernel and the widget manager are connected risks a widget race)
                page.wait_for_function(KERNEL_IDLE_JS, timeout=LIVE_PANEL_TIMEOUT * 1000, polling=250)

                step = "Run > Run All Cells"
                page.locator(".jp-NotebookPanel .jp-Notebook").first.click()
                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

                step = "waiting for the live panel to say PASS"
                first = _ratio(_wait_summary(page, "PASS", LIVE_PANEL_TIMEOUT))
                assert first.group(0) == expected_before, (first.group(0), expected_before)

                step = "moving FIXED to 0 (Home on the slider handle)"
                handle = page.locator(".kbwork-fixed .noUi-handle")
                expect(handle).to_have_attribute("aria-valuenow", re.compile(r"^40(\.0+)?$"))
                handle.scroll_into_view_if_needed()
                handle.focus()
                handle.press("Home")
                expect(page.locator(".kbwork-fixed .widget-readout")).to_have_text("0")

                step = "waiting for the ratio to change and the gate to FAIL"
                second = _ratio(_wait_summary(page, "FAIL", UPDATE_TIMEOUT))
                assert second.group(1) != first.group(1), (first.group(0), second.group(0))
                assert second.group(1) == "1.087" and second.group(2) == "1.087", second.group(0)
                assert second.group(0) == expected_after, (second.group(0), expected_after)
            except Exception as exc:
                try:
                    page.screenshot(path=str(shot), full_page=True)
                    where = f"screenshot {shot}"
                except Exception as shot_exc:  # noqa: BLE001 - the browser itself may be gone
                    where = f"no screenshot ({shot_exc!r})"
                raise AssertionError(f"browser test failed while {step}: {exc}\n{where}\n"
                                     f"JupyterLab log {log}:\n{_tail(log, 25)}") from exc
        finally:
            context.close()
