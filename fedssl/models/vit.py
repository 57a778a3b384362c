"""A Vision Transformer for small images that can grow block by block (LW-FedSSL, Prog-FedSSL).

Layout (LW-FedSSL spec §2 and §8.1-8.2): a strided conv cuts the image into p×p patches and
embeds each one; fixed 2-D sin-cos position embeddings are added (a buffer, never trained, not
in the state dict: it is a function of the grid); an optional CLS token is prepended; pre-norm
Transformer blocks follow (LayerNorm -> multi-head self-attention -> residual, LayerNorm -> MLP
with GELU -> residual); a final LayerNorm; then the CLS token or the mean of the patch tokens is
the representation (``out_dim`` = width).

Growing: ``blocks`` is an ``nn.ModuleList`` and the forward pass runs its first ``depth`` blocks.
:meth:`VisionTransformer.add_block` appends a block that starts as a copy of the last one (the
paper's weight transfer) and runs it from then on. :meth:`VisionTransformer.freeze` stops
gradients into chosen blocks and the patch embedding.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

POOLS = ("cls", "mean")


def sincos_1d(positions: Tensor, dim: int) -> Tensor:
    """``[len(positions), dim]``: sin and cos of each position at ``dim // 2`` geometrically
    spaced frequencies, from 1 down to 1/10000 (the Transformer's encoding)."""
    freqs = torch.exp(-math.log(10000.0) * torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def sincos_2d(grid_h: int, grid_w: int, dim: int) -> Tensor:
    """``[grid_h * grid_w, dim]`` fixed position embeddings for a row-major grid of patches:
    the first half of the channels encodes the row, the second half the column."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos position embeddings need width % 4 == 0, got {dim}")
    rows = torch.arange(grid_h).repeat_interleave(grid_w)
    cols = torch.arange(grid_w).repeat(grid_h)
    emb = torch.cat([sincos_1d(rows, dim // 2), sincos_1d(cols, dim // 2)], dim=1)
    return emb.to(torch.float32)


class PatchEmbed(nn.Module):
    """``[B, C, H, W] -> [B, (H/p)(W/p), width]``: one strided p×p conv embeds each patch."""

    def __init__(self, in_channels: int, width: int, patch_size: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, width, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class SelfAttention(nn.Module):
    """Multi-head self-attention: one Linear makes queries, keys and values for all heads, a
    second one mixes the heads' outputs."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        # [B, T, 3D] -> three [B, heads, T, D/heads]
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + MHSA(LN(x)), then x + MLP(LN(x)) with a GELU hidden layer."""

    def __init__(self, width: int, heads: int, mlp_ratio: float = 4.0, eps: float = 1e-6):
        super().__init__()
        hidden = int(round(width * mlp_ratio))
        self.norm1 = nn.LayerNorm(width, eps=eps)
        self.attn = SelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def init_vit_weights(module: nn.Module) -> None:
    """Xavier-uniform Linear and patch-conv weights with zero biases; LayerNorms at identity."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        # Treat the patch conv as the Linear it is (patch pixels -> width).
        nn.init.xavier_uniform_(module.weight.view(module.weight.shape[0], -1))
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class VisionTransformer(nn.Module):
    """ViT over ``image_size`` × ``image_size`` images (``image_size`` may be an (H, W) pair).

    ``depth`` blocks are built now; more can be appended with :meth:`add_block`. ``pool='cls'``
    (MoCo v3's choice, the default) prepends a learned CLS token and returns it; ``pool='mean'``
    returns the mean of the patch tokens (no CLS token, 64 tokens at 32 px / patch 4).
    """

    def __init__(
        self,
        image_size: int | tuple[int, int] = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        width: int = 192,
        depth: int = 12,
        heads: int = 3,
        mlp_ratio: float = 4.0,
        pool: str = "cls",
        eps: float = 1e-6,
    ):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r} (expected one of: {', '.join(POOLS)})")
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        if h % patch_size or w % patch_size:
            raise ValueError(f"image {h}x{w} does not split into {patch_size}x{patch_size} patches")
        self.pool, self.width, self.heads = pool, width, heads
        self.mlp_ratio, self.eps = mlp_ratio, eps
        self.patch_embed = PatchEmbed(in_channels, width, patch_size)
        self.register_buffer(
            "pos_embed", sincos_2d(h // patch_size, w // patch_size, width), persistent=False
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width)) if pool == "cls" else None
        self.blocks = nn.ModuleList(self._new_block() for _ in range(depth))
        self.norm = nn.LayerNorm(width, eps=eps)
        self.out_dim = width
        self.depth = depth
        self.apply(init_vit_weights)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)

    @property
    def num_patches(self) -> int:
        return self.pos_embed.shape[0]

    @property
    def depth(self) -> int:
        """How many of ``blocks`` the forward pass runs (the first ones)."""
        return self._depth

    @depth.setter
    def depth(self, value: int) -> None:
        if not 0 <= value <= len(self.blocks):
            raise ValueError(f"depth must be in 0..{len(self.blocks)}, got {value}")
        self._depth = value

    def _new_block(self) -> TransformerBlock:
        block = TransformerBlock(self.width, self.heads, self.mlp_ratio, self.eps)
        block.apply(init_vit_weights)
        return block

    def add_block(self) -> TransformerBlock:
        """Append a block, initialised as a copy of the last block when there is one (weight
        transfer) and fresh otherwise; it is trainable and the forward pass now runs all
        blocks. Returns the new block."""
        if len(self.blocks):
            block = copy.deepcopy(self.blocks[-1])
            block.requires_grad_(True)  # the copied block may have been frozen
        else:
            block = self._new_block().to(self.pos_embed.device)
        self.blocks.append(block)
        self.depth = len(self.blocks)
        return block

    def freeze(self, *, patch_embed: bool = False, blocks: Iterable[int] = ()) -> None:
        """Stop gradients into the patch embedding (with the CLS token, part of the input
        embedding) and into the given blocks. The final LayerNorm always stays trainable."""
        if patch_embed:
            self.patch_embed.requires_grad_(False)
            if self.cls_token is not None:
                self.cls_token.requires_grad_(False)
        for i in blocks:
            self.blocks[i].requires_grad_(False)

    def freeze_blocks_before(self, index: int) -> None:
        """Freeze blocks ``0..index-1`` (LW-FedSSL trains only the newest block)."""
        self.freeze(blocks=range(index))

    def unfreeze(self) -> None:
        self.requires_grad_(True)

    def embed(self, x: Tensor) -> Tensor:
        """Tokens entering the first block: ``[B, T, width]`` (T = patches, + 1 with CLS; the
        CLS token, first, carries no position embedding)."""
        tokens = self.patch_embed(x) + self.pos_embed.to(x.dtype)
        if self.cls_token is None:
            return tokens
        return torch.cat(
            [self.cls_token.expand(x.shape[0], -1, -1).to(tokens.dtype), tokens], dim=1
        )

    def tokens(self, x: Tensor, skip: Collection[int] = ()) -> Tensor:
        """All output tokens after the first ``depth`` blocks and the final LayerNorm. Blocks
        whose index is in ``skip`` are passed over (FLL+DD's depth dropout of frozen layers)."""
        h = self.embed(x)
        for i, block in enumerate(self.blocks[: self.depth]):
            if i not in skip:
                h = block(h)
        return self.norm(h)

    def forward(self, x: Tensor, skip: Collection[int] = ()) -> Tensor:
        h = self.tokens(x, skip)
        return h[:, 0] if self.cls_token is not None else h.mean(dim=1)


def vit_tiny(**overrides) -> VisionTransformer:
    """ViT-Tiny for 32×32 images: width 192, 3 heads, MLP 768, patch 4 (64 patches), 12 blocks,
    CLS pooling. Keyword arguments override any of these (e.g. ``depth=0`` to grow it)."""
    settings = dict(
        image_size=32,
        patch_size=4,
        in_channels=3,
        width=192,
        depth=12,
        heads=3,
        mlp_ratio=4.0,
        pool="cls",
    )
    settings.update(overrides)
    return VisionTransformer(**settings)
