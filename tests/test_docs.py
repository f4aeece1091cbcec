"""docs/ describes the code as it is: every topology key, op_log column and critical-path cause is there."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import kbwork
from kbwork.oplog import COLUMNS
from kbwork.device import CAUSES, TIE_ORDER

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = DOCS.parent / "README.md"


def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")))


def _quoted(text: str) -> set[str]:
    """Every name written as code (between backticks) in ``text``."""
    return set(re.findall(r"`([^`\n]+)`", text))


@pytest.mark.parametrize("key", [f.name for f in dataclasses.fields(kbwork.Topology)])
def test_every_topology_key_is_documented_with_a_default_and_a_unit(key):
    rows = [line for line in (DOCS / "machine.md").read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `{key}` |")]
    assert rows, f"topology key {key!r} has no row in docs/machine.md"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 4 and all(cells), f"{key}: a row needs default, unit and meaning: {rows[0]}"
    default = getattr(kbwork.Topology(), key)
    assert str(default).strip("`") in cells[1].strip("`"), f"{key}: documented default {cells[1]} is not {default}"


@pytest.mark.parametrize("column", COLUMNS)
def test_every_op_log_column_is_documented(column):
    rows = [line for line in (DOCS / "timeline.md").read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `{column}` |")]
    assert rows, f"op_log column {column!r} has no row in docs/timeline.md"


@pytest.mark.parametrize("cause", CAUSES)
def test_every_critical_path_cause_is_documented(cause):
    rows = [line for line in (DOCS / "timeline.md").read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `{cause}` |")]
    assert rows, f"cause {cause!r} has no row in docs/timeline.md"


def test_the_documented_tie_order_is_the_timeline_s():
    text = (DOCS / "timeline.md").read_text(encoding="utf-8")
    m = re.search(r"the first of \*\*([a-z,\s]+)\*\*", text)
    assert m, "docs/timeline.md no longer states the tie order"
    assert [w.strip() for w in m.group(1).split(",")] == [CAUSES[i] for i in TIE_ORDER]


def test_docs_name_every_variant_policy_and_recipe():
    from kbwork.config import HAZARD_POLICIES
    from kbwork.decode import VARIANTS
    from kbwork.triton_emu.tl_recipes import RECIPE_DESCRIPTORS

    names = _quoted(_docs_text())
    for name in [*VARIANTS, *HAZARD_POLICIES, *RECIPE_DESCRIPTORS]:
        assert name in names, f"{name!r} is not documented in docs/"


def test_docs_links_resolve_and_the_readme_links_the_docs():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"
    readme = README.read_text(encoding="utf-8")
    assert "docs/README.md" in readme or "(docs/)" in readme
    assert "../shared" not in readme, "the README must not send readers outside the repository"


def test_what_users_touch_first_says_what_it_is():
    from kbwork import decode

    doc = decode.run.__doc__
    for v in decode.VARIANTS:
        assert f'"{v}"' in doc, f"decode.run's docstring does not name the variant {v}"
    assert ">>> " in doc, "decode.run's docstring has no example"
    for cls, names in ((decode.DecodeRun, ("op_log", "cycles", "topology", "n_tiles", "to_csv", "to_perfetto")),
                       (decode.Comparison, ("variants", "params", "closed_form_gate"))):
        for name in names:
            attr = getattr(cls, name)
            assert (getattr(attr, "fget", attr).__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"
