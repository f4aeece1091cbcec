"""The layering rule as a check: every module imports only from its own rank or lower ones.

DESIGN.md §9: the folders show the pipeline, and imports flow down it. The
ranks, lowest first, are :data:`RANKS`; a module's rank is the rank of the
top-level module or package it belongs to (``kbwork/analysis/channels.py``
ranks with ``analysis``), and the package root ``kbwork/__init__.py`` ranks
with ``sim``, whose surface it re-exports. Every import counts: at module
level or inside a function, absolute (``import kbwork.decode``,
``from kbwork.decode import run``) or relative (``from ..decode import run``,
``from .. import decode``). :func:`check_package` is the verdict for the
whole package, one row per module; :func:`import_cycles` finds import
circles between top-level modules and packages (two modules of one rank may
import each other's module-level names and still form one).

The PE side has a second rule (DESIGN §3, D6.5): ``kbwork/pe/`` knows
nothing of recipes — no registered recipe's name, no ``RECIPE_DESCRIPTORS``,
no ``tl_recipes`` appears in its source. A new recipe is a descriptor on the
compiler side; if it needed a scheduler change, :func:`check_pe` is where it
would show.

``tests/test_layering.py`` asserts both; a notebook can print
:func:`check_pe` and :func:`check_package`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pandas as pd

#: The ``kbwork`` package directory.
PACKAGE_DIR = Path(__file__).resolve().parent
#: The ``kbwork/pe`` package directory.
PE_DIR = PACKAGE_DIR / "pe"

#: The ranks of DESIGN §9, lowest first: (rank name, the top-level modules and packages of ``kbwork``
#: in it). A package stands for every module under it. Where the modules DESIGN does not place sit:
#:
#: * ``symbolic`` is a foundation: ``tl.range``'s index, which ``memory`` (a foundation) slices handles
#:   with and ``pe/`` instantiates loops with; it imports only ``errors``.
#: * ``calibration`` is a foundation: it fits FIXED and R to measured tables (numbers in, numbers out,
#:   nothing simulated) and ``model/`` reads the measured tables through it.
#: * ``sweep`` is a foundation: the sweep engine behind ``decode.sweep`` and ``model.sweep`` (axes, the
#:   resumable file and its record, running the points through ``parallel``); a front end hands it the
#:   function a point runs, so it imports nothing of what it sweeps.
#: * the package root (``kbwork/__init__.py``, written ``kbwork`` here) ranks with ``sim``: it
#:   re-exports the simulator's surface (``Simulator``, ``Run``, ``Launch``, the commands, the errors),
#:   so anything above ``sim`` may use ``kbwork.Simulator`` or ``kbwork.__version__``.
#: * ``keys`` is a foundation: the key tables (every topology, host and model key's facts), which ``config``
#:   builds ``Topology`` from and ``model/`` builds ``Host`` and ``Model`` from; it imports only ``errors``.
#: * ``keydocs`` ranks with what users touch: it writes the key tables into ``docs/``.
#: * ``golden`` and ``layering`` rank with what users touch: ``golden`` runs the benches and decode to
#:   write ``data/golden/`` for ``kbwork golden``; ``layering`` reads every module's source and the
#:   recipe registry, and only tests and notebooks import it.
#: * ``cliargs`` ranks with ``decode``: the ``--variants`` type and the TCM hint that ``cli`` and
#:   ``model/cli.py`` share; the hint sizes a TCM by running decode (``decode.tcm_bytes_that_fit``).
#: * ``anchor`` ranks with ``decode``: it runs decode on the inputs of the H200's stored FlashAttention outputs
#:   (``data/measured/h200_flash_decode/``) and sets kbwork's numerics beside the GPU's (DESIGN.md §17).
#: * ``__main__``, the ``kbwork`` command's entry point, ranks above ``bench/``: it routes
#:   ``kbwork bench`` to the benchmark and every other subcommand to ``cli``.
RANKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("config", "errors", "memory", "atomic", "parallel", "symbolic", "calibration", "argtypes",
                     "sweep", "keys")),
    ("pe", ("pe",)),
    ("triton_emu", ("triton_emu",)),
    ("device", ("device",)),
    ("oplog", ("oplog",)),
    ("sim", ("sim", "kbwork")),
    ("analysis", ("analysis",)),
    ("kernels", ("kernels",)),
    ("decode", ("decode", "cliargs", "anchor")),
    ("model", ("model",)),
    ("what users touch", ("plots", "widgets", "model_panel", "cli", "golden", "layering", "keydocs")),
    ("bench", ("bench",)),
    ("entry point", ("__main__",)),
)
#: Top-level name (``"kbwork"`` for the package root) -> its rank, an index into :data:`RANKS`.
RANK_OF_NAME = {name: i for i, (_, names) in enumerate(RANKS) for name in names}


class Import(NamedTuple):
    """One import of a ``kbwork`` module by another."""

    #: the module imported (``kbwork.decode``; ``kbwork`` for a name of the package root itself)
    target: str
    #: the line of the import statement
    line: int
    #: the function (or class) the statement sits in, ``""`` at module level
    where: str

    def __str__(self) -> str:
        return f"{self.target} (line {self.line}" + (f", in {self.where})" if self.where else ")")


# --- the modules and their ranks -------------------------------------------------------------------
def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    """The dotted name of the module at ``path`` inside the package at ``root`` (``kbwork.pe.ops``;
    ``kbwork`` for ``kbwork/__init__.py``, ``kbwork.pe`` for ``kbwork/pe/__init__.py``)."""
    parts = [root.name, *Path(path).resolve().relative_to(root.resolve()).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package at ``root``: dotted name -> file, sorted by name."""
    return dict(sorted((module_name(p, root), p) for p in root.rglob("*.py") if "__pycache__" not in p.parts))


def top_level(module: str) -> str:
    """The top-level module or package ``module`` belongs to (``kbwork.pe.ops`` -> ``pe``), ``kbwork``
    for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def rank_of(module: str) -> int | None:
    """The rank of ``module`` (an index into :data:`RANKS`), or ``None`` if it has none."""
    return RANK_OF_NAME.get(top_level(module))


def rank_name(module: str) -> str:
    """The name of ``module``'s rank (``"foundations"``, ``"pe"``, ...), ``""`` if it has none."""
    r = rank_of(module)
    return "" if r is None else RANKS[r][0]


def how_to_rank(module: str) -> str:
    """What to do about a module with no rank: which table to add it to, and the ranks to choose from."""
    name = top_level(module)
    order = " < ".join(f"{rank} ({', '.join(names)})" for rank, names in RANKS)
    return (f"{module} has no rank: add {name!r} to the rank it belongs to in kbwork.layering.RANKS "
            f"(a module imports only from its own rank or lower ones; lowest first: {order}), and say "
            f"where it sits in docs/architecture.md.")


# --- the imports of a module -----------------------------------------------------------------------
def _is_package(path: Path) -> bool:
    return Path(path).name == "__init__.py"


def imports(path: Path, module: str | None = None, known: set[str] | None = None) -> list[Import]:
    """Every import of a ``kbwork`` module in the file at ``path``, at module level or in a function.

    Args:
        path: a Python file.
        module: its dotted name, against which relative imports are resolved (default: from ``path``
            inside ``kbwork/``).
        known: the modules that exist (default: those of the package), so that ``from kbwork import
            decode`` is an import of ``kbwork.decode`` and ``from kbwork import Simulator`` one of
            the package root.

    Returns:
        One :class:`Import` per imported module per statement, in source order.
    """
    path = Path(path)
    module = module_name(path) if module is None else module
    known = set(package_modules()) if known is None else known
    # the package relative imports start from: the module itself for an __init__.py, else its parent
    package = module if _is_package(path) else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == "kbwork" or alias.name.startswith("kbwork."):
                        out.append(Import(alias.name, child.lineno, where))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (child.level - 1)])
                    mod = f"{base}.{child.module}" if child.module else base
                else:
                    mod = child.module or ""
                if mod != "kbwork" and not mod.startswith("kbwork."):
                    continue
                targets = dict.fromkeys(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                                        for a in child.names)
                out.extend(Import(t, child.lineno, where) for t in targets)
            visit(child, where)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return out


def upward_imports(module: str, path: Path | None = None, known: set[str] | None = None) -> list[Import]:
    """The imports of ``module`` that break the layering: of a module ranked above it, or of one with
    no rank (every import, if ``module`` itself has none)."""
    known = set(package_modules()) if known is None else known
    path = package_modules()[module] if path is None else path
    mine = rank_of(module)
    bad = []
    for imp in imports(path, module, known):
        theirs = rank_of(imp.target)
        if mine is None or theirs is None or theirs > mine:
            bad.append(imp)
    return bad


def explain_import(module: str, imp: Import) -> str:
    """One line saying why ``imp`` of ``module`` breaks the layering, and what to do instead."""
    mine, theirs = rank_name(module) or "no rank", rank_name(imp.target) or "no rank"
    return (f"{module} (rank {mine}) imports {imp} (rank {theirs}): move the code it needs down to "
            f"{module}'s rank or below, or pass it in from above (DESIGN §9; docs/architecture.md)")


def check_package(root: Path = PACKAGE_DIR) -> pd.DataFrame:
    """The layering check of every module of the package.

    Returns:
        One row per module, sorted by name: ``module``, ``file`` (relative to the repository),
        ``rank`` (index into :data:`RANKS`, -1 when it has none), ``rank_name``,
        ``upward_imports`` (comma-separated, empty when clean) and ``ok``.
    """
    mods = package_modules(root)
    known = set(mods)
    rows = []
    for name, path in mods.items():
        bad = upward_imports(name, path, known)
        r = rank_of(name)
        rows.append({"module": name, "file": path.resolve().relative_to(root.resolve().parent).as_posix(),
                     "rank": -1 if r is None else r, "rank_name": rank_name(name),
                     "upward_imports": ", ".join(map(str, bad)), "ok": r is not None and not bad})
    return pd.DataFrame(rows)


# --- cycles between top-level modules and packages ------------------------------------------------
def top_level_imports(root: Path = PACKAGE_DIR) -> dict[tuple[str, str], list[str]]:
    """The import graph between top-level modules and packages (``pe``, ``sim``, ``kbwork`` for the
    package root, ...): (importer, imported) -> the imports that make that edge, as
    ``"module line N"``; imports inside one top-level package are left out."""
    mods = package_modules(root)
    known = set(mods)
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path in mods.items():
        for imp in imports(path, name, known):
            a, b = top_level(name), top_level(imp.target)
            if a != b:
                edges.setdefault((a, b), []).append(f"{name} line {imp.line}")
    return dict(sorted(edges.items()))


def import_cycles(edges: dict[tuple[str, str], list[str]] | None = None) -> list[list[str]]:
    """The import circles between top-level modules and packages.

    Args:
        edges: the graph (default: :func:`top_level_imports` of the package).

    Returns:
        One circle per strongly connected group of two or more nodes, written as its path
        ``[a, b, ..., a]`` (a shortest circle through the group's first node by name); empty
        when the graph has none.
    """
    edges = top_level_imports() if edges is None else edges
    succ: dict[str, list[str]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    # Tarjan's strongly connected components, iteratively (the graph is small, the order fixed)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(succ):
        if start in index:
            continue
        work = [(start, iter(sorted(succ[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        group.append(w)
                        if w == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(succ[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    cycles = []
    for group in sorted(groups):
        inside, first = set(group), group[0]
        # breadth first from the first node back to itself, inside the group
        parent: dict[str, str] = {}
        frontier = [first]
        found = None
        while frontier and found is None:
            nxt_frontier = []
            for node in frontier:
                for b in sorted(succ[node]):
                    if b not in inside:
                        continue
                    if b == first:
                        found = node
                        break
                    if b not in parent:
                        parent[b] = node
                        nxt_frontier.append(b)
                if found is not None:
                    break
            frontier = nxt_frontier
        path = [first]
        node = found
        while node != first:
            path.append(node)
            node = parent[node]
        cycles.append([first, *reversed(path[1:]), first])
    return cycles


# --- the PE side: nothing from above, no recipe ----------------------------------------------------
#: What ``kbwork/pe`` may not import: every top-level module and package ranked above it.
FORBIDDEN = tuple(f"kbwork.{name}" for names in (n for _, n in RANKS[RANK_OF_NAME["pe"] + 1:])
                  for name in names if name != "kbwork")


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
