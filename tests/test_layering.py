"""The layering of DESIGN §9: every module of the package imports only from its own rank or lower ones,
no two top-level modules or packages import each other, and the PE side imports nothing from above it
and names no recipe (DESIGN §3 D6.5). The checks live in ``kbwork.layering``, so a notebook can show
the same verdict."""

from __future__ import annotations

import re

import pytest

from kbwork import layering

PE_FILES = layering.pe_files()
MODULES = layering.package_modules()

#: Modules with an upward import this branch may not fix (another change owns the file): module ->
#: why, naming the import. Each is an expected failure, strict, so the entry must go when the import does.
EXPECTED_UPWARD: dict[str, str] = {}


def _modules(expected: dict[str, str]) -> list:
    return [pytest.param(m, id=m, marks=pytest.mark.xfail(strict=True, reason=expected[m])) if m in expected
            else pytest.param(m, id=m) for m in MODULES]


# --- the whole package -----------------------------------------------------------------------------
def test_the_ranks_are_designs_order():
    """DESIGN §9, lowest first: foundations < pe/ < triton_emu/ < device/ < oplog < sim < analysis/ <
    kernels/ < decode < model/ < plots, widgets, cli, golden < bench/."""
    r = layering.rank_of
    chain = ["kbwork.config", "kbwork.pe.ops", "kbwork.triton_emu.tl_context", "kbwork.device.loop",
             "kbwork.oplog", "kbwork.sim", "kbwork.analysis", "kbwork.kernels.gqa_decode", "kbwork.decode",
             "kbwork.model.steps", "kbwork.cli", "kbwork.bench.loops"]
    ranks = [r(m) for m in chain]
    assert None not in ranks and ranks == sorted(set(ranks)), dict(zip(chain, ranks))
    foundations = ["config", "errors", "memory", "atomic", "parallel", "symbolic", "calibration"]
    assert {r(f"kbwork.{m}") for m in foundations} == {0}
    assert {r(f"kbwork.{m}") for m in ("plots", "widgets", "cli", "golden", "layering")} == {r("kbwork.cli")}
    assert r("kbwork") == r("kbwork.sim")  # the package root re-exports the simulator's surface
    assert r("kbwork.__main__") > r("kbwork.bench")  # the command's entry point routes `kbwork bench`
    # the command lines' shared helpers run decode and serve model/'s command line: decode's rank
    assert r("kbwork.cliargs") == r("kbwork.decode") < r("kbwork.model.cli")


def test_every_ranked_name_is_a_module_or_package_and_is_ranked_once():
    names = [n for _, group in layering.RANKS for n in group]
    assert len(names) == len(set(names))
    present = {layering.top_level(m) for m in MODULES}
    assert set(names) <= present, f"ranked but not in kbwork/: {sorted(set(names) - present)}"


@pytest.mark.parametrize("module", list(MODULES))
def test_every_module_has_a_rank(module):
    assert layering.rank_of(module) is not None, layering.how_to_rank(module)


@pytest.mark.parametrize("module", _modules(EXPECTED_UPWARD))
def test_imports_flow_down_the_ranks(module):
    bad = layering.upward_imports(module)
    assert not bad, "\n".join(layering.explain_import(module, imp) for imp in bad)


def test_no_import_cycle_between_top_level_modules_and_packages():
    edges = layering.top_level_imports()
    cycles = layering.import_cycles(edges)
    lines = [" -> ".join(c) + ": " + "; ".join(f"{a} -> {b} by {', '.join(edges[a, b])}"
                                               for a, b in zip(c, c[1:])) for c in cycles]
    assert not cycles, "\n".join(lines)


def test_check_package_has_one_row_per_module():
    table = layering.check_package()
    assert list(table.columns) == ["module", "file", "rank", "rank_name", "upward_imports", "ok"]
    assert list(table["module"]) == list(MODULES)
    assert table.loc[table.module == "kbwork.analysis", "file"].item() == "kbwork/analysis/__init__.py"
    clean = table[~table.module.isin(EXPECTED_UPWARD)]
    assert clean["ok"].all(), clean[~clean.ok].to_string()


# --- the checker itself ----------------------------------------------------------------------------
def _targets(tmp_path, src, module, init=False):
    p = tmp_path / ("__init__.py" if init else "mod.py")
    p.write_text(src)
    return [imp.target for imp in layering.imports(p, module)]


def test_the_import_reader_resolves_every_form(tmp_path):
    cases = {
        "import kbwork.decode\n": ["kbwork.decode"],
        "import kbwork.kernels.gqa_decode as g\n": ["kbwork.kernels.gqa_decode"],
        "from kbwork.decode import run\n": ["kbwork.decode"],
        "from kbwork import decode, plots\n": ["kbwork.decode", "kbwork.plots"],
        "from kbwork import Simulator\n": ["kbwork"],  # a name of the package root, not a module
        "from .. import decode\n": ["kbwork.decode"],
        "from .. import __version__\n": ["kbwork"],
        "from ..decode import VARIANTS\n": ["kbwork.decode"],
        "from . import other\n": ["kbwork.analysis"],  # no module kbwork.analysis.other: the package
        "def f():\n    from ..decode import run\n": ["kbwork.decode"],
        "class C:\n    def m(self):\n        import kbwork.bench\n": ["kbwork.bench"],
        "if True:\n    from ..sim import Run\n": ["kbwork.sim"],
        "import numpy as np\nfrom pathlib import Path\n": [],
    }
    for src, want in cases.items():
        assert _targets(tmp_path, src, "kbwork.analysis.mod") == want, src
    # relative imports of a package's __init__.py start from the package itself
    assert _targets(tmp_path, "from .ops import OPS\nfrom . import ops\n", "kbwork.pe", init=True) == \
        ["kbwork.pe.ops", "kbwork.pe.ops"]


def test_the_import_reader_says_where_an_import_is(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("from ..errors import ValidationError\n\n\ndef what_if(run):\n    from .. import decode\n")
    top, inner = layering.imports(p, "kbwork.analysis.mod")
    assert (top.target, top.line, top.where) == ("kbwork.errors", 1, "")
    assert (inner.target, inner.line, inner.where) == ("kbwork.decode", 5, "what_if")
    assert str(inner) == "kbwork.decode (line 5, in what_if)"


def test_an_upward_import_is_caught_and_named(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("from ..oplog import COLUMNS\nfrom ..memory import Handle\n\n\ndef f():\n    from .. import sim\n")
    bad = layering.upward_imports("kbwork.device.mod", p)
    assert [(b.target, b.line, b.where) for b in bad] == [("kbwork.oplog", 1, ""), ("kbwork.sim", 6, "f")]
    text = layering.explain_import("kbwork.device.mod", bad[1])
    assert "kbwork.device.mod (rank device) imports kbwork.sim (line 6, in f) (rank sim)" in text
    p.write_text("from kbwork import Simulator\n")  # the package root ranks with sim
    assert [b.target for b in layering.upward_imports("kbwork.oplog", p)] == ["kbwork"]
    assert layering.upward_imports("kbwork.decode", p) == []
    p.write_text("from .. import decode, config\n")  # the same rank and lower ones are fine
    assert layering.upward_imports("kbwork.decode", p) == []


def test_a_module_without_a_rank_is_told_where_to_add_it(tmp_path):
    assert layering.rank_of("kbwork.brand_new") is None and layering.rank_of("kbwork.brand_new.part") is None
    assert layering.rank_of("kbwork.analysis.channels") == layering.rank_of("kbwork.analysis")  # a package's
    msg = layering.how_to_rank("kbwork.brand_new.part")
    assert "'brand_new'" in msg and "kbwork.layering.RANKS" in msg and "docs/architecture.md" in msg
    assert "foundations (config, errors" in msg and "< bench (bench)" in msg
    p = tmp_path / "mod.py"
    p.write_text("from .errors import ValidationError\n")
    assert [b.target for b in layering.upward_imports("kbwork.brand_new", p)] == ["kbwork.errors"]
    # and a module that imports one with no rank is told so
    p.write_text("from ..brand_new import thing\n")
    assert [b.target for b in layering.upward_imports("kbwork.bench.mod", p)] == ["kbwork.brand_new"]


def test_the_cycle_finder_names_each_circle():
    edges = {("a", "b"): ["x"], ("b", "c"): ["x"], ("c", "a"): ["x"], ("c", "d"): ["x"], ("d", "e"): ["x"],
             ("e", "d"): ["x"], ("f", "a"): ["x"]}
    assert layering.import_cycles(edges) == [["a", "b", "c", "a"], ["d", "e", "d"]]
    assert layering.import_cycles({("a", "b"): ["x"], ("b", "c"): ["x"]}) == []
    # the shortest circle through the first node, not the first found
    edges = {("a", "b"): ["x"], ("b", "c"): ["x"], ("c", "a"): ["x"], ("a", "c"): ["x"]}
    assert layering.import_cycles(edges) == [["a", "c", "a"]]


# --- the PE side -----------------------------------------------------------------------------------
def test_the_pe_package_has_the_expected_modules():
    names = {p.stem for p in PE_FILES}
    assert {"commands", "ops", "stages", "engines", "tiling", "scheduler", "program"} <= names


def test_pe_may_import_nothing_ranked_above_it():
    above = {layering.top_level(m) for m in MODULES
             if (layering.rank_of(m) or 0) > layering.rank_of("kbwork.pe") and m != "kbwork"}
    assert {f.removeprefix("kbwork.") for f in layering.FORBIDDEN} == above
    assert {"triton_emu", "device", "sim", "decode", "bench"} <= above


@pytest.mark.parametrize("path", PE_FILES, ids=lambda p: p.name)
def test_pe_imports_nothing_from_above(path):
    bad = layering.forbidden_imports(path)
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", PE_FILES, ids=lambda p: p.name)
def test_pe_is_recipe_free(path):
    from kbwork.triton_emu.tl_recipes import RECIPE_DESCRIPTORS

    words = layering.recipe_words()
    assert set(RECIPE_DESCRIPTORS) <= set(words)  # every registered recipe, not just the first one
    assert {"RECIPE_DESCRIPTORS", "tl_recipes"} <= set(words)
    named = layering.recipe_mentions(path)
    assert not named, f"{path.name} names {named}"


def test_check_pe_reports_every_file_clean():
    table = layering.check_pe()
    assert list(table.columns) == ["file", "forbidden_imports", "recipe_mentions", "ok"]
    assert len(table) == len(PE_FILES) and table["ok"].all()
    assert (table["forbidden_imports"] == "").all() and (table["recipe_mentions"] == "").all()


def test_the_import_checker_catches_both_import_forms(tmp_path):
    """The checker must see absolute imports, relative imports and `from .. import module`."""
    cases = {
        "import kbwork.triton_emu.tl_context\n": "kbwork.triton_emu",
        "from kbwork.kernels import gemm\n": "kbwork.kernels",
        "from ..triton_emu.tl_recipes import RECIPE_DESCRIPTORS\n": "kbwork.triton_emu",
        "from .. import sim\n": "kbwork.sim",
        "from ..cli import main\n": "kbwork.cli",
        "def f():\n    from ..decode import run\n": "kbwork.decode",
        "from ..device import simulate\n": "kbwork.device",
        "from .. import oplog\n": "kbwork.oplog",
    }
    for src, want in cases.items():
        p = tmp_path / "mod.py"
        p.write_text(src)
        assert want in {layering.forbidden_prefix(m) for m in layering.imported_modules(p)}, src
        assert layering.forbidden_imports(p), src
    ok = tmp_path / "ok.py"
    ok.write_text("from ..memory import Handle\nfrom .commands import OpSpec\nfrom ..errors import ValidationError\n"
                  "import numpy as np\n")
    assert not layering.forbidden_imports(ok)
    assert "kbwork.memory" in layering.imported_modules(ok) and "kbwork.pe.commands" in layering.imported_modules(ok)


def test_the_recipe_checker_sees_a_recipe_name_anywhere(tmp_path):
    p = tmp_path / "sched.py"
    p.write_text("# a special case for rmsnorm\nx = 1\n")
    assert layering.recipe_mentions(p) == ["rmsnorm"]
    p.write_text("from ..triton_emu import tl_recipes\n")
    assert layering.recipe_mentions(p) == ["tl_recipes"]
    p.write_text("x = 1  # plain\n")
    assert layering.recipe_mentions(p) == []


# --- docs/architecture.md says what the check does -------------------------------------------------
ARCHITECTURE = layering.PACKAGE_DIR.parent / "docs" / "architecture.md"


def test_the_architecture_page_has_the_ranks_as_implemented():
    rows = [line for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    table = []
    for line in rows:
        rank, name, names = (c.strip() for c in line.strip("|").split("|"))
        table.append((int(rank), name, tuple(re.findall(r"`([^`]+)`", names))))
    assert table == [(i, name, names) for i, (name, names) in enumerate(layering.RANKS)]


def test_the_architecture_page_names_files_and_objects_that_exist():
    import importlib

    text = ARCHITECTURE.read_text(encoding="utf-8")
    root = layering.PACKAGE_DIR.parent
    for path in set(re.findall(r"`((?:kbwork|data|docs|tests)/[\w/.-]*\w)(?::[\w.]+)?`", text)):
        assert (root / path).exists(), f"docs/architecture.md names {path}, which does not exist"
    refs = set(re.findall(r"`kbwork/([\w/]+)\.py:([\w.]+)`", text))
    assert len(refs) >= 8
    for path, name in refs:
        module = importlib.import_module("kbwork." + path.removesuffix("/__init__").replace("/", "."))
        obj = module
        for part in name.split("."):
            assert hasattr(obj, part), f"docs/architecture.md names {path}.py:{name}, which does not exist"
            obj = getattr(obj, part)
