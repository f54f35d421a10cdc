"""What the docs promise about themselves: the results index links every saved run (its report,
raw JSON and charts), and every relative link in the README and docs/ reaches a file that exists
(a figure cited is one a reader can open)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")        # [text](target#anchor): the target
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)             # fenced blocks and inline spans


def links(markdown: Path) -> list[str]:
    """The relative link targets of a Markdown file's prose (code is not prose)."""
    return [t for t in LINK.findall(CODE.sub("", markdown.read_text(encoding="utf-8")))
            if "://" not in t and not t.startswith("mailto:")]


def test_links_finds_relative_targets_outside_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[run](a.md#top) · [site](https://x.org/b.md) `[no](c.md)`\n```\nMODELS['m'](dim=1)\n```\n",
                    encoding="utf-8")
    assert links(page) == ["a.md"]


def test_results_index_links_every_saved_file():
    saved = {p.name for p in RESULTS.iterdir() if p.is_file()} - {"README.md"}
    unlisted = saved - set(links(RESULTS / "README.md"))
    assert not unlisted, f"docs/results/README.md has no row for {sorted(unlisted)}"


def test_relative_links_reach_files():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages for target in links(page)
              if not (page.parent / target).exists()]
    assert not broken, broken
