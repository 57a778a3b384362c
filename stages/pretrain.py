"""Stage: federated self-supervised pretraining of an experiment's encoder (resumable)."""
from __future__ import annotations

import torch

from fedssl.data.store import image_shape, load_clients, load_split, to_device
from fedssl.fl.engine import write_round_log
from fedssl.methods import fedsimclr
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir, partition_dir
from fedssl.runtime import torch_save, write_json
from fedssl.stage import main_guard, resume_path, stage_run
from stages.common import parse_stage


def run(argv):
    dag, stage, name = parse_stage("pretrain", argv, "a params/experiments/<name>.yaml preset")
    exp = load_preset("experiment", name)
    part = load_preset("partition", exp.partition)
    rounds_log = f"{experiment_dir(name)}/rounds.tsv"
    with stage_run(dag, stage) as (_, out, device, info):
        shape = image_shape(data_dir(part.dataset))
        model = fedsimclr.build_model(exp, shape, device)
        rows = []
        if exp.pretrain.method == "fedsimclr" and exp.pretrain.rounds > 0:
            images, _ = load_split(data_dir(part.dataset), "train")
            clients = load_clients(partition_dir(exp.partition))
            fed = fedsimclr.make_federation(exp, model, clients, to_device(images, device),
                                            resume_path(stage), dag.fingerprint(stage))
            state = fed.start(model)
            info["resumed_from_round"] = state.round
            state = fed.run(state, on_round=lambda s: (write_round_log(s.log, rounds_log),
                                                       print(_progress(s), flush=True)))
            model.load_state_dict({**state.params, **state.buffers})
            rows = state.log
            write_json(out / "communication.json", state.ledger.summary())
        write_round_log(rows, rounds_log)
        torch_save({"model": model.state_dict(), "image_shape": shape}, out / "model.pt")
        info["rounds"] = len(rows)
        info["parameters"] = sum(p.numel() for p in model.parameters())
    resume_path(stage).unlink(missing_ok=True)


def _progress(state) -> str:
    r = state.log[-1]
    return (f"round {r['round']}: loss {r['loss']:.4f}, {r['clients']} clients, "
            f"{r['images_per_s']:.0f} img/s")


if __name__ == "__main__":
    main_guard(run)
