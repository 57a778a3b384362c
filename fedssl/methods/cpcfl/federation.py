"""CP-CFL's cluster training: the pool's networks and their seeded starting states, the local
training (plain images, masked cross-entropy, the E_l,f phases of Tab. 7) and the federation
of :class:`fedssl.methods.cpcfl.pool.PoolStrategy` that runs them."""

from __future__ import annotations

import torch

from fedssl.data.augment import to_float
from fedssl.fl.cohort import LocalData, OptimizerConfig, forward
from fedssl.fl.state import FedState, federation_config, model_state
from fedssl.losses import masked_cross_entropy
from fedssl.methods.cpcfl.models import PoolModel, seeded
from fedssl.methods.cpcfl.pool import PoolStrategy
from fedssl.rounds.loop import Federation
from fedssl.rounds.recipe import Local, Recipe, Schedule, build_federation

Tensors = dict[str, torch.Tensor]


def cross_entropy(model, params, buffers, batch):
    """Mean CE over the real rows of a (padded) batch; views[0] are the plain images."""
    logits = forward(model, (params, buffers), batch.views[0])
    return masked_cross_entropy(logits, batch.labels, batch.valid)


def plain_views(batch: torch.Tensor, generator: torch.Generator):
    """No augmentation in the CFL stage (spec §3)."""
    return (to_float(batch),)


def build_net(p, image_shape, num_classes: int, device) -> PoolModel:
    return PoolModel(p.encoder, p.federation.head, image_shape, num_classes).to(device)


def initial_pool(
    p, image_shape, num_classes: int, device, attempt: int, encoder: Tensors | None
) -> list[Tensors]:
    """N seeded models: fully random (no encoder given: IFCA (None), FedAvg (None)), or the
    given encoder with a random head each."""
    pool = []
    for n in range(p.federation.clusters):
        what = "model" if encoder is None else "head"
        net = seeded(
            lambda: build_net(p, image_shape, num_classes, device), p.seed, what, attempt, n
        )
        state = model_state(net)
        if encoder is not None:
            state.update({k: v.clone().to(device) for k, v in encoder.items()})
        pool.append(state)
    return pool


def make_federation(
    p,
    data: LocalData,
    image_shape,
    num_classes,
    pool,
    ckpt,
    fingerprint,
    attempt=0,
    tests=None,
    true_groups=None,
) -> Federation:
    """The pool ``pool`` trained on ``data`` with method params ``p`` (attempt ``attempt`` of
    the trial; ``tests`` and ``true_groups``: see :class:`PoolStrategy`)."""
    train_net = build_net(p, image_shape, num_classes, data.device).train()
    recipe = pool_recipe(p, image_shape, num_classes, pool, attempt, tests, true_groups)
    return build_federation(recipe, train_net, data, ckpt, fingerprint)


def pool_recipe(p, image_shape, num_classes, pool, attempt, tests, true_groups) -> Recipe:
    """The pool's strategy (scoring with a network of its own, in eval mode) and the local
    phases of a client's round."""

    def strategy(cfg, net: PoolModel, data: LocalData) -> PoolStrategy:
        eval_net = build_net(p, image_shape, num_classes, data.device).eval()
        return PoolStrategy(cfg, data, p.federation, pool, eval_net, attempt, tests, true_groups)

    return Recipe(
        config=federation_config(p.federation, p.seed),
        strategy=strategy,
        phases=local_phases(p),
        parallel=p.parallel_clients,
    )


def local_phases(p):
    """A round's local phases. E_l,f (Tab. 7): the first E_l,f local epochs train the whole
    model, the others the heads only (a fresh Adam state); the round's loss is the mean over
    all E_l epochs. While the strategy restricts training (t < T_c), every epoch trains that
    subset in one pass."""
    c = p.federation
    e = c.local_epochs
    ef = e if c.encoder_epochs is None else c.encoder_epochs

    def local(epochs: int, **phase) -> Local:
        return Local(
            views=lambda size: plain_views,
            batch_size=c.batch_size,
            local_epochs=epochs,
            optimizer=OptimizerConfig("adam", eps=c.adam_eps),
            step_loss=cross_entropy,
            **phase,
        )

    def phases(net: PoolModel, strategy: PoolStrategy) -> Schedule:
        heads = {k for k, _ in net.named_parameters() if k.startswith("head.")}
        split = []
        for n, names in ((ef, None), (e - ef, heads)):
            if n:
                only = None if names is None else (lambda s, names=names: names)
                split.append(
                    local(n, trainable=only, seed_tag=("phase", len(split)), loss_weight=n)
                )

        def pick(state: FedState) -> str:
            return "whole" if ef == e or strategy.trainable(state) is not None else "split"

        return Schedule({"whole": [local(e)], "split": split}, pick)

    return phases


def warmup_params(p):
    """FedAvg (None) with this experiment's local settings and seed: the same settings (and so
    the same model) as the FedAvg (None) experiment of the trial."""
    cfl = p.federation.model_copy(
        update={
            "clusters": 1,
            "explore_rounds": 0,
            "encoder_epochs": None,
            "global_encoder": False,
            "restarts": 0,
            "rounds": p.warmup_rounds or p.federation.rounds,
        }
    )
    return p.model_copy(update={"pretrain": "none", "federation": cfl})
