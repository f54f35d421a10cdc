"""What the docs promise about themselves: the results index links every saved run (its report,
raw JSON and charts), every relative link in the README and docs/ reaches a file that exists (a
figure cited is one a reader can open), and every name of the code they cite is still there."""
import importlib
import importlib.util
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


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:         # a parent that is a module, not a package
        return False


def test_named_code_exists():
    """Every `engines.…` or `mlexec.…` the README and docs/ name in code spans is a module or an
    attribute of one: a rename leaves no doc pointing at nothing."""
    named = {m for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
             for m in re.findall(r"`((?:engines|mlexec)(?:\.\w+)+)`", page.read_text(encoding="utf-8"))}
    missing = []
    for name in sorted(named):
        parts = name.split(".")
        at = next(i for i in range(len(parts), 0, -1) if _is_module(".".join(parts[:i])))
        obj = importlib.import_module(".".join(parts[:at]))
        for attr in parts[at:]:
            obj = getattr(obj, attr, None)
        if obj is None:
            missing.append(name)
    assert named and not missing, missing
