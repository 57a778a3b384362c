"""Stage: per-client costs of an experiment's federated method (MFCL or FedSimCLR), the same
recipe for both: α bits (paper convention, Eqs. 4-5, code rate 1/3) and bytes actually sent,
β FLOPs (FlopCounterMode × samples processed), γ memory (Eq. 6 and a measured one-step figure).
Runs on the CPU: FLOP counts do not depend on the device."""
from __future__ import annotations

import json
from pathlib import Path

from fedssl import costs
from fedssl.data.store import image_shape, load_clients
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir, partition_dir
from fedssl.runtime import write_json
from fedssl.stage import main_guard, stage_run
from stages.common import parse_stage


def _ledger(exp_dir: Path, num_clients: int) -> tuple[list[int], list[int]]:
    """Rounds and bytes (up + down) per client from the pretrain stage's communication log."""
    path = exp_dir / "pretrain" / "communication.json"
    if not path.exists():
        return [0] * num_clients, [0] * num_clients
    rows = json.loads(path.read_text())["per_client"]
    return [r["rounds"] for r in rows], [r["bytes_up"] + r["bytes_down"] for r in rows]


def run(argv):
    dag, stage, name = parse_stage("costs", argv, "a params/experiments/<name>.yaml preset")
    exp = load_preset("experiment", name)
    part = load_preset("partition", exp.partition)
    exp_dir = Path(experiment_dir(name))
    samples = [len(c) for c in load_clients(partition_dir(exp.partition))]
    rounds, sent = _ledger(exp_dir, len(samples))
    with stage_run(dag, stage) as (_, out, _device, info):
        export = None
        if exp.pretrain.method == "mfcl":
            export = json.loads((exp_dir / "export" / "manifest.json").read_text())["per_client"]
        rows = costs.experiment_client_costs(exp, image_shape(data_dir(part.dataset)), samples,
                                             rounds, sent, export)
        summary = costs.summarize_client_costs(rows)
        write_json(out / "costs.json", {"per_client": rows, **summary,
                                        "code_rate": costs.DEFAULT_CODE_RATE,
                                        "probe_pairs": costs.PROBE_PAIRS})
        info.update(summary)


if __name__ == "__main__":
    main_guard(run)
