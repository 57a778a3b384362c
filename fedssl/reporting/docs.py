"""The documentation's generated parts: ``fedssl docs`` (``make docs``) refills the results
pages' blocks from the committed reports, and a test fails when a page is stale.

A page under ``docs/`` holds blocks that say where their content comes from:

- ``<!-- results: PIPELINE TABLE -->...<!-- /results -->``: a table of
  ``results/reports/PIPELINE/report.json``;
- ``<!-- board: PIPELINE -->...<!-- /board -->``: that pipeline's ``board_tables.md``;
- ``<!-- figures: PIPELINE -->...<!-- /figures -->``: every figure of the report's folder,
  inline (the site serves ``results/reports/`` beside the pages: ``docs/hooks.py``);
- ``<!-- layout -->...<!-- /layout -->``: the project's tree, from the library's docstrings
  (:mod:`fedssl.reporting.tree`);
- ``NUMBER[^KEY]`` in a sentence, with ``[^KEY]: ...`` at the page's end: a number of a
  report or a log (:mod:`fedssl.reporting.readme_facts`).

The pages the site makes from code (the params reference from ``schemas/``, the command's
reference from its parsers) are written at build time by ``docs/hooks.py``, so they cannot be
stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from fedssl.reporting import board, readme_facts, report, tree

DOCS = Path("docs")
REPORTS = Path("results/reports")
_FIGURES = re.compile(r"(<!-- figures: (\w+) -->\n)(.*?)(<!-- /figures -->)", re.S)
# where a page's links find results/reports/ on the site (docs/hooks.py puts it there)
SITE_REPORTS = "reports"


def figures_text(text: str, page: Path, results: Path = REPORTS) -> str:
    """``text`` with every figures block listing the report's PNGs, as links relative to
    ``page`` (a path under docs/)."""
    up = "../" * (len(page.parts) - 1)

    def fill(m: re.Match) -> str:
        folder = results / m.group(2)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no report of pipeline '{m.group(2)}' (run it)")
        images = [
            f"![{m.group(2)}: {p.stem}]({up}{SITE_REPORTS}/{m.group(2)}/{p.name})\n"
            for p in sorted(folder.glob("*.png"))
        ]
        return m.group(1) + "\n".join(images) + m.group(4)

    return _FIGURES.sub(fill, text)


def page_text(text: str, page: Path, results: Path = REPORTS) -> str:
    """A page with its report tables, board tables, figures and layout tree refilled."""
    text = tree.fill_blocks(report.fill_blocks(text, results))
    text = board.write.fill_blocks(text, results)
    return figures_text(text, page, results)


def pages(docs: Path = DOCS) -> list[Path]:
    """The site's pages, and the README (its one table comes from the default report)."""
    readme = docs.parent / "README.md"
    return [*sorted(docs.rglob("*.md")), *([readme] if readme.exists() else [])]


def stale_pages(docs: Path = DOCS, results: Path = REPORTS) -> list[Path]:
    stale = []
    for p in pages(docs):
        try:
            if page_text(p.read_text(), where(p, docs), results) != p.read_text():
                stale.append(p)
        except (FileNotFoundError, KeyError, ValueError) as e:
            raise type(e)(f"{p}: {e.args[0] if e.args else e}") from e
    return stale


def where(page: Path, docs: Path = DOCS) -> Path:
    """A page's path as the site sees it (the README sits beside docs/)."""
    return page.relative_to(docs) if docs in page.parents else Path(page.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedssl docs", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only say which pages are stale")
    ap.add_argument(
        "--key-facts",
        action="store_true",
        help="first rewrite inline <!-- fact: ... --> tags (the former syntax) as NUMBER[^KEY]",
    )
    args = ap.parse_args(argv)
    if args.key_facts:
        for p in pages():
            p.write_text(readme_facts.keyed(p.read_text()))
    try:
        stale = stale_pages()
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 1
    if args.check:
        for p in stale:
            print(f"{p}: stale (run `fedssl docs`)", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(page_text(p.read_text(), where(p)))
    print(f"{len(stale)} of {len(pages())} pages refilled from {REPORTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
