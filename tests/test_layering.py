"""The PE side never imports the compiler side or anything above it, and names no recipe (DESIGN §3 D6.5,
§9). The check itself lives in ``kbwork.layering``, so a notebook can show the same verdict."""

from __future__ import annotations

import pytest

from kbwork import layering

PE_FILES = layering.pe_files()


def test_the_pe_package_has_the_expected_modules():
    names = {p.stem for p in PE_FILES}
    assert {"commands", "ops", "stages", "engines", "tiling", "scheduler", "program"} <= names


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
