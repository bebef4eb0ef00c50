"""The README is a short front page, and every relative link of the README, docs/ and benchmarks/RESULTS.md works."""

import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
# the pages the README must link to, one per topic it leaves to docs/
DOCS_PAGES = [
    "docs/engines.md",
    "docs/environments.md",
    "docs/your_environment.md",
    "docs/config_fields.md",
    "docs/saving_and_hub.md",
    "docs/pretrained.md",
    "docs/how_it_works.md",
    "docs/benchmarks.md",
    "benchmarks/RESULTS.md",
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets and parentheses are code, not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (but '-' and '_'), spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")  # GitHub numbers repeated headings
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_slug_follows_githubs_rules():
    assert _slug("The Qwen3-0.6B recipe") == "the-qwen3-06b-recipe"
    assert _slug("The model (`alea_trl/modeling_alea.py`)") == "the-model-alea_trlmodeling_aleapy"
    assert _slug("Today's results") == "todays-results"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading(page):
    links = _relative_links(page)
    assert links or page.name != "README.md"
    for target in links:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.is_file(), f"{page.relative_to(ROOT)}: link {target!r}: {path!r} does not exist"
        assert file.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: link {target!r} leaves the repository"
        if anchor:
            assert file.suffix == ".md", f"{page.relative_to(ROOT)}: link {target!r}: an anchor into a non-page"
            assert anchor in _anchors(file), (
                f"{page.relative_to(ROOT)}: link {target!r}: no heading of {file.relative_to(ROOT)} has anchor "
                f"{anchor!r}; its anchors: {sorted(_anchors(file))}"
            )


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    linked = {t.partition("#")[0] for t in _relative_links(ROOT / "README.md")}
    assert set(DOCS_PAGES) <= linked, sorted(set(DOCS_PAGES) - linked)
    assert "docs/learning_curves.png" in linked
    # the two commands CI and users run
    assert "# 1. set up, then run the quickstart" in text and "# 2. run the tests\npython -m pytest -q\n" in text


def test_learning_curves_picture_is_small():
    assert (ROOT / "docs" / "learning_curves.png").stat().st_size < 150_000


def test_results_open_with_todays_figures_then_history():
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections == ["Today's results", "History"], sections
