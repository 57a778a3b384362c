"""Orchestra's network (spec §4.2): backbone, bias-free BN projector, rotation head, an EMA
target of backbone + projector, the global centroids and the client's memory as buffers, and
its three-view batches (two augmentations, one rotated view with its label); the runtime's
hooks for them and the probes' encoder. Its loss: :mod:`.loss`; its federation: :mod:`.strategy`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedssl.data.augment import BatchAugment
from fedssl.models.encoders import build_backbone, frozen
from fedssl.models.heads import BNMLP
from fedssl.models.momentum import TWIN, ema_after_step, momentum_twin, twin_pairs
from fedssl.precision import channels_last
from fedssl.stage.runtime import derive_seed

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

ROTATIONS = 4  # the degeneracy regulariser predicts a rotation by 0, 90, 180 or 270 degrees
TARGET_PREFIX = TWIN
CENTROIDS, MEMORY = "centroids", "memory"


class OrchestraModel(nn.Module):
    def __init__(self, p, image_shape):
        super().__init__()
        m = p.model
        self.backbone = build_backbone(m, tuple(image_shape))
        self.projector = BNMLP(
            self.backbone.out_dim, [m.proj_hidden], m.proj_dim, last_bn=True,
            last_bn_affine=False, bias=False,
        )  # fmt: skip
        self.rotation = nn.Linear(m.proj_dim, ROTATIONS)
        self.target = momentum_twin(backbone=self.backbone, projector=self.projector)
        self.register_buffer(
            CENTROIDS, F.normalize(torch.randn(p.global_clusters, m.proj_dim), dim=1)
        )
        self.register_buffer(MEMORY, torch.zeros(p.memory_size, m.proj_dim))

    def forward(self, x, branch: str = "online"):
        """The online projection g(f(x)); ``branch`` "rotation": the rotation logits h(g(f(x)));
        "target": the normalised target projection."""
        if branch == "target":
            return self.target_projection(x)
        z = self.projector(self.backbone(x))
        return self.rotation(z) if branch == "rotation" else z

    def target_projection(self, x):
        """normalize(ḡ(f̄(x))): what the clustering and the memory see."""
        return F.normalize(self.target["projector"](self.target["backbone"](x)), dim=1)

    def online_names(self) -> list[str]:
        return [k for k, _ in self.named_parameters() if not k.startswith(TARGET_PREFIX)]

    def target_pairs(self) -> dict[str, str]:
        """target.X -> X for the backbone and projector parameters (the EMA's pairs)."""
        return twin_pairs(self.online_names(), self.target)


def seeded_orchestra_model(p, image_shape, device: torch.device) -> OrchestraModel:
    torch.manual_seed(derive_seed(p.seed, "init"))
    model = OrchestraModel(p, image_shape).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last() else model


def rotate(images: torch.Tensor, quarter_turns: torch.Tensor) -> torch.Tensor:
    """Each square image [B, C, H, W] turned by its own multiple of 90 degrees."""
    turned = torch.stack([images.rot90(k, dims=(2, 3)) for k in range(ROTATIONS)])
    return turned[quarter_turns, torch.arange(len(images), device=images.device)]


def orchestra_views(augment: BatchAugment, augment_prime: BatchAugment):
    """The cohort's view builder: (x1 = A(x), x2 = A'(x), x3 = A(x) rotated, its rotation
    label), drawn in that order from the round's generator."""

    def make(batch: torch.Tensor, generator: torch.Generator):
        x1, x2, x3 = (
            augment(batch, generator),
            augment_prime(batch, generator),
            augment(batch, generator),
        )
        turns = torch.randint(
            ROTATIONS, (len(batch),), generator=generator, device=generator.device
        )
        turns = turns.to(batch.device)
        return x1, x2, rotate(x3, turns), turns

    return make


# ---------------------------------------------------------------------- the runtime's hooks
def views(p, size: int):
    return orchestra_views(BatchAugment(p.augment, size), BatchAugment(p.augment_prime, size))


def target_ema(model: OrchestraModel, p):
    """The cohort's after-step hook: the target follows the online network by EMA."""
    return ema_after_step(model.target_pairs(), p.target_momentum)


def load_model(p, path, device) -> OrchestraModel:
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = seeded_orchestra_model(p, ckpt["image_shape"], device)
    model.load_state_dict(ckpt["model"])
    return model


def encoder(ctx: StepContext):
    """The frozen global online backbone the probes read (with ``projection``: and projector)."""
    model = load_model(ctx.exp.method, ctx.input("pretrain") / "model.pt", ctx.device)
    if ctx.exp.features.layer == "projection":
        return frozen(nn.Sequential(model.backbone, model.projector))
    return frozen(model.backbone)


def encoder_module(method, image_shape, projection: bool = False):
    """The untrained module :func:`encoder` returns (what :mod:`fedssl.export` loads into)."""
    model = OrchestraModel(method, image_shape)
    return frozen(nn.Sequential(model.backbone, model.projector) if projection else model.backbone)
