"""MkDocs hooks (``mkdocs.yml: hooks``): the site serves the committed reports' figures beside
the pages, and writes the pages that are made from code (the params reference from
``schemas/``, the ``fedssl`` command's reference from its parsers) at build time."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's fedssl, as the stages import it


def on_files(files, config):
    results = ROOT / "results"
    for png in sorted((results / "reports").rglob("*.png")):
        files.append(
            File(
                str(png.relative_to(results)),
                str(results),
                config["site_dir"],
                config["use_directory_urls"],
            )
        )
    files.append(File.generated(config, "reference/params.md", content=params_page()))
    files.append(File.generated(config, "reference/command.md", content=command_page()))
    files.append(File.generated(config, "reference/stage-kinds.md", content=stage_kinds_page()))
    return files


def on_page_markdown(markdown, page, config, files):
    """A page's facts as their numbers alone, without their keys and definitions (see
    :mod:`fedssl.reporting.readme_facts`; ``fedssl docs`` keeps the numbers current, and a
    test fails when a page is stale)."""
    from fedssl.reporting.readme_facts import strip_facts

    return strip_facts(markdown)


# ---------------------------------------------------------------------------- params
SCHEMAS = ("experiment", "partition", "dataset", "grids", "pipelines")


def type_of(spec: dict) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    if "enum" in spec:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    for key in ("anyOf", "oneOf"):
        if key in spec:
            return " or ".join(type_of(s) for s in spec[key])
    kind = spec.get("type", "any")
    if kind == "array" and "items" in spec:
        return f"list of {type_of(spec['items'])}"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map to {type_of(spec['additionalProperties'])}"
    bounds = [
        f"{op} {spec[k]}"
        for k, op in (
            ("exclusiveMinimum", ">"),
            ("minimum", "≥"),
            ("exclusiveMaximum", "<"),
            ("maximum", "≤"),
        )
        if k in spec
    ]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def meaning(spec: dict, defs: dict) -> str:
    """A field's description; without one, a tag (one allowed value: ``name``, ``kind``) says
    what it picks, and a field of a model (or None) takes the model's first sentence."""
    if "description" in spec:
        return spec["description"]
    if "const" in spec:
        return "picks this model among the alternatives of its place"
    refs = [s["$ref"] for s in [spec, *spec.get("anyOf", [])] if "$ref" in s]
    doc = defs.get(refs[0].rsplit("/", 1)[1], {}).get("description", "") if refs else ""
    first = doc.split(". ")[0].split("\n\n")[0].rstrip(".")
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`")  # Sphinx roles


def model_section(name: str, spec: dict, defs: dict) -> list[str]:
    lines = [f"### {name}", ""]
    if spec.get("description"):
        lines += [spec["description"].strip(), ""]
    props = spec.get("properties", {})
    if props:
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for field, p in props.items():
            default = f"`{json.dumps(p['default'])}`" if "default" in p else "required"
            lines.append(
                f"| `{field}` | {cell(type_of(p))} | {cell(default)} | {cell(meaning(p, defs))} |"
            )
        lines.append("")
    return lines


def params_page() -> str:
    lines = [
        "# Params reference",
        "",
        "Generated from the JSON Schemas in `schemas/` (themselves generated from the pydantic",
        "models by `fedssl schemas`) each time the site is built. Every model forbids unknown",
        "keys; a bad value stops a run before any compute with the file and the field named.",
        "",
    ]
    for kind in SCHEMAS:
        schema = json.loads((ROOT / "schemas" / f"{kind}.schema.json").read_text())
        lines += [f"## {kind}", "", f"`schemas/{kind}.schema.json`", ""]
        if schema.get("description"):
            lines += [schema["description"].strip(), ""]
        if "properties" in schema:
            lines += model_section(schema.get("title", kind), schema, schema.get("$defs", {}))[2:]
        for name, spec in schema.get("$defs", {}).items():
            if not name.endswith("Partial"):  # the same model, every field optional
                lines += model_section(name, spec, schema["$defs"])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command
def help_of(argv: list[str]) -> str:
    from fedssl import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.run(argv)
    return out.getvalue()


def command_page() -> str:
    from fedssl import cli

    lines = [
        "# The `fedssl` command",
        "",
        "Generated from the command's own help each time the site is built.",
        "",
        "```text",
        cli.parser().format_help().rstrip(),
        "```",
        "",
        "## fedssl run",
        "",
        "```text",
        cli.RUN_HELP.rstrip(),
        "```",
    ]
    for verb in ("list", "show", "times", *cli.TOOLS):
        lines += ["", f"## fedssl {verb}", "", "```text", help_of([verb, "-h"]).rstrip(), "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- stage kinds
def stage_kinds_page() -> str:
    import ast

    contract = ast.get_docstring(ast.parse((ROOT / "fedssl/stage/base.py").read_text()))
    lines = [
        "# Stage kinds",
        "",
        "Generated from the stage scripts' docstrings (`stages/*.py`) each time the site is",
        "built. Every stage is `python -m stages.<kind> <name>`; a method's own steps run",
        "through `stages/method.py` (`python -m stages.method STEP EXPERIMENT`), the shared",
        "evaluations through `stages/evaluation.py` (`python -m stages.evaluation KIND",
        "EXPERIMENT`), each described by its file under `fedssl/evaluations/`.",
        "",
        "## The stage contract",
        "",
        contract.strip(),
        "",
        "## The kinds",
        "",
    ]
    for script in sorted((ROOT / "stages").glob("*.py")):
        doc = ast.get_docstring(ast.parse(script.read_text()))
        if script.stem in ("__init__", "common") or not doc:
            continue
        lines += [f"### {script.stem}", "", doc.strip(), ""]
    for file in sorted((ROOT / "fedssl/evaluations").glob("*.py")):
        tree = ast.parse(file.read_text())
        runs = any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body)
        if runs:  # an evaluation's stage (a file that only declares metrics has none)
            lines += [f"### evaluation {file.stem}", "", ast.get_docstring(tree).strip(), ""]
    return "\n".join(lines) + "\n"
