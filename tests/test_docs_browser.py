"""The built documentation site in a real browser (opt-in: ``make docs-browser``): headless
Chromium (Debian's ``chromium``) opens the home page, a results page and the board page,
served over HTTP from ``mkdocs build``'s output, and finds every image loaded and every link
of the site answered."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.fixtures import REPO

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]
PAGES = ("", "results/default/", "results/board/")

# in the page: every <img> loaded (complete, with a size); every link of the same site answered
CHECK = """
(async () => {
  const images = [...document.images].map(i => ({
    src: i.src, ok: i.complete && i.naturalWidth > 0}));
  const hrefs = [...new Set([...document.querySelectorAll('a[href]')].map(a => a.href)
    .filter(h => h.startsWith(location.origin)).map(h => h.split('#')[0]))];
  const links = await Promise.all(hrefs.map(async h => {
    const r = await fetch(h, {method: 'HEAD'}); return {href: h, status: r.status};
  }));
  return JSON.stringify({images, links});
})()
"""


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = Path(sys.executable).parent / "mkdocs"
    subprocess.run([mkdocs, "build", "--strict", "-q", "-d", out], cwd=REPO, env=env, check=True)
    handler = functools.partial(Quiet, directory=str(out))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="chromium_")
    proc = subprocess.Popen(
        [
            exe,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port_file = Path(profile) / "DevToolsActivePort"
    for _ in range(300):
        if port_file.exists() and len(port_file.read_text().split()) == 2:
            break
        time.sleep(0.1)
    port = port_file.read_text().split()[0]
    yield port
    proc.terminate()
    proc.wait(30)
    shutil.rmtree(profile, ignore_errors=True)


def page_report(port: str, url: str) -> dict:
    """Open ``url`` in a new tab through the DevTools protocol; the images and links it has."""
    from urllib.request import Request, urlopen

    from websockets.sync.client import connect

    target = json.loads(
        urlopen(Request(f"http://127.0.0.1:{port}/json/new?{url}", method="PUT")).read()
    )
    with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
        ids = iter(range(1, 10**6))

        def call(method: str, **params) -> dict:
            n = next(ids)
            ws.send(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv(timeout=120))
                if msg.get("id") == n:
                    return msg["result"]

        page = "location.href + ' ' + document.readyState"
        for _ in range(600):  # until the page (not the blank one before it) and its images load
            state = call("Runtime.evaluate", expression=page)["result"]["value"]
            if state == f"{url} complete":
                break
            time.sleep(0.1)
        assert state == f"{url} complete", state
        value = call("Runtime.evaluate", expression=CHECK, awaitPromise=True)["result"]["value"]
    urlopen(Request(f"http://127.0.0.1:{port}/json/close/{target['id']}"))
    return json.loads(value)


@pytest.mark.parametrize("page", PAGES, ids=("home", "results", "board"))
def test_every_image_loads_and_every_link_answers(site, chromium, page):
    found = page_report(chromium, site + page)
    broken = [i["src"] for i in found["images"] if not i["ok"]]
    dead = [f"{x['href']} ({x['status']})" for x in found["links"] if x["status"] != 200]
    print(f"{page or 'home'}: {len(found['images'])} images, {len(found['links'])} links")
    assert not broken and not dead, f"{page or 'home'}: images {broken}, links {dead}"
    assert found["links"], "no link found: the check saw no page"
    if page.startswith("results/"):
        assert found["images"], "a results page shows its report's figures"
