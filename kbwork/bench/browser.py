"""JupyterLab in headless Chromium: what the browser test and the panel benchmark share.

:func:`jupyter_lab` starts JupyterLab on 127.0.0.1 (a free port, no token, a throw-away HOME and
Jupyter dirs) serving one directory; :func:`chromium_page` drives Debian's ``chromium`` through the
Python ``playwright`` package (its own browser download is not used); :func:`run_all` opens a
notebook and runs all its cells once the kernel is idle. Kernels inherit this process's environment,
``PYTHONPATH`` included, so they import the same kbwork.

Needs ``chromium`` (``apt-get install chromium``), ``playwright`` and ``jupyterlab`` (the ``test``
extra); :func:`missing_prerequisites` says which are absent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import KbworkError

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SERVER_START_TIMEOUT = 120   # s, JupyterLab up and answering /api/status
KERNEL_IDLE_TIMEOUT = 240    # s, kernel start on a 2-core machine

# kernel connected and idle: the toolbar indicator and the status bar ("Python 3 (ipykernel) | Idle")
KERNEL_IDLE_JS = r"""() => {
    const ind = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
    const items = Array.from(document.querySelectorAll('.jp-StatusBar-TextItem'));
    return !!ind && ind.dataset.status === 'idle' && items.some(e => /\|\s*Idle\s*$/.test(e.textContent));
}"""
#: Any stderr output in a notebook (a traceback, a warning).
ERROR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'


class BrowserError(KbworkError, RuntimeError):
    """JupyterLab or Chromium could not be started or driven (the message has the log's tail)."""


# --- prerequisites ---------------------------------------------------------------------------------
def chromium_executable() -> str | None:
    """Debian's chromium on PATH, or the executable named by ``KBWORK_CHROMIUM``."""
    override = os.environ.get("KBWORK_CHROMIUM")
    if override:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("chromium")


def missing_prerequisites() -> list[str]:
    """What is missing to drive JupyterLab in Chromium, each with how to install it (empty: nothing)."""
    missing = []
    if chromium_executable() is None:
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


# --- notebooks -------------------------------------------------------------------------------------
def stripped_copy(src: Path, dst: Path) -> None:
    """Copy a notebook without outputs, execution counts or saved widget state.

    Nothing the browser then shows can come from the committed file.
    """
    nb = json.loads(src.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    nb.get("metadata", {}).pop("widgets", None)
    dst.write_text(json.dumps(nb, indent=1), encoding="utf-8")


def write_notebook(path: Path, cells: list[str]) -> None:
    """A minimal nbformat-4 notebook of code cells (Python 3 kernel)."""
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"cell{i}", "metadata": {}, "execution_count": None,
                     "outputs": [], "source": src} for i, src in enumerate(cells)]}
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")


# --- JupyterLab ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def tail(path: Path, n: int = 40) -> str:
    """The last ``n`` lines of a log file (or ``"(no log)"``)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _http(url: str, method: str = "GET", timeout: float = 5) -> int:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


@contextmanager
def jupyter_lab(root: Path, home: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """Run JupyterLab serving ``root`` with its HOME and Jupyter dirs under ``home``; yield (url, log path).

    The server and its kernels get this process's environment without ``MPLBACKEND``, plus ``env``;
    they are shut down on exit, whatever happens.

    Raises:
        BrowserError: the server exited or did not answer within ``SERVER_START_TIMEOUT``.
    """
    home.mkdir(parents=True, exist_ok=True)
    _write_settings(home / "lab-settings")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # kernels get the matplotlib backend a user's Jupyter gives them (inline), not a test run's Agg
    base = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env = dict(
        base,
        **(env or {}),
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
    log = home / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise BrowserError(f"JupyterLab exited with code {proc.returncode} before answering; "
                                   f"log {log}:\n{tail(log)}")
            try:
                if _http(f"{url}/api/status", timeout=2) == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise BrowserError(f"JupyterLab did not answer {url}/api/status within {SERVER_START_TIMEOUT} s; "
                                   f"log {log}:\n{tail(log)}")
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


# --- Chromium --------------------------------------------------------------------------------------
@contextmanager
def chromium_page(profile: Path, executable: str | None = None,
                  viewport: tuple[int, int] = (1400, 1000)) -> Iterator[Any]:
    """A playwright page in headless Chromium with its profile in ``profile``; closed on exit.

    Raises:
        BrowserError: Chromium could not be launched.
    """
    from playwright.sync_api import sync_playwright

    executable = executable or chromium_executable()
    with sync_playwright() as pw:
        try:
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": viewport[0], "height": viewport[1]}, timeout=60_000)
        except Exception as exc:
            raise BrowserError(f"could not launch {executable} through playwright: {exc}") from exc
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)
            yield page
        finally:
            context.close()


def run_all(page: Any, url: str, notebook: str, idle_timeout: float = KERNEL_IDLE_TIMEOUT) -> None:
    """Open ``notebook`` (a path under the server root), wait for its kernel to be idle, Run > Run All Cells.

    Returns as soon as the run is started; callers wait for what the cells show.
    """
    page.goto(f"{url}/lab/tree/{notebook}", wait_until="domcontentloaded")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible", timeout=120_000)
    # running before the kernel and the widget manager are connected risks a widget race
    page.wait_for_function(KERNEL_IDLE_JS, timeout=idle_timeout * 1000, polling=250)
    page.locator(".jp-NotebookPanel .jp-Notebook").first.click()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def wait_for_text(page: Any, locator: Any, word: str, timeout_s: float) -> str:
    """Poll ``locator`` (its first match) until its text contains ``word``; return the text.

    Fails fast on a traceback in the notebook or a widget that did not render.

    Raises:
        AssertionError: a cell raised, a widget broke, or ``word`` did not show within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    text = None
    while True:
        if locator.count():
            text = locator.first.inner_text()
            if word in text:
                return text
        errors = page.locator(ERROR_OUTPUT, has_text="Traceback")
        if errors.count():
            raise AssertionError("a notebook cell raised:\n" + errors.first.inner_text()[-3000:])
        broken = page.get_by_text("Error displaying widget")
        if broken.count():
            raise AssertionError("the widget did not render: " + broken.first.inner_text())
        if time.monotonic() > deadline:
            raise AssertionError(f"{word!r} did not show within {timeout_s} s; text: "
                                 f"{text if text is not None else '(no such element on the page)'}")
        page.wait_for_timeout(200)
