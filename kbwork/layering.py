"""The layering rule as a check: the PE side imports nothing from above it and names no recipe.

DESIGN.md §3 (D6.5) and §9: ``kbwork/pe/`` (the hardware: commands, op
table, tiling, scheduler, engines, timeline) never imports the compiler side
(``triton_emu/``) or anything built on it, and knows nothing of recipes — no
registered recipe's name, no ``RECIPE_DESCRIPTORS``, no ``tl_recipes`` appears
in its source. A new recipe is a descriptor on the compiler side; if it needed
a scheduler change, this check is where it would show.

``tests/test_layering.py`` asserts it; a notebook can print :func:`check_pe`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

#: The ``kbwork/pe`` package directory.
PE_DIR = Path(__file__).resolve().parent / "pe"
#: What ``kbwork/pe`` may not import: the compiler side and everything built on it.
FORBIDDEN = ("kbwork.triton_emu", "kbwork.kernels", "kbwork.decode", "kbwork.plots", "kbwork.widgets",
             "kbwork.cli", "kbwork.sim")


def pe_files() -> list[Path]:
    """Every Python file of ``kbwork/pe``, sorted by name."""
    return sorted(PE_DIR.glob("*.py"))


def imported_modules(path: Path, package: str = "kbwork.pe") -> list[str]:
    """Every module ``path`` imports, relative imports resolved against ``package``.

    ``from .. import sim`` counts as importing ``kbwork.sim``: each name of a
    ``from`` import is listed as ``module.name`` too.
    """
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
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
            out += [f"{mod}.{alias.name}" for alias in node.names]
    return out


def forbidden_prefix(module: str) -> str | None:
    """The entry of :data:`FORBIDDEN` that ``module`` is or lies under, else ``None``."""
    for f in FORBIDDEN:
        if module == f or module.startswith(f + "."):
            return f
    return None


def forbidden_imports(path: Path) -> list[str]:
    """The modules ``path`` imports that ``kbwork/pe`` may not."""
    return [m for m in imported_modules(path) if forbidden_prefix(m)]


def recipe_words() -> tuple[str, ...]:
    """What the PE side may not name: every registered recipe, ``RECIPE_DESCRIPTORS`` and ``tl_recipes``."""
    from .triton_emu.tl_recipes import RECIPE_DESCRIPTORS

    return (*RECIPE_DESCRIPTORS, "RECIPE_DESCRIPTORS", "tl_recipes")


def recipe_mentions(path: Path) -> list[str]:
    """The words of :func:`recipe_words` that appear anywhere in ``path``'s source (comments included)."""
    text = Path(path).read_text(encoding="utf-8")
    return [w for w in recipe_words() if w in text]


def check_pe() -> pd.DataFrame:
    """The layering check of every file of ``kbwork/pe``.

    Returns:
        One row per file: ``file``, ``forbidden_imports`` and
        ``recipe_mentions`` (comma-separated, empty when clean) and ``ok``.
    """
    rows = []
    for p in pe_files():
        bad, named = forbidden_imports(p), recipe_mentions(p)
        rows.append({"file": f"kbwork/pe/{p.name}", "forbidden_imports": ", ".join(bad),
                     "recipe_mentions": ", ".join(named), "ok": not bad and not named})
    return pd.DataFrame(rows)
