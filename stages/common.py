"""Argument handling shared by the stage scripts."""
from __future__ import annotations

import argparse

from fedssl.pipeline import Dag


def parse_stage(kind: str, argv: list[str], what: str):
    """Parse the stage's one argument (a preset name); returns (dag, stage name, that name)."""
    ap = argparse.ArgumentParser(prog=f"python -m stages.{kind}")
    ap.add_argument("name", help=what)
    name = ap.parse_args(argv).name
    stage = f"{kind}__{name}"
    return Dag.containing(stage), stage, name
