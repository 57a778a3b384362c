"""The built site reads as its pages' prose does: every page rendered (``mkdocs build``), no
sentence split into two paragraphs and no literal ``**`` (a fact's tag that started a source
line started an HTML block there: 68 paragraphs ended mid-sentence, two ``**`` were left), no
fact's key or definition."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO

pytestmark = pytest.mark.timeout(600)
# a paragraph that ends without closing its sentence, and another paragraph right after it
SPLIT = re.compile(r"([^\s>.:;!?)\]\"'’”…])\s*</p>\s*(?:<!--[^>]*-->\s*)*(<p>|[^<\s])")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = Path(sys.executable).parent / "mkdocs"
    subprocess.run([mkdocs, "build", "--strict", "-q", "-d", out], cwd=REPO, env=env, check=True)
    return out


def articles(site: Path) -> dict[str, str]:
    """Each page's article (its rendered Markdown), by its path in the site."""
    pages = {}
    for page in sorted(site.rglob("index.html")):
        html = page.read_text(encoding="utf-8")
        start, end = html.find("<article"), html.find("</article>")
        if start >= 0:
            pages[str(page.parent.relative_to(site))] = html[start:end]
    return pages


def test_no_page_splits_a_sentence_or_shows_markup(site):
    pages = articles(site)
    assert len(pages) > 30 and "results/board" in pages
    faults = []
    for name, html in pages.items():
        text = re.sub(r"<(pre|code)\b.*?</\1>", "", html, flags=re.S)  # code may hold `**`
        faults += [f"{name}: split after ...{html[max(0, m.start() - 60) : m.start() + 1]!r}"
                   for m in SPLIT.finditer(html)]  # fmt: skip
        faults += [f"{name}: literal **" for _ in re.finditer(r"\*\*", text)]
        faults += [f"{name}: a fact's tag or key" for _ in re.finditer(r"<!-- fact|\[\^", text)]
    assert not faults, "\n".join(faults)
