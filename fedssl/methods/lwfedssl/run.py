"""Training and evaluation encoder of the LW-FedSSL family (imported when its stages run;
client costs: :mod:`fedssl.methods.lwfedssl.costs`).

One code path for the four methods: their params say what differs (``plan(s)``, Tab. 2: what
a client trains, downloads and uploads at stage s; ``settings(s)``, ``stage_alpha(s)``,
``calibrates``, ``growth_stages()``); :class:`GrowthStrategy` turns the plan into the engine's
hooks, with LW-FedSSL's calibration as the server step."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, forward
from fedssl.fl.state import (
    FederationConfig,
    FedState,
    RoundUpdates,
    cosine_lr,
    federation_config,
    sample_clients,
)
from fedssl.methods.lwfedssl import GrowthPlan
from fedssl.models.encoders import frozen
from fedssl.models.heads import moco_v3_predictor, moco_v3_projector
from fedssl.models.mocov3 import MocoV3Learner, ema_pairs, online_state, round_start_state
from fedssl.models.momentum import ema_after_step
from fedssl.models.vit import VisionTransformer
from fedssl.rounds.loop import Federation
from fedssl.rounds.recipe import Local, Recipe, build_federation
from fedssl.rounds.runner import run_federation, train_data
from fedssl.stage.runtime import derive_seed, torch_generator, torch_save, write_json
from fedssl.strategies.base import Strategy

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

Tensors = dict[str, torch.Tensor]


# ============================================================================ schedule
def all_rounds(p) -> list[int]:
    """The round counts of the steps' stages, in order (the cosine schedule spans them all)."""
    return [p.settings(s).rounds for s in p.growth_stages()]


# ============================================================================ models
def input_size(p, image_shape) -> int:
    return p.vit.input_size or int(image_shape[-1])


def build_vit(p, image_shape, depth: int) -> VisionTransformer:
    v = p.vit
    return VisionTransformer(
        image_size=input_size(p, image_shape),
        patch_size=v.patch_size,
        in_channels=int(image_shape[0]),
        width=v.width,
        depth=depth,
        heads=v.heads,
        mlp_ratio=v.mlp_ratio,
        pool=v.pool,
    )


def initial_online(p, image_shape, depth: int) -> nn.Module:
    """The seeded initial F (``depth`` blocks), H and P; FedMoCo and Scratch start from the
    full-depth one, the growing methods from one block."""
    torch.manual_seed(derive_seed(p.seed, "init", "vit"))
    return nn.ModuleDict(
        {
            "encoder": build_vit(p, image_shape, depth),
            "projector": moco_v3_projector(p.vit.width, p.vit.head_hidden, p.vit.head_out),
            "predictor": moco_v3_predictor(p.vit.head_out, p.vit.head_hidden, p.vit.head_out),
        }
    )


def load_online(p, image_shape, path: Path, device) -> nn.Module:
    saved = torch.load(path, map_location=device, weights_only=True)
    model = initial_online(p, image_shape, saved["depth"]).to(device)
    model.load_state_dict(saved["online"])
    return model


def save_online(model_state: Tensors, depth: int, image_shape, path: Path) -> None:
    torch_save(
        {
            "online": {k: v.detach().cpu() for k, v in model_state.items()},
            "depth": depth,
            "image_shape": tuple(image_shape),
        },
        path,
    )


def grown(p, model: nn.Module, s: int) -> nn.Module:
    """Stage s's model from stage s-1's: block s appended, a copy of block s-1 (weight
    transfer) or freshly initialised from a seed of its own."""
    torch.manual_seed(derive_seed(p.seed, "block", s))
    vit = model["encoder"]
    if p.weight_transfer:
        vit.add_block()
    else:
        last = vit.blocks[-1]
        vit.blocks.append(vit._new_block().to(last.norm1.weight.device))
        vit.depth = len(vit.blocks)
    return model


def learner_of(
    p, model: nn.Module, s: int | None, plan: GrowthPlan, server: bool = False
) -> MocoV3Learner:
    """The MoCo v3 learner at stage s: frozen prefix = the blocks a layer-wise client does not
    train; the server's calibration trains everything, without alignment."""
    alpha = 0.0 if server else p.stage_alpha(s)
    prefix = (s - 1) if (plan.trains == "last" and plan.grows and not server) else 0
    return MocoV3Learner(
        model["encoder"],
        model["projector"],
        model["predictor"],
        p.settings(s).temperature,
        alpha,
        prefix,
    )


# ============================================================================ training
def learner_loss(model, params, buffers, batch):
    v1, v2 = batch.views
    return forward(model, (params, buffers), v1, v2, batch.valid).float()


def kind_of(key: str) -> str:
    """Traffic kind of an online tensor: encoder ``blocks``, the input ``embedding`` (patch
    projection, CLS token) or ``heads`` (H, P and the final LayerNorm sent with them)."""
    if key.startswith("encoder.blocks."):
        return "blocks"
    if key.startswith(("encoder.patch_embed.", "encoder.cls_token")):
        return "embedding"
    return "heads"


def block_of(key: str) -> int | None:
    return int(key.split(".")[2]) if key.startswith("encoder.blocks.") else None


def select(keys, which: str, s: int | None, plan: GrowthPlan) -> list[str]:
    """The online tensors ``which`` ("all" / "last") covers at stage s: the newest block and
    the heads, with the embedding in stage 1; or everything present."""
    if which == "all" or not plan.grows:
        return list(keys)
    return [
        k
        for k in keys
        if kind_of(k) == "heads" or block_of(k) == s - 1 or (s == 1 and kind_of(k) == "embedding")
    ]


def trained_names(learner: nn.Module, plan: GrowthPlan, s: int | None) -> set[str]:
    """The parameters a client trains at stage s (Tab. 2's active layers and the heads)."""
    params = {k for k, _ in learner.named_parameters()}
    return {
        k for k in select(online_state(learner.state_dict()), plan.trains, s, plan) if k in params
    }


class Calibrator:
    """LW-FedSSL's server-side calibration (Alg. 3): end-to-end MoCo v3 on the server's
    unlabelled data, with the same trainer settings as the clients (a cohort of one)."""

    def __init__(self, cohort: CohortTrainer, data: LocalData, seed: int, stage: int):
        self.cohort, self.data, self.seed, self.stage = cohort, data, seed, stage
        self.trainable = {
            k
            for k, _ in cohort.model.named_parameters()
            if k.startswith(("encoder.", "projector.", "predictor."))
        }

    def __call__(self, online: Tensors, round_: int, lr: float) -> tuple[Tensors, float]:
        start = round_start_state(online, alpha=False)
        gen = torch_generator(self.data.device, self.seed, "calibrate", self.stage, round_)
        trained, losses = self.cohort.train(
            [start],
            self.data,
            [0],
            lr,
            (self.seed, "calibrate", self.stage, round_),
            gen,
            self.trainable,
        )
        return online_state({k: v[0] for k, v in trained.items()}), float(losses[0])


class GrowthStrategy(Strategy):
    """The hooks of one stage of a plan: which tensors train and travel, FedAvg of what came
    back, the learning rate at the stage's place in the whole schedule, and calibration."""

    def __init__(
        self,
        cfg: FederationConfig,
        plan: GrowthPlan,
        stage: int | None,
        learner: MocoV3Learner,
        weight_transfer: bool,
        offset: int,
        horizon: int,
        lr_schedule: str,
        calibrate: Calibrator | None = None,
        timing: str = "round_start",
    ):
        super().__init__(cfg)
        self.plan, self.stage = plan, stage
        self.alpha = learner.global_encoder is not None
        online_keys = list(online_state(learner.state_dict()))
        s = stage
        self.down = select(online_keys, plan.downloads, s, plan)
        self.up = select(online_keys, plan.uploads, s, plan)
        self.train = trained_names(learner, plan, s)
        # What froze at the end of the previous stage and a client does not hold yet: the
        # embedding's last aggregate (after stage 1), and without weight transfer the previous
        # block's (with it, the new block arrives as that very copy).
        self.catch_up: list[str] = []
        if plan.grows and plan.downloads == "last" and s and s > 1:
            self.catch_up = [
                k
                for k in online_keys
                if (s == 2 and kind_of(k) == "embedding")
                or (not weight_transfer and block_of(k) == s - 2)
            ]
        self.offset, self.horizon, self.lr_schedule = offset, horizon, lr_schedule
        self.calibrate, self.timing = calibrate, timing

    # ------------------------------------------------------------------ schedule
    def lr(self, round_: int) -> float:
        if self.lr_schedule == "cosine":
            return cosine_lr(self.cfg.lr, self.offset + round_, self.horizon)
        if self.lr_schedule == "cyclic":
            return cosine_lr(self.cfg.lr, round_, self.cfg.rounds)
        return self.cfg.lr

    def sample(self, state: FedState, round_: int) -> list[int]:
        return sample_clients(
            state.num_clients,
            self.cfg.client_fraction,
            self.cfg.seed,
            self.offset + round_,
        )

    # ------------------------------------------------------------------ server
    def init_server(self, model: nn.Module) -> dict[str, Tensors]:
        """``model`` is the learner: the server keeps its online part."""
        server = {"global": online_state(model.state_dict())}
        if self.calibrate and self.timing == "round_start":  # before the stage's first round
            self._calibrate(server, 0, self.lr(0), None)
        return server

    def _calibrate(self, server: dict, round_: int, lr: float, state: FedState | None):
        server["global"], loss = self.calibrate(server["global"], round_, lr)
        self._last_calibration = loss

    def server_step(self, state: FedState, round_: int) -> None:
        self._last_calibration = None
        if not self.calibrate:
            return
        if self.timing == "round_end":
            self._calibrate(state.server, round_, self.lr(round_), state)
        elif round_ + 1 < self.cfg.rounds:  # before the next round of this stage
            self._calibrate(state.server, round_ + 1, self.lr(round_ + 1), state)

    def final_model(self, state: FedState) -> Tensors:
        """The learner's whole state (its online part the global model)."""
        return round_start_state(state.server["global"], self.alpha)

    def evaluate(self, state: FedState, round_: int) -> dict | None:
        loss = getattr(self, "_last_calibration", None)
        return None if loss is None else {"calibration_loss": round(loss, 5)}

    # ------------------------------------------------------------------ clients
    def download(self, state: FedState, client: int) -> Tensors:
        g = state.server["global"]
        keys = self.down + (self.catch_up if state.round == 0 else [])
        return {k: g[k] for k in keys}

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        # What a client did not receive it holds already: the frozen blocks it got (or grew)
        # in earlier stages, which the server has not changed since (no calibration).
        return round_start_state({**state.server["global"], **received}, self.alpha)

    def trainable(self, state: FedState) -> set[str]:
        return self.train

    def upload(self, state: FedState, client: int, trained: Tensors) -> Tensors:
        return {k: trained[k] for k in self.up}

    def traffic(self, tensors: Tensors) -> dict[str, Tensors]:
        kinds: dict[str, Tensors] = {}
        for k, v in tensors.items():
            kinds.setdefault(kind_of(k), {})[k] = v
        return kinds

    def needs_uploads(self) -> bool:
        return False  # FedAvg of what came back: summed as the clients finish

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        state.server["global"] = {**state.server["global"], **self.mean(updates)}


CALIBRATION_SHIFTS = {  # ``calibration.shift``: a fixed transform of uint8 [N, C, H, W] images
    "invert": lambda x: 255 - x,
    "rotate90": lambda x: torch.rot90(x, 1, dims=(-2, -1)),
}


def calibration_set(clients: LocalData, indices: np.ndarray, shift: str) -> LocalData:
    """D^g: the server holdout (``indices`` into the clients' image tensor), as drawn (on that
    very tensor) or a shifted copy of its images."""
    if shift == "none":
        return LocalData(clients.images, clients.labels, [indices])
    height, width = clients.images.shape[-2:]
    if shift == "rotate90" and height != width:
        raise ValueError(f"calibration.shift rotate90 needs square images, not {height}x{width}")
    picked = torch.as_tensor(indices, device=clients.device)
    images = CALIBRATION_SHIFTS[shift](clients.images[picked]).contiguous()
    return LocalData(images, clients.labels[picked], [np.arange(len(indices))])


def server_data(ctx: StepContext, clients: LocalData) -> LocalData:
    """The calibration set: the partition's server holdout, shifted as the params say."""
    shift = ctx.exp.method.calibration.shift
    return calibration_set(clients, ctx.server_indices(), shift)


def calibrator(p, model: nn.Module, s: int | None, plan, views, opt, server) -> Calibrator:
    """LW-FedSSL's server step at stage s: its own learner (everything trains, no alignment)
    with the clients' views and optimizer, and its own epochs and batch size if set."""
    if server is None:
        raise ValueError("LW-FedSSL's calibration needs the server's data")
    c, st = p.calibration, p.settings(s)
    learner = learner_of(p, model, s, plan, server=True)
    momentum_branch = (
        n for n, _ in learner.named_parameters() if n.startswith(("encoder.", "projector."))
    )
    cohort = CohortTrainer(
        learner,
        views,
        learner_loss,
        opt,
        c.batch_size or st.batch_size,
        c.local_epochs or st.local_epochs,
        False,
        ema_after_step(ema_pairs(momentum_branch), st.momentum),
    )
    return Calibrator(cohort, server, p.seed, s or 0)


def make_federation(
    p,
    model: nn.Module,
    s: int | None,
    data: LocalData,
    ckpt,
    fingerprint,
    server: LocalData | None = None,
) -> tuple[Federation, MocoV3Learner]:
    """Stage s of method params ``p``, starting from ``model`` (F with its blocks, H, P)."""
    plan, st = p.plan(s), p.settings(s)
    learner = learner_of(p, model, s, plan)
    size = input_size(p, data.images.shape[1:])
    views = multi_view(BatchAugment(p.augment, size), BatchAugment(p.augment_2 or p.augment, size))
    opt = OptimizerConfig(kind="adamw", weight_decay=st.weight_decay)
    calibrate, timing = None, "round_start"
    if p.calibrates:
        calibrate = calibrator(p, model, s, plan, views, opt, server)
        timing = p.calibration.timing
    recipe = stage_recipe(p, s, views, opt, calibrate, timing)
    return build_federation(recipe, learner, data, ckpt, fingerprint), learner


def stage_recipe(p, s: int | None, views, opt: OptimizerConfig, calibrate, timing) -> Recipe:
    """Stage s's recipe: its growth strategy (the stage's rounds within the whole schedule),
    MoCo v3 on the asymmetric views with AdamW, the trained blocks' momentum twins following
    them after every step."""
    plan, st = p.plan(s), p.settings(s)
    rounds, index = all_rounds(p), p.growth_stages().index(s)

    def strategy(cfg, learner: MocoV3Learner, data: LocalData) -> GrowthStrategy:
        return GrowthStrategy(
            cfg,
            plan,
            s,
            learner,
            p.weight_transfer,
            offset=sum(rounds[:index]),
            horizon=sum(rounds),
            lr_schedule=st.lr_schedule,
            calibrate=calibrate,
            timing=timing,
        )

    def momentum(learner: MocoV3Learner):
        return ema_after_step(ema_pairs(trained_names(learner, plan, s)), st.momentum)

    return Recipe(
        config=federation_config(st, derive_seed(p.seed, "stage", s or 0) % 2**31),
        strategy=strategy,
        local=Local(
            views=lambda size: views,
            batch_size=st.batch_size,
            local_epochs=st.local_epochs,
            optimizer=opt,
            step_loss=learner_loss,
            after_step=momentum,
        ),
        parallel=p.parallel_clients,
        choice=st,  # the params' strategy choice (FedProx) over the growth strategy
    )


def grow(ctx: StepContext, s: int | None) -> None:
    """Step ``grow_s`` (or FedMoCo's ``pretrain`` with s = None): build stage s's model from
    the previous stage's output, run its rounds, save F (s blocks), H and P."""
    p, shape = ctx.exp.method, ctx.image_shape
    if s is None or s == 1:
        model = initial_online(p, shape, p.vit.depth if s is None else 1).to(ctx.device)
    else:
        model = grown(
            p, load_online(p, shape, ctx.input(f"grow_{s - 1}") / "model.pt", ctx.device), s
        )
    data = train_data(ctx)
    server = server_data(ctx, data) if p.calibrates else None
    fed, learner = make_federation(p, model, s, data, ctx.resume_path, ctx.fingerprint, server)
    log = "rounds.tsv" if s is None else f"grow_{s}.tsv"
    state = run_federation(ctx, fed, learner, log_name=log)
    depth = model["encoder"].depth
    save_online(state.server["global"], depth, shape, ctx.out / "model.pt")
    strategy = fed.strategy
    if s is None or s == p.vit.depth:  # the report's parameter count: the whole model
        ctx.info["parameters"] = sum(q.numel() for q in model.parameters())
    ctx.info.update(
        stage=s,
        blocks=depth,
        trained_parameters=sum(
            q.numel() for n, q in learner.named_parameters() if n in strategy.train
        ),
        downloads=sorted({kind_of(k) for k in strategy.down}),
        calibration=bool(strategy.calibrate),
        server_samples=(len(server.clients[0]) if server else 0),
    )
    write_json(
        ctx.out / "stage.json",
        {
            "stage": s,
            "blocks": depth,
            "rounds": len(state.log),
            "lr": [r["lr"] for r in state.log],
            "loss": [r["loss"] for r in state.log],
            "calibration_loss": [r.get("calibration_loss") for r in state.log],
        },
    )


def scratch(ctx: StepContext) -> None:
    """The reference row: the seeded initial full-depth encoder, untrained."""
    p = ctx.exp.method
    model = initial_online(p, ctx.image_shape, p.vit.depth)
    save_online(model.state_dict(), p.vit.depth, ctx.image_shape, ctx.out / "model.pt")
    ctx.info.update(rounds=0, parameters=sum(q.numel() for q in model.parameters()))


# ============================================================================ evaluation
class DeployedVit(nn.Module):
    """The trained encoder F for the probes: images resized to its input side when they differ
    (bilinear, antialiased), then the pooled representation."""

    def __init__(self, vit: VisionTransformer, size: int):
        super().__init__()
        self.vit, self.size, self.out_dim = vit, size, vit.out_dim

    def forward(self, x):
        if x.shape[-1] != self.size or x.shape[-2] != self.size:
            x = F.interpolate(
                x, size=(self.size, self.size), mode="bilinear", align_corners=False, antialias=True
            )
        return self.vit(x)


def encoder_skeleton(p, image_shape, projection: bool = False) -> DeployedVit:
    """The untrained module :func:`deployed_encoder` returns (for :mod:`fedssl.export`); the
    probes read F's pooled output, whatever ``features.layer`` says."""
    return frozen(DeployedVit(build_vit(p, image_shape, p.vit.depth), input_size(p, image_shape)))


def deployed_encoder(ctx: StepContext, step: str) -> nn.Module:
    p = ctx.exp.method
    model = load_online(p, ctx.image_shape, ctx.input(step) / "model.pt", ctx.device)
    return frozen(DeployedVit(model["encoder"], input_size(p, ctx.image_shape)))


def encoder(ctx: StepContext) -> nn.Module:
    """The encoder hook: the deployed encoder of the step the method builds it from."""
    return deployed_encoder(ctx, ctx.method.encoder_inputs_for(ctx.exp.method)[-1])
