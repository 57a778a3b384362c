"""Stage: MFCL phase 2b. The rServer trains the remaining ResNet stages + projection head
(BN, NT-Xent, LARS with warmup + cosine) on the exported pairs of the clients that sent them;
resumable per epoch."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedssl.methods import mfcl
from fedssl.params import load_preset
from fedssl.pipeline import experiment_dir
from fedssl.runtime import torch_save, write_tsv
from fedssl.stage import main_guard, resume_path, stage_run
from stages.common import parse_stage


EPOCH_FIELDS = ["epoch", "loss", "lr", "seconds"]


def run(argv):
    dag, stage, name = parse_stage("rserver", argv, "an mfcl params/experiments/<name>.yaml")
    exp = load_preset("experiment", name)
    export = Path(experiment_dir(name)) / "export"
    manifest = json.loads((export / "manifest.json").read_text())
    sent = [c["client"] for c in manifest["per_client"] if not c["dropped"]]
    log_path = f"{experiment_dir(name)}/rserver_epochs.tsv"
    with stage_run(dag, stage) as (_, out, device, info):
        reps = torch.cat([torch.from_numpy(np.load(export / f"client_{m}.npy")) for m in sent])
        reps = reps.to(device)
        model = mfcl.build_rserver(exp, reps.shape[3], device)
        log = mfcl.train_rserver(model, reps, exp.mfcl.rserver, resume_path(stage),
                                 dag.fingerprint(stage), on_epoch=lambda rows: (
                                     write_tsv(rows, log_path, EPOCH_FIELDS),
                                     print(f"epoch {rows[-1]['epoch']}: NT-Xent "
                                           f"{rows[-1]['loss']:.4f}", flush=True)))
        write_tsv(log, log_path, EPOCH_FIELDS)
        torch_save({"model": model.state_dict(), "in_channels": int(reps.shape[3])},
                   out / "model.pt")
        info.update(samples=int(reps.shape[0]), clients=sent, epochs=len(log),
                    loss=[round(r["loss"], 4) for r in log],
                    parameters=sum(p.numel() for p in model.parameters()))
    resume_path(stage).unlink(missing_ok=True)


if __name__ == "__main__":
    main_guard(run)
