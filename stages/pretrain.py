"""Stage: federated pretraining of an experiment's network (resumable): FedSimCLR's encoder,
MFCL's phase-1 client autoencoder, or, for method 'none', just the seeded initialisation."""
from __future__ import annotations

from fedssl.data.store import image_shape, load_clients, load_split, to_device
from fedssl.fl.engine import write_round_log
from fedssl.methods import fedsimclr, mfcl
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir, partition_dir
from fedssl.runtime import torch_save
from fedssl.stage import main_guard, resume_path, stage_run
from stages.common import federate, parse_stage


def method_plan(exp, shape, device):
    """(initial model, rounds to run, the method's Federation factory)."""
    if exp.pretrain.method == "mfcl":
        return (mfcl.build_client_module(exp, shape, device), exp.mfcl.phase1.rounds,
                mfcl.make_phase1_federation)
    rounds = exp.pretrain.rounds if exp.pretrain.method == "fedsimclr" else 0
    return fedsimclr.build_model(exp, shape, device), rounds, fedsimclr.make_federation


def run(argv):
    dag, stage, name = parse_stage("pretrain", argv, "a params/experiments/<name>.yaml preset")
    exp = load_preset("experiment", name)
    part = load_preset("partition", exp.partition)
    rounds_log = f"{experiment_dir(name)}/rounds.tsv"
    with stage_run(dag, stage) as (_, out, device, info):
        shape = image_shape(data_dir(part.dataset))
        model, rounds, make_federation = method_plan(exp, shape, device)
        rows = []
        if rounds > 0:
            images, _ = load_split(data_dir(part.dataset), "train")
            clients = load_clients(partition_dir(exp.partition))
            fed = make_federation(exp, model, clients, to_device(images, device),
                                  resume_path(stage), dag.fingerprint(stage))
            rows = federate(fed, model, out, info, rounds_log)
        write_round_log(rows, rounds_log)
        torch_save({"model": model.state_dict(), "image_shape": shape}, out / "model.pt")
        info.update(rounds=len(rows), parameters=sum(p.numel() for p in model.parameters()),
                    final_loss=rows[-1]["loss"] if rows else None)
        if exp.pretrain.method == "mfcl":
            info.update(encoder_parameters=model.num_parameters("encoder"),
                        secure_aggregation=exp.mfcl.phase1.secure_aggregation)
    resume_path(stage).unlink(missing_ok=True)


if __name__ == "__main__":
    main_guard(run)
