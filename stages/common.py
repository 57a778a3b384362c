"""Argument handling shared by the stage scripts."""
from __future__ import annotations

import argparse

from fedssl.fl.engine import write_round_log
from fedssl.pipeline import Dag
from fedssl.runtime import write_json


def parse_stage(kind: str, argv: list[str], what: str):
    """Parse the stage's one argument (a preset name); returns (dag, stage name, that name)."""
    ap = argparse.ArgumentParser(prog=f"python -m stages.{kind}")
    ap.add_argument("name", help=what)
    name = ap.parse_args(argv).name
    stage = f"{kind}__{name}"
    return Dag.containing(stage), stage, name


def federate(fed, model, out, info: dict, rounds_log: str) -> list[dict]:
    """Run a Federation from its last checkpoint to the end, logging every round (TSV plot and
    a progress line); writes the per-client byte ledger and loads the final weights into
    ``model``. Returns the per-round log rows."""
    state = fed.start(model)
    info["resumed_from_round"] = state.round

    def on_round(s):
        write_round_log(s.log, rounds_log)
        r = s.log[-1]
        print(f"round {r['round']}: loss {r['loss']:.4f}, {r['clients']} clients, "
              f"{r['images_per_s']:.0f} img/s", flush=True)

    state = fed.run(state, on_round=on_round)
    model.load_state_dict({**state.params, **state.buffers})
    write_json(out / "communication.json", state.ledger.summary())
    return state.log
