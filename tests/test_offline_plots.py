"""`dvc plots show` offline: the page DVC writes from the committed results loads nothing from
the network (the vega bundles inline, from the project's template), and headless Chromium with
every host unreachable draws each of its charts (the browser check is opt-in:
``make docs-browser``)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fedssl.reporting import offline_plots
from tests.fixtures import REPO, run

pytestmark = pytest.mark.timeout(300)
EMBED = re.compile(r"vegaEmbed\('#")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plots")
    run(["dvc", "plots", "show", "-o", str(out)], REPO)
    return out / "index.html"


def test_the_template_holds_the_bundles_and_dvc_uses_it():
    text = (REPO / offline_plots.TEMPLATE).read_text(encoding="utf-8")
    assert "{plot_divs}" in text and "{scripts}" not in text  # no CDN tags added by DVC
    for name in offline_plots.BUNDLES:  # each bundle inline, as Snakemake ships it
        js = (offline_plots.bundles_dir() / name / f"{name}.js").read_text(encoding="utf-8")
        assert js[:2000] in text, name
    assert not re.search(r"<script[^>]+src=", text)
    config = run(["dvc", "config", "plots.html_template"], REPO).stdout.strip()
    assert (REPO / ".dvc" / config).resolve() == (REPO / offline_plots.TEMPLATE).resolve()


def test_dvc_plots_page_loads_nothing_from_the_network(page):
    html = page.read_text(encoding="utf-8")
    assert "cdn.jsdelivr.net" not in html and not re.search(r"<script[^>]+src=", html)
    assert len(EMBED.findall(html)) >= 3  # the loss per round and the probes' curves


@pytest.mark.browser
def test_chromium_offline_draws_every_chart(page):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium (make docs-browser installs it)")
    with tempfile.TemporaryDirectory(prefix="chromium_") as profile:
        dom = subprocess.run(
            [
                exe,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={profile}",
                "--host-resolver-rules=MAP * ~NOTFOUND",  # no host answers: offline
                "--virtual-time-budget=20000",
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        ).stdout
    charts = len(EMBED.findall(page.read_text(encoding="utf-8")))
    drawn = len(re.findall(r'<(svg|canvas)[^>]*class="marks"', dom))
    assert charts >= 3 and drawn == charts, f"{drawn} of {charts} charts drawn"


def test_make_docs_browser_installs_what_its_tests_need():
    """`make docs-browser` on a fresh install: every third-party module its tests import is in
    the `[test]` extra (websockets was not), and Chromium is installed when missing."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {re.split(r"[<>=\[ ]", d)[0].lower() for d in extra["optional-dependencies"]["test"]}
    wanted |= {re.split(r"[<>=\[ ]", d)[0].lower() for d in extra["dependencies"]}
    make = run(["make", "-n", "docs-browser"], REPO).stdout
    files = re.search(r"pytest -q -m browser (.+)", make).group(1).split()
    for file in files:
        for node in ast.walk(ast.parse((REPO / file).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for top in {n.split(".")[0] for n in names}:
                if top in sys.stdlib_module_names or top in ("fedssl", "tests"):
                    continue
                assert top.replace("_", "-") in wanted, f"{file} imports {top}, not in [test]"
    assert "apt-get install -y -qq --no-install-recommends chromium" in make
    assert "tests/test_offline_plots.py" in files
