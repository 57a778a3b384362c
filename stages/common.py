"""Argument handling shared by the stage scripts."""

from __future__ import annotations

import argparse

from fedssl.stage.context import StageContext


def context(kind: str, argv: list[str], what: str) -> StageContext:
    """Parse the stage's one argument (a preset name) and validate its params."""
    ap = argparse.ArgumentParser(prog=f"python -m stages.{kind}")
    ap.add_argument("name", help=what)
    return StageContext(kind, ap.parse_args(argv).name)
