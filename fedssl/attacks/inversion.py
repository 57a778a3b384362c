"""Model-inversion attack on split-learning activations (monacosfl spec §5 "MIA", §8.11).

The attacker holds a little auxiliary data (1 % of the training set in MonAcoSFL §5.3), passes
it through the client part of the model to get (activation, image) pairs, and trains a small
conv decoder with MSE (Adam 1e-3, 50 epochs, batch 32) to map cut-layer activations back to
images. Privacy is scored by the reconstruction MSE (higher = more private) and SSIM.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "InversionDecoder",
    "train_decoder",
    "invert",
    "reconstruction_mse",
    "gaussian_window",
    "ssim",
]


class InversionDecoder(nn.Module):
    """Cut-layer activations [N, C, h, w] -> images [N, c, H, W].

    A 3x3 conv, then one stride-2 transposed conv per doubling (channels halve, at least 16),
    a bilinear resize when H / h is not a power of two, and a 3x3 conv to the image channels.
    ``sigmoid=True`` keeps outputs in [0, 1], the range of the images it is trained on.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        in_size: int,
        out_size: int,
        width: int = 64,
        sigmoid: bool = True,
    ):
        super().__init__()
        if in_size < 1 or out_size < in_size:
            raise ValueError(f"cannot upsample {in_size} px activations to {out_size} px images")
        doublings = int(math.floor(math.log2(out_size / in_size) + 1e-9))
        layers: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU()]
        channels = width
        for _ in range(doublings):
            narrower = max(16, channels // 2)
            layers += [nn.ConvTranspose2d(channels, narrower, 4, stride=2, padding=1), nn.ReLU()]
            channels = narrower
        if in_size * 2**doublings != out_size:
            layers.append(
                nn.Upsample(size=(out_size, out_size), mode="bilinear", align_corners=False)
            )
        layers.append(nn.Conv2d(channels, out_channels, 3, padding=1))
        if sigmoid:
            layers.append(nn.Sigmoid())
        self.net = nn.Sequential(*layers)

    def forward(self, activations: torch.Tensor) -> torch.Tensor:
        return self.net(activations)


def train_decoder(
    decoder: nn.Module,
    activations: torch.Tensor,
    images: torch.Tensor,
    epochs: int = 50,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Fit the decoder on auxiliary (activation, image) pairs; returns the mean MSE per epoch."""
    if len(activations) != len(images) or not len(images):
        raise ValueError("need as many activations as images, and at least one pair")
    device = next(decoder.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(decoder.parameters(), lr=lr)
    decoder.train()
    history = []
    for _ in range(epochs):
        total = 0.0
        for rows in torch.randperm(len(images), generator=gen).split(batch_size):
            h, x = activations[rows].to(device), images[rows].to(device)
            loss = F.mse_loss(decoder(h), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(rows)
        history.append(total / len(images))
    return history


@torch.no_grad()
def invert(decoder: nn.Module, activations: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """The decoder's reconstructions, in eval mode, on the decoder's device."""
    decoder.eval()
    device = next(decoder.parameters()).device
    return torch.cat([decoder(h.to(device)) for h in activations.split(batch_size)])


def reconstruction_mse(reconstructed: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Per-image mean squared error [N]."""
    return ((reconstructed - images) ** 2).flatten(1).mean(dim=1)


def gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Normalised 1-D Gaussian of odd length ``size``."""
    offsets = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    w = torch.exp(-(offsets**2) / (2 * sigma**2))
    return w / w.sum()


def ssim(
    x: torch.Tensor,
    y: torch.Tensor,
    data_range: float = 1.0,
    window: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> torch.Tensor:
    """Per-image SSIM [N] of Wang et al. (2004): local statistics under an 11x11 Gaussian
    (sigma 1.5), C1 = (k1 L)^2, C2 = (k2 L)^2, averaged over the valid positions and channels."""
    if x.shape != y.shape or x.ndim != 4:
        raise ValueError(
            f"need two [N, C, H, W] batches of one shape, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if min(x.shape[-2:]) < window:
        raise ValueError(
            f"images of {tuple(x.shape[-2:])} px are smaller than the {window} px window"
        )
    x, y = x.double(), y.double()
    g = gaussian_window(window, sigma).to(x.device)
    kernel = torch.outer(g, g).expand(x.shape[1], 1, window, window)

    def local_mean(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, kernel, groups=x.shape[1])  # 'valid': no padded borders

    mu_x, mu_y = local_mean(x), local_mean(y)
    var_x = local_mean(x * x) - mu_x**2
    var_y = local_mean(y * y) - mu_y**2
    cov = local_mean(x * y) - mu_x * mu_y
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    luminance = (2 * mu_x * mu_y + c1) / (mu_x**2 + mu_y**2 + c1)
    structure = (2 * cov + c2) / (var_x + var_y + c2)
    return (luminance * structure).flatten(1).mean(dim=1).float()
