"""Stage: per-client costs of an experiment's federated method (MFCL or FedSimCLR), the same
recipe for both: α bits (paper convention, Eqs. 4-5, code rate 1/3) and bytes actually sent,
β FLOPs (FlopCounterMode × samples processed), γ memory (Eq. 6 and a measured one-step figure).
Runs on the CPU: FLOP counts do not depend on the device."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from fedssl import costs
from fedssl.data.store import image_shape, load_clients
from fedssl.losses import nt_xent
from fedssl.methods import fedsimclr, mfcl
from fedssl.models.autoencoder import reconstruction_loss
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir, partition_dir
from fedssl.runtime import write_json
from fedssl.stage import main_guard, stage_run
from stages.common import parse_stage

PROBE_PAIRS = 4  # the FLOPs / activations of a step are measured on this many pairs and scaled


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
    cpu = torch.device("cpu")
    with stage_run(dag, stage) as (_, out, _device, info):
        shape = image_shape(data_dir(part.dataset))
        gen = torch.Generator().manual_seed(0)
        probe = torch.rand((2 * PROBE_PAIRS, *shape), generator=gen)
        if exp.pretrain.method == "mfcl":
            ae = mfcl.build_client_module(exp, shape, cpu).train()
            manifest = json.loads((exp_dir / "export" / "manifest.json").read_text())["per_client"]
            kind = exp.mfcl.phase1.loss
            rows = costs.mfcl_client_costs(
                ae, probe, lambda logits, x: reconstruction_loss(logits, x, kind),
                exp.mfcl.phase1.batch_pairs, samples, rounds, exp.mfcl.phase1.local_epochs,
                exp.mfcl.export.pairs, [c["dropped"] for c in manifest],
                [b + c["bytes_sent"] for b, c in zip(sent, manifest)],
                mfcl.pre_pool_numel(ae, shape))
        else:
            model = fedsimclr.build_model(exp, shape, cpu).train()
            tau = exp.pretrain.temperature
            rows = costs.e2e_client_costs(
                model, probe.chunk(2), lambda z, _x: nt_xent(*z.chunk(2), tau),
                exp.pretrain.batch_size, samples, rounds, exp.pretrain.local_epochs, sent,
                optimizer_slots=2 if exp.pretrain.optimizer == "adam" else 1)
        summary = costs.summarize_client_costs(rows)
        write_json(out / "costs.json", {"per_client": rows, **summary,
                                        "code_rate": costs.DEFAULT_CODE_RATE,
                                        "probe_pairs": PROBE_PAIRS})
        info.update(summary)


if __name__ == "__main__":
    main_guard(run)
