"""The docs' reference pages are generated (scripts/docs_ref.py) and committed as generated.

A change to the API models, a parser, a metric or a chart value without ``python
scripts/docs_ref.py`` fails here, naming the stale page.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tinct_testing.paths import ROOT


@pytest.fixture(scope="module")
def docs_ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_ref", ROOT / "scripts" / "docs_ref.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_ref"] = module
    spec.loader.exec_module(module)
    return module


def test_committed_reference_pages_are_what_the_script_writes(docs_ref: ModuleType) -> None:
    assert docs_ref.stale() == [], "stale pages under docs/reference/: run python scripts/docs_ref.py"


def test_a_changed_source_makes_its_page_stale(docs_ref: ModuleType, tmp_path: Path) -> None:
    for name, make in docs_ref.PAGES.items():
        (tmp_path / name).write_text(make())
    assert docs_ref.stale(tmp_path) == []
    page = tmp_path / "metrics.md"
    page.write_text(page.read_text().replace("tinct_release_phase", "tinct_release_stage"))
    (tmp_path / "cli.md").unlink()
    assert docs_ref.stale(tmp_path) == ["cli.md", "metrics.md"]


def test_every_metric_family_is_listed(docs_ref: ModuleType) -> None:
    page = docs_ref.metrics_page()
    for name in (
        "tinct_release_phase",  # operator
        "tinct_router_requests_total",  # router, built when scraped
        "tinct_router_time_to_first_token_seconds",
        "tinct_router_shadow_mirrors_total",  # router, its shadow metrics
        "tinct_router_worker_restarts_total",  # router parent, over the workers
        "tinct_shadow_pairs_total",  # comparer
    ):
        assert f"| `{name}` |" in page, name


def test_every_command_has_its_help(docs_ref: ModuleType) -> None:
    page = docs_ref.cli_page()
    for prog in (
        "tinct",
        "tinct operator",
        "tinct router",
        "tinct lineage sql",
        "tinct release",
        "tinct comparer",
    ):
        assert f"## `{prog}`\n" in page, prog
    assert "__complete" not in page, "the completion scripts' hidden helper is not a command to document"


def test_crd_page_has_every_field_with_its_rules(docs_ref: ModuleType) -> None:
    page = docs_ref.crds_page()
    assert "| `spec.cells[].weights` |" in page
    assert "| `status.conditions[].reason` |" in page
    assert "rule: " in page, "the CEL rules are listed"


def test_values_are_read_with_their_comments(docs_ref: ModuleType) -> None:
    text = (
        "# -- Documented,\n"
        "# over two lines.\n"
        "top: 1\n"
        "\n"
        "# A group's plain comment.\n"
        "group:\n"
        "  # -- Inner.\n"
        "  inner: [a]\n"
        "  # not a doc comment, but the block right above\n"
        "  plain: x\n"
        "  nested:\n"
        "    deep: true\n"
        "after: {}\n"
    )
    assert list(docs_ref._documented_keys(text)) == [
        ("top", "Documented, over two lines."),
        ("group", "A group's plain comment."),
        ("group.inner", "Inner."),
        ("group.plain", "not a doc comment, but the block right above"),
        ("group.nested", ""),
        ("group.nested.deep", ""),
        ("after", ""),
    ]
