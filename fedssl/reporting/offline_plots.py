"""``dvc plots show`` with no network: DVC's page loads vega, vega-lite and vega-embed from a CDN,
which an air-gapped machine (the usual federated test bed) cannot reach, and then shows only
the PNG figures. The project's DVC config points at an HTML template (``.dvc/plots.html``) that
holds the three bundles inline instead, copied from the ones Snakemake ships for its own
reports (a dependency already), so the page DVC writes draws its charts anywhere, offline.

``python -m fedssl.reporting.offline_plots`` rewrites the template from the installed Snakemake.
"""

from __future__ import annotations

import sys
from pathlib import Path

TEMPLATE = Path(".dvc/plots.html")  # .dvc/config: [plots] html_template = plots.html
BUNDLES = ("vega", "vega-lite", "vega-embed")  # in load order: each needs the one before
# DVC fills {plot_divs} (and {refresh_tag}); a template without {scripts} gets no CDN tags
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC Plot</title>
    <!-- vega, vega-lite and vega-embed inline (BSD-3-Clause, the Vega authors), for a page
         that draws with no network: written by `python -m fedssl.reporting.offline_plots` -->
{bundles}
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def bundles_dir() -> Path:
    import snakemake

    return Path(snakemake.__file__).parent / "assets" / "data"


def template(source: Path | None = None) -> str:
    """The page template with the bundles of folder ``source`` (Snakemake's) inline."""
    source = source or bundles_dir()
    scripts = []
    for name in BUNDLES:
        js = (source / name / f"{name}.js").read_text(encoding="utf-8")
        if "</script" in js or "{plot_divs}" in js or "{scripts}" in js:
            raise ValueError(f"{source / name}: cannot be inlined in an HTML template")
        scripts.append(f'    <script type="text/javascript">\n{js}\n    </script>')
    return PAGE.replace("{bundles}", "\n".join(scripts))


def main(argv: list[str] | None = None) -> int:
    TEMPLATE.write_text(template(), encoding="utf-8")
    print(f"wrote {TEMPLATE} ({TEMPLATE.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
