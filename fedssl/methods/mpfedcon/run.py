"""MpFedcon's `train` step: the variant's network, strategy and local schedule wired into a
federation (the training pieces are in :mod:`.train`, the personalised baselines' in
:mod:`.personalised`)."""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import torch

from fedssl.data.augment import views_of
from fedssl.eval.personal import (
    PersonalLog,
    client_outputs,
    validation_accuracy,
    validation_images,
)
from fedssl.fl.cohort import LocalData, OptimizerConfig
from fedssl.fl.state import federation_config, nbytes
from fedssl.methods.mpfedcon import HEAD_FIRST, PERSONALISED, personalised
from fedssl.methods.mpfedcon.nets import Anchored, build_net
from fedssl.methods.mpfedcon.train import (
    SplitStrategy,
    TestData,
    ce_loss,
    contrast_loss,
    test_data,
)
from fedssl.rounds.loop import Federation, Phase
from fedssl.rounds.recipe import Local, Recipe, build_federation
from fedssl.rounds.runner import run_federation, train_data
from fedssl.stage.runtime import StageFailed, derive_seed, torch_save
from fedssl.strategies.compose import chosen_over

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


# ------------------------------------------------------------------ wiring
def seeded_model(p, image_shape, num_classes: int, device) -> Anchored:
    torch.manual_seed(derive_seed(p.seed, "init", "mpfedcon-net"))
    return personalised.with_companion(
        p, Anchored(build_net(p, image_shape, num_classes), num_classes)
    ).to(device)


def make_strategy(
    p, model: Anchored, tests: TestData | None, data: LocalData | None = None
) -> SplitStrategy:
    """The variant's protocol: SCAFFOLD, APFL, Ditto and Per-FedAvg their own, the rest the
    split strategy (shared layers averaged, personal kept, MpFedcon's class centres) under the
    params' ``strategy`` choice (FedProx)."""
    cfg = federation_config(p.federation, p.seed)
    if p.variant in PERSONALISED:
        return personalised.STRATEGIES[p.variant](cfg, p, model, tests, data)
    return chosen_over(SplitStrategy(cfg, p, model, tests, data), p.federation)


def local_phases(p, model: Anchored, strategy: SplitStrategy) -> list[Local]:
    """The variant's local schedule: head epochs (CE) then body epochs (CE, or CE + mu l_con
    for MpFedcon), or the whole network together (CE), or a personalised baseline's own
    phases; the others' losses go through the strategy's local objective (FedProx's term)."""
    clip = p.scaffold_clip_norm if p.variant == "scaffold" else None
    fed = p.federation
    opt = OptimizerConfig(
        "sgd", weight_decay=fed.weight_decay, momentum=fed.momentum, clip_norm=clip
    )

    def local(loss, epochs: int, batch_size=fed.batch_size, after_step=None, **phase) -> Local:
        return Local(
            views=lambda size: views_of(p),
            batch_size=batch_size,
            local_epochs=epochs,
            optimizer=opt,
            step_loss=loss,
            after_step=None if after_step is None else (lambda model: after_step),
            **phase,
        )

    if p.variant in PERSONALISED:  # SCAFFOLD, APFL, Ditto, Per-FedAvg: objectives of their own
        schedule = personalised.local_schedule(p, strategy, partial(local, own_objective=True))
        return [as_local(phase) for phase in schedule]
    if p.variant in HEAD_FIRST:
        body = contrast_loss(p.mu, p.temperature) if p.variant == "mpfedcon" else ce_loss()
        return [
            local(ce_loss(), p.head_epochs, trainable=lambda s: strategy.personal_params),
            local(body, p.body_epochs, trainable=lambda s: strategy.shared_params),
        ]
    return [local(ce_loss(), p.body_epochs, trainable=lambda s: strategy.net_params)]


def as_local(phase: Phase) -> Local:
    """A phase of :func:`personalised.local_schedule` (a pass, which parameters it trains, its
    seed tag) as one pass of the recipe."""
    return replace(phase.cohort, trainable=phase.trainable, seed_tag=phase.seed_tag)


def make_federation(
    p, model: Anchored, data: LocalData, tests: TestData, ckpt, fingerprint: str
) -> Federation:
    """The variant's strategy and local schedule over the parties' data."""
    recipe = Recipe(
        config=federation_config(p.federation, p.seed),
        strategy=lambda cfg, model, data: make_strategy(p, model, tests, data),
        phases=lambda model, strategy: local_phases(p, model, strategy),
        parallel=p.federation.parallel_clients,
    )
    return build_federation(recipe, model, data, ckpt, fingerprint)


def num_classes_of(ctx: StepContext) -> int:
    _, train_labels = ctx.split("train")
    _, test_labels = ctx.split("test")
    return int(max(train_labels.max(), test_labels.max())) + 1


def interned(tree):
    """``tree`` with every string interned. Pickle writes a string once per object, so equal
    strings must be one object for a resumed run (whose keys came from its checkpoint) to save
    the very bytes of an uninterrupted one."""
    if isinstance(tree, dict):
        return {interned(k): interned(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(interned(v) for v in tree)
    return sys.intern(tree) if isinstance(tree, str) else tree


def federation(ctx: StepContext) -> tuple[Anchored, Federation]:
    """The ``train`` step's network and federation (what a Flower client builds too)."""
    p = ctx.exp.method
    model = seeded_model(p, ctx.image_shape, num_classes_of(ctx), ctx.device)
    tests = test_data(ctx)
    return model, make_federation(
        p, model, train_data(ctx), tests, ctx.resume_path, ctx.fingerprint
    )


def flower_federation(ctx: StepContext) -> tuple[Anchored, Federation]:
    """:func:`federation` for a Flower client. SCAFFOLD does not map: its clients compute
    their new control variate from the server's current state (global model and control),
    which only the engine's shared state gives them."""
    if ctx.exp.method.variant == "scaffold":
        raise StageFailed(
            "MpFedcon's variant 'scaffold' cannot run as a Flower app: its clients read the "
            "server's current control variate and global model from the engine's state"
        )
    return federation(ctx)


def train(ctx: StepContext) -> None:
    """The ``train`` step: run the federation (resumable), then save every party's final
    model and the personalised-evaluation record (``personal.npz``)."""
    p = ctx.exp.method
    model, fed = federation(ctx)
    state = run_federation(ctx, fed, model)
    strategy: SplitStrategy = fed.strategy
    score, t = strategy.scorer(state, state.round - 1), strategy.tests
    accs, labels, probs = client_outputs(score, t.images, t.labels, t.clients)
    val = validation_accuracy(score, validation_images(ctx))
    PersonalLog(state.memo).save(ctx.out / "personal.npz", labels, probs, val)
    torch_save(
        interned(
            {
                "global": state.server["global"],
                "centres": state.server["centres"],
                "clients": state.clients,
                "final_accuracy": accs,
            }
        ),
        ctx.out / "models.pt",
    )
    glob = state.server["global"]
    ctx.info.update(
        variant=p.variant,
        shared_layers=list(p.shared_layers),
        classes=num_classes_of(ctx),
        parameters=sum(v.numel() for v in glob.values()),
        shared_parameters=sum(glob[k].numel() for k in strategy.shared),
        personal_parameters=sum(glob[k].numel() for k in strategy.personal),
        shared_bytes=nbytes({k: glob[k] for k in strategy.shared}),
        centre_bank_bytes=nbytes(state.server["centres"]) if strategy.centres else 0,
    )
