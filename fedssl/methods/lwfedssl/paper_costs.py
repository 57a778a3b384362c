"""The LW-FedSSL paper's client cost formulas (App. A, §5.2): its conventions for layer-wise,
progressive and end-to-end training of a ViT with MoCo v3 heads (spec methods/lw-fedssl.md §5):

* FLOPs: the forward pass of ONE sample counted as fvcore does (a multiply-add is one "FLOP";
  LayerNorm 5 per element; GELU, softmax, BatchNorm and additions not counted); trained parts
  count 3x (backward = 2x forward), frozen ones 1x. Per round: the online branch (F, H, P) with
  twice more for its trained part, the momentum branch (F_k, H_k), and the received global
  encoder F where the alignment term needs it; one view per branch; summed over the rounds.
* Communication: the encoder's tensors (patch embedding + blocks) down and up, fp32 (the
  paper's "MB" are MiB); heads (and the final LayerNorm sent with them) excluded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedssl.methods.lwfedssl import GrowthPlan


@dataclass(frozen=True)
class VitCostParts:
    """Per-sample forward counts (fvcore convention) and parameter counts of the parts of a
    ViT with MoCo v3 heads."""

    embed: int  # patch projection
    block: int  # one Transformer block
    norm: int  # the final LayerNorm
    projector: int  # H
    predictor: int  # P
    embed_params: int
    block_params: int

    def encoder(self, blocks: int) -> int:
        return self.embed + blocks * self.block + self.norm


def vit_cost_parts(
    image_size: int = 32,
    patch_size: int = 4,
    in_channels: int = 3,
    width: int = 192,
    mlp_hidden: int = 768,
    cls_token: bool = False,
    head_hidden: int = 4096,
    head_out: int = 256,
) -> VitCostParts:
    """ViT parts counted the way fvcore counts one sample: Linear in·out per token, the two
    attention matmuls T²·width each, LayerNorm 5·numel, the patch conv patches·C·p²·width."""
    patches = (image_size // patch_size) ** 2
    tokens = patches + int(cls_token)
    block = (
        tokens * width * 3 * width
        + 2 * tokens * tokens * width
        + tokens * width * width
        + 2 * tokens * width * mlp_hidden
        + 2 * 5 * tokens * width
    )
    block_params = (
        2 * 2 * width
        + width * 3 * width
        + 3 * width
        + width * width
        + width
        + width * mlp_hidden
        + mlp_hidden
        + mlp_hidden * width
        + width
    )
    patch_pixels = in_channels * patch_size * patch_size
    return VitCostParts(
        embed=patches * patch_pixels * width,
        block=block,
        norm=5 * tokens * width,
        projector=width * head_hidden + head_hidden * head_hidden + head_hidden * head_out,
        predictor=head_out * head_hidden + head_hidden * head_out,
        embed_params=patch_pixels * width + width + width * int(cls_token),
        block_params=block_params,
    )


def growth_round_flops(plan: GrowthPlan, parts: VitCostParts, s: int, depth: int) -> int:
    """App. A: one client round at stage s, for one sample, in the paper's convention."""
    present = plan.blocks("all", s, depth)
    heads = parts.projector + parts.predictor
    online = parts.encoder(present) + heads
    trained = plan.blocks(plan.trains, s, depth) * parts.block + parts.norm + heads
    trained += parts.embed if plan.embedding_moves(plan.trains, s) else 0
    target = parts.encoder(present) + parts.projector
    aligned = parts.encoder(present) if plan.global_forward else 0
    return online + 2 * trained + target + aligned


def growth_round_params(
    plan: GrowthPlan, parts: VitCostParts, s: int, depth: int
) -> tuple[int, int]:
    """Encoder parameters a client downloads and uploads in one round at stage s."""

    def moved(which):
        return plan.blocks(which, s, depth) * parts.block_params + (
            parts.embed_params if plan.embedding_moves(which, s) else 0
        )

    return moved(plan.downloads), moved(plan.uploads)


def growth_schedule_costs(
    plan: GrowthPlan, parts: VitCostParts, rounds: Sequence[int], bytes_per_value: int = 4
) -> dict:
    """A client's totals over a schedule (``rounds[s-1]`` rounds at stage s; S = len(rounds)):
    FLOPs in the paper's convention and encoder bytes down / up."""
    depth = len(rounds)
    flops = down = up = 0
    for s, r in enumerate(rounds, start=1):
        flops += r * growth_round_flops(plan, parts, s, depth)
        d, u = growth_round_params(plan, parts, s, depth)
        down, up = down + r * d * bytes_per_value, up + r * u * bytes_per_value
    return {"flops": flops, "bytes_down": down, "bytes_up": up, "bytes": down + up}
