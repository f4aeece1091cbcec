"""The PE side never imports the compiler side or anything above it (DESIGN §3 D6.5, §9)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kbwork

PKG = Path(kbwork.__file__).resolve().parent
PE_FILES = sorted((PKG / "pe").glob("*.py"))
FORBIDDEN = ("kbwork.triton_emu", "kbwork.kernels", "kbwork.decode", "kbwork.plots", "kbwork.widgets",
             "kbwork.cli", "kbwork.sim")


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, relative imports resolved against its package (``kbwork.pe``)."""
    package = "kbwork.pe"  # every file in kbwork/pe (including __init__) resolves relative imports here
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.append(mod)
            out += [f"{mod}.{alias.name}" for alias in node.names]  # `from .. import sim` imports kbwork.sim
    return out


def _is_forbidden(mod: str) -> str | None:
    for f in FORBIDDEN:
        if mod == f or mod.startswith(f + "."):
            return f
    return None


def test_the_pe_package_has_the_expected_modules():
    names = {p.stem for p in PE_FILES}
    assert {"commands", "ops", "stages", "engines", "tiling", "scheduler", "timeline"} <= names


@pytest.mark.parametrize("path", PE_FILES, ids=lambda p: p.name)
def test_pe_imports_nothing_from_above(path):
    bad = [m for m in imported_modules(path) if _is_forbidden(m)]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", PE_FILES, ids=lambda p: p.name)
def test_pe_is_recipe_free(path):
    from kbwork.triton_emu.tl_recipes import RECIPE_DESCRIPTORS

    text = path.read_text()
    for name in RECIPE_DESCRIPTORS:  # every registered recipe, not just the first one
        assert name not in text, f"{path.name} names recipe {name!r}"
    assert "RECIPE_DESCRIPTORS" not in text
    assert "tl_recipes" not in text


def test_the_import_checker_catches_both_import_forms(tmp_path):
    """The checker must see absolute imports, relative imports and `from .. import module`."""
    cases = {
        "import kbwork.triton_emu.tl_context\n": "kbwork.triton_emu",
        "from kbwork.kernels import gemm\n": "kbwork.kernels",
        "from ..triton_emu.tl_recipes import RECIPE_DESCRIPTORS\n": "kbwork.triton_emu",
        "from .. import sim\n": "kbwork.sim",
        "from ..cli import main\n": "kbwork.cli",
        "def f():\n    from ..decode import run\n": "kbwork.decode",
    }
    for src, want in cases.items():
        p = tmp_path / "mod.py"
        p.write_text(src)
        assert want in {_is_forbidden(m) for m in imported_modules(p)}, src
    ok = tmp_path / "ok.py"
    ok.write_text("from ..memory import Handle\nfrom .commands import OpSpec\nfrom ..errors import ValidationError\n"
                  "import numpy as np\n")
    assert not [m for m in imported_modules(ok) if _is_forbidden(m)]
    assert "kbwork.memory" in imported_modules(ok) and "kbwork.pe.commands" in imported_modules(ok)
