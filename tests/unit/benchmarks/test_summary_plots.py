"""``benchmarks/summary_plots.py`` draws every plot BENCHMARKS.md shows from the result files,
and the page's links (plots, CSVs named as links, other pages and their sections) resolve."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import summary_plots  # noqa: E402

pytest.importorskip("matplotlib")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", page.read_text())


def test_every_plot_is_drawn_from_the_results(tmp_path: Path) -> None:
    assert summary_plots.main(["--out", str(tmp_path)]) == 0
    drawn = sorted(p.name for p in tmp_path.iterdir())
    assert drawn == sorted(
        ["vs_pytorch.png", "served_vs_pytorch.png", "memory.png", "large_table_load.png",
         "served_concurrency.png"]
    )  # fmt: skip
    for path in tmp_path.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_page_shows_the_committed_plots_and_every_link_resolves() -> None:
    page = ROOT / "BENCHMARKS.md"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
    assert sorted(Path(i).name for i in images) == sorted(
        f"{plot.__name__.removeprefix('plot_')}.png" for plot in summary_plots.PLOTS
    )
    for link in _links(page):
        if link.startswith("http"):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target) if target else page
        assert path.exists(), f"BENCHMARKS.md links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+\s+(.*)$", path.read_text(), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"no section #{anchor} in {target}"


@pytest.mark.parametrize("name", ["README.md", "docs/RELIABILITY.md", "docs/BENCHMARKS_HISTORY.md"])
def test_links_to_the_benchmark_pages_resolve(name: str) -> None:
    page = ROOT / name
    for link in _links(page):
        target, _, anchor = link.partition("#")
        if "BENCHMARKS" not in target:
            continue
        path = page.parent / target
        assert path.exists(), f"{name} links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+\s+(.*)$", path.read_text(), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"{name}: no section #{anchor}"
