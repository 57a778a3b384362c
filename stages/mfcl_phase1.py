"""Stage: MFCL phase 1 (the `pretrain__` stage of an mfcl experiment): the client autoencoder,
federated by the gServer with FedAvg (optionally secure aggregation); resumable."""
from __future__ import annotations

from fedssl.data.store import image_shape, load_clients, load_split, to_device
from fedssl.fl.engine import write_round_log
from fedssl.methods import mfcl
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir, partition_dir
from fedssl.runtime import torch_save, write_json
from fedssl.stage import main_guard, resume_path, stage_run
from stages.common import parse_stage


def run(argv):
    dag, stage, name = parse_stage("pretrain", argv, "an mfcl params/experiments/<name>.yaml")
    exp = load_preset("experiment", name)
    part = load_preset("partition", exp.partition)
    rounds_log = f"{experiment_dir(name)}/rounds.tsv"
    with stage_run(dag, stage) as (_, out, device, info):
        shape = image_shape(data_dir(part.dataset))
        model = mfcl.build_client_module(exp, shape, device)
        rows = []
        if exp.mfcl.phase1.rounds > 0:
            images, _ = load_split(data_dir(part.dataset), "train")
            clients = load_clients(partition_dir(exp.partition))
            fed = mfcl.make_phase1_federation(exp, model, clients, to_device(images, device),
                                              resume_path(stage), dag.fingerprint(stage))
            state = fed.start(model)
            info["resumed_from_round"] = state.round
            state = fed.run(state, on_round=lambda s: (
                write_round_log(s.log, rounds_log),
                print(f"round {s.log[-1]['round']}: AE loss {s.log[-1]['loss']:.4f}",
                      flush=True)))
            model.load_state_dict({**state.params, **state.buffers})
            rows = state.log
            write_json(out / "communication.json", state.ledger.summary())
        write_round_log(rows, rounds_log)
        torch_save({"model": model.state_dict(), "image_shape": shape}, out / "model.pt")
        info.update(rounds=len(rows), parameters=model.num_parameters(),
                    encoder_parameters=model.num_parameters("encoder"),
                    ae_loss=[round(r["loss"], 5) for r in rows],
                    secure_aggregation=exp.mfcl.phase1.secure_aggregation)
    resume_path(stage).unlink(missing_ok=True)


if __name__ == "__main__":
    main_guard(run)
