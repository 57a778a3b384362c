"""Where CP-CFL's pool takes its encoder from: the server's pretrained one (step ``pretrain``;
its public slice must be no client's data; its relevance to the clients' data, Tab. 5), or, for
IFCA (FedAvg), the global model of FedAvg (None) run on the same clients first (the same seeded
code path as that experiment, so the same model). IFCA (None) and FedAvg take none."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedssl.data.augment import to_float
from fedssl.eval.metrics import relevance_score
from fedssl.fl.state import FedState, model_state, write_round_log
from fedssl.methods.cpcfl.federation import build_net, initial_pool, make_federation, warmup_params
from fedssl.methods.cpcfl.pretrain import ENCODER_FILE, PUBLIC_FILE
from fedssl.methods.cpcfl.trials import run_rounds
from fedssl.stage.runtime import StageFailed, numpy_rng

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

Tensors = dict[str, torch.Tensor]


def pretrained_encoder(
    ctx: StepContext, data, image_shape, num_classes: int
) -> tuple[Tensors, dict]:
    """The pretrained encoder (as the pool model's keys) and the report's numbers on it: its
    relevance score and the linear-probe accuracy that chose it."""
    p, device = ctx.exp.method, ctx.device
    saved = torch.load(ctx.input("pretrain") / ENCODER_FILE, map_location=device, weights_only=True)
    encoder = {f"encoder.{k}": v for k, v in saved["encoder"].items()}
    public = np.load(ctx.input("pretrain") / PUBLIC_FILE)
    if p.ssl.public.split == "train":
        check_disjoint(ctx, public, data.clients)
    net = build_net(p, image_shape, num_classes, device)
    net.load_state_dict({**model_state(net), **encoder})
    score = relevance(ctx, net.encoder, public, data.clients, p.relevance_samples, device)
    selection = json.loads((ctx.input("pretrain") / "selection.json").read_text())
    return encoder, {
        "relevance": round(score, 4),
        "encoder_linear_top1": selection["chosen"]["linear_top1"],
    }


def fedavg_warmup(
    ctx: StepContext, data, image_shape, num_classes: int
) -> tuple[Tensors, FedState]:
    """IFCA (FedAvg)'s encoder and the warm-up's final state (its traffic counts too)."""
    w = warmup_params(ctx.exp.method)
    pool = initial_pool(w, image_shape, num_classes, ctx.device, 0, None)
    fed = make_federation(
        w,
        data,
        image_shape,
        num_classes,
        pool,
        ctx.resume_path.with_suffix(".warmup.pt"),
        ctx.fingerprint + "/warmup",
    )
    state = run_rounds(fed, ctx.out / "warmup_rounds.tsv", "FedAvg warm-up")
    write_round_log(state.log, ctx.out / "warmup_rounds.tsv")
    encoder = {k: v for k, v in fed.strategy.final_model(state).items() if k.startswith("encoder.")}
    torch.save(encoder, ctx.out / "warmup_encoder.pt")
    return encoder, state


def check_disjoint(ctx: StepContext, public: np.ndarray, clients: list[np.ndarray]) -> None:
    held = np.intersect1d(public, np.concatenate(clients))
    if held.size:
        raise StageFailed(
            f"{ctx.name}: {held.size} images of the public pretraining slice are also client "
            f"data: give partition '{ctx.exp.partition}' server_holdout = ssl.public.size and "
            f"server_holdout_seed = ssl.public.seed"
        )


def relevance(
    ctx: StepContext, encoder_net, public: np.ndarray, clients: list[np.ndarray], n: int, device
) -> float:
    """§4.9's relevance score: n public images and n client images through the pretrained
    encoder, mean cosine similarity over all n x n cross pairs."""
    rng = numpy_rng(ctx.exp.method.seed, "relevance")
    pub_images, _ = ctx.split(ctx.exp.method.ssl.public.split)
    train_images, _ = ctx.split("train")
    pool = np.unique(np.concatenate(clients))
    a = np.sort(rng.choice(public, min(n, len(public)), replace=False))
    b = np.sort(rng.choice(pool, min(n, len(pool)), replace=False))
    encoder_net.eval()
    with torch.no_grad():
        fa = encoder_net(to_float(torch.from_numpy(np.asarray(pub_images[a])).to(device)))
        fb = encoder_net(to_float(torch.from_numpy(np.asarray(train_images[b])).to(device)))
    return relevance_score(fa, fb)
