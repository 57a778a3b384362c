"""FedSimCLR's training and costs (imported when its stages run)."""
from __future__ import annotations

import torch
from torch.func import functional_call

from fedssl import costs
from fedssl.data.augment import BatchAugment, multi_view
from fedssl.data.catalog import IMAGE_SHAPES
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, vectorise_clients
from fedssl.fl.engine import Federation, LocalTraining, Strategy, federation_config, nbytes
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import nt_xent
from fedssl.models.encoders import (ContrastiveModel, save_contrastive_model,
                                    seeded_contrastive_model)
from fedssl.precision import autocast


def simclr_loss(temperature: float):
    def loss(model, params, buffers, batch):
        x = torch.cat(batch.views)
        with autocast(x):
            z = functional_call(model, (params, buffers), (x,))
        z1, z2 = z.float().chunk(2)
        return nt_xent(z1, z2, temperature, batch.valid)
    return loss


def make_federation(p, model: ContrastiveModel, data: LocalData, ckpt, fingerprint: str
                    ) -> Federation:
    """SimCLR on every client, FedAvg of the whole model weighted by data size."""
    cohort = CohortTrainer(
        model, multi_view(BatchAugment(p.augment, data.images.shape[-1]), views=2),
        simclr_loss(p.temperature),
        OptimizerConfig(kind=p.optimizer, weight_decay=p.weight_decay, momentum=p.momentum),
        batch_size=p.batch_size, local_epochs=p.local_epochs,
        parallel=vectorise_clients(p.parallel_clients, data.device))
    cfg = federation_config(p, p.seed, p.lr_schedule)
    return Federation(Strategy(cfg), LocalTraining(cohort), data, cfg, ckpt, fingerprint)


def pretrain(ctx) -> None:
    p = ctx.exp.method
    model = seeded_contrastive_model(p.model, ctx.image_shape, p.seed, ctx.device)
    fed = make_federation(p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)
    run_federation(ctx, fed, model)
    save_contrastive_model(model, ctx.out / "model.pt", ctx.image_shape)
    ctx.info["parameters"] = sum(q.numel() for q in model.parameters())


# ------------------------------------------------------------------ costs
def _client_costs(p, shape, samples: list[int], rounds: list[int], sent: list[int]):
    """Per-client costs of end-to-end FedSimCLR: the whole model both ways every round."""
    model = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).train()
    probe = costs.probe_batch(shape)
    return costs.e2e_client_costs(
        model, probe.chunk(2), lambda z, _x: nt_xent(*z.chunk(2), p.temperature),
        p.batch_size, samples, rounds, p.local_epochs, sent,
        optimizer_slots=2 if p.optimizer == "adam" else 1)


def client_costs(ctx) -> list[dict]:
    ledger = costs.ledger_of(ctx.input("pretrain"), [len(c) for c in ctx.clients()])
    return _client_costs(ctx.exp.method, ctx.image_shape, ledger.samples, ledger.rounds,
                         ledger.sent)


def projected_costs(exp, part, dataset: str) -> dict:
    """The average client at full scale: the model state down and up in each of its rounds."""
    p, shape = exp.method, IMAGE_SHAPES[dataset]
    n = costs.average_client_samples(part, dataset)
    rounds = round(p.client_fraction * p.rounds)
    state = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).state_dict()
    rows = _client_costs(p, shape, [n], [rounds], [2 * nbytes(state) * rounds])
    return costs.summarize_client_costs(rows)
