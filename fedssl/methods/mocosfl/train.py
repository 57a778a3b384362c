"""MocoSFL / MonAcoSFL's recipe (:class:`fedssl.rounds.recipe.Recipe`): the seeded split nets,
the sync strategy and the split trainer, which the one builder makes a federation of and the
one runtime (:mod:`fedssl.methods.federated`) runs, with the run's monitor and outputs."""

from __future__ import annotations

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import LocalData, OptimizerConfig
from fedssl.fl.state import federation_config
from fedssl.methods.mocosfl import MocoSflParams, paper_layer
from fedssl.methods.mocosfl.nets import SplitNets, build_nets
from fedssl.methods.mocosfl.outputs import split_monitor, split_outputs
from fedssl.methods.mocosfl.schedule import ClientCosine, SflSchedule
from fedssl.methods.mocosfl.sync import SflSync
from fedssl.methods.mocosfl.trainer import SflConfig, SplitMocoTrainer
from fedssl.rounds.recipe import Recipe


def sfl_config(p: MocoSflParams) -> SflConfig:
    """The split trainer's settings of MocoSFL params ``p``."""
    t, m = p.federation, p.moco
    return SflConfig(
        temperature=m.temperature,
        momentum=m.momentum,
        symmetric=m.symmetric,
        sgd=OptimizerConfig("sgd", weight_decay=t.weight_decay, momentum=t.momentum),
        schedule=SflSchedule(
            batch_size=t.batch_size,
            seed=p.seed,
            sync_every=t.sync_every,
            sync_at_round_end=t.sync_at_round_end,
            log_every=t.log_every,
            client_cosine=ClientCosine(t.lr, t.client_lr_period or t.rounds)
            if t.client_lr_schedule == "step_cosine"
            else None,
            equal_steps=t.round_steps == "equal",
        ),
    )


def recipe(p: MocoSflParams) -> Recipe:
    """MocoSFL's recipe: the seeded split nets, the sync strategy and the split trainer (no
    local passes: clients and server step together every batch), its own k-NN monitor (of the
    split model, ``method.monitor``) and outputs (:mod:`.outputs`: the final model in two
    parts, the step log, the communication check; nothing is saved as one module). No
    ``strategy:`` choice is stacked: the split trainer exchanges activations, not the models a
    strategy moves."""
    t = p.federation
    align = p.variant == "monacosfl"
    return Recipe(
        config=federation_config(t, p.seed, t.lr_schedule),
        model=lambda shape, device: build_nets(p, shape, device),
        strategy=lambda cfg, nets, data: SflSync(cfg, nets, align, p.moco.queue_size, p.seed),
        trainer=lambda nets, strategy, data, parallel: split_trainer(p, nets, data, parallel),
        parallel=p.parallel_clients,
        monitor=lambda ctx, nets, device: split_monitor(ctx, p, nets, device),
        outputs=lambda run: split_outputs(p, run),
    )


def split_trainer(
    p: MocoSflParams, nets: SplitNets, data: LocalData, parallel: bool
) -> SplitMocoTrainer:
    """The split trainer of MocoSFL params ``p`` over ``data`` (two views of its image size),
    its clients vectorised where ``parallel``."""
    views = multi_view(BatchAugment(p.augment, data.images.shape[-1]), views=2)
    print(
        f"{p.variant}: cut {p.cut} (L{paper_layer(p)}), {len(data.clients)} clients, "
        f"{'vectorised' if parallel else 'one by one'}",
        flush=True,
    )
    return SplitMocoTrainer(nets, sfl_config(p), views, parallel=parallel)
