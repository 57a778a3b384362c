"""Stage: MFCL phase-2 upload. Every client that does not drop out sends rho pairs of twin
views per local sample through the frozen client module + MaxPool, once. Stored as fp16
arrays (one per client) with the bytes each client sent and the paper-convention bits."""
from __future__ import annotations

import numpy as np
import torch

from fedssl.costs import phase2_bits
from fedssl.data.augment import BatchAugment
from fedssl.data.store import image_shape, load_clients, load_split, to_device
from fedssl.methods import mfcl
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir, partition_dir
from fedssl.runtime import write_json
from fedssl.stage import main_guard, stage_run
from stages.common import parse_stage


def run(argv):
    dag, stage, name = parse_stage("export", argv, "an mfcl params/experiments/<name>.yaml")
    exp = load_preset("experiment", name)
    part = load_preset("partition", exp.partition)
    ex = exp.mfcl.export
    with stage_run(dag, stage) as (_, out, device, info):
        shape = image_shape(data_dir(part.dataset))
        model = mfcl.build_client_module(exp, shape, device)
        ckpt = torch.load(f"{experiment_dir(name)}/pretrain/model.pt", map_location=device)
        model.load_state_dict(ckpt["model"])
        images, _ = load_split(data_dir(part.dataset), "train")
        images = to_device(images, device)
        clients = load_clients(partition_dir(exp.partition))
        dropped = mfcl.dropped_clients(len(clients), ex.client_dropout, exp.pretrain.seed)
        augment = BatchAugment(exp.pretrain.augment, shape[-1])
        per_client = []
        for m, idx in enumerate(clients):
            row = {"client": m, "samples": len(idx), "dropped": m in dropped, "bytes_sent": 0,
                   "numel_sent": 0, "bits_paper": 0.0}
            if m not in dropped:
                reps = mfcl.export_client(model, images, idx, augment, ex.pairs, ex.batch_pairs,
                                          exp.pretrain.seed, m, ex.bn_export_mode,
                                          ex.tn_pairing)
                np.save(out / f"client_{m}.npy", reps.numpy())
                np.save(out / f"client_{m}_index.npy", np.asarray(idx))
                row.update(bytes_sent=reps.numel() * reps.element_size(),
                           numel_sent=reps.numel(), shape=list(reps.shape),
                           bits_paper=phase2_bits(mfcl.pre_pool_numel(model, shape), len(idx),
                                                  ex.pairs))
            per_client.append(row)
            print(f"client {m}: " + ("dropped, sends nothing" if m in dropped
                                     else f"{row['bytes_sent']} bytes"), flush=True)
        manifest = {"pairs": ex.pairs, "dtype": "float16", "dropped_clients": dropped,
                    "bn_export_mode": ex.bn_export_mode, "tn_pairing": ex.tn_pairing,
                    "per_client": per_client,
                    "total_bytes_sent": sum(r["bytes_sent"] for r in per_client)}
        write_json(out / "manifest.json", manifest)
        info.update(dropped_clients=dropped, total_bytes_sent=manifest["total_bytes_sent"])


if __name__ == "__main__":
    main_guard(run)
