"""SimCLR view generation for a whole batch at once, with independent randomness per sample.

torchvision's transforms draw one set of random parameters per call, so applying them to a
batch gives every image the same crop, the same jitter, ... which is useless for contrastive
learning. :class:`BatchAugment` instead draws every parameter per sample and applies the ops
with batched tensor operations on the batch's own device (no Python loop over samples).

Ops, in SimCLR order (each one applied to a sample with its own Bernoulli draw):

1. random resized crop: area fraction ~ U(crop_scale), aspect ratio log-uniform in
   crop_ratio, uniform position; like torchvision's ``RandomResizedCrop`` (up to 10 tries per
   sample, then the centre crop with the ratio clamped), but the box is continuous (sub-pixel
   position and size) instead of rounded to whole pixels, so its area fraction lies exactly in
   crop_scale. Resampling is a per-sample affine grid + bilinear ``grid_sample`` with border
   padding (no antialiasing: crops much larger than ``out_size`` alias a little);
2. horizontal flip, folded into the same affine grid (sign of the x scale);
3. colour jitter: brightness, contrast, saturation and hue factors drawn per sample, applied in
   a per-sample random order (torchvision's formulas: blends with black / the mean grey level /
   the grey image, and an HSV hue rotation). One-channel images get brightness and contrast;
4. random grayscale (ITU-R 601 luma with torchvision's weights, replicated over the 3
   channels; no-op for 1 channel);
5. Gaussian blur, sigma ~ U(blur_sigma) per sample, odd kernel of ~10% of ``out_size``
   (at least 3), separable, reflect padding;
6. solarize: pixels >= 0.5 become 1 - pixel.

Randomness comes from the ``torch.Generator`` given to the call (any device; the draws are
moved to the images' device), so a seed reproduces the views exactly on a given device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from fedssl.params import AugmentParams

__all__ = [
    "BatchAugment",
    "AugmentDraw",
    "to_float",
    "sample_crop_boxes",
    "blur_kernel_size",
    "pad_crop_flip",
]

_LUMA = (0.2989, 0.587, 0.114)  # the luma weights torchvision uses (ITU-R 601)
_CROP_TRIES = 10
# jitter op ids (column of AugmentDraw.jitter_factors / entries of jitter_order)
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0, 1, 2, 3


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [0, 1] on the same device (no augmentation)."""
    if images.dtype == torch.uint8:
        return images.to(torch.float32).div_(255.0)
    if images.is_floating_point():
        return images.to(torch.float32)
    raise TypeError(f"expected uint8 or floating point images, got {images.dtype}")


def pad_crop_flip(
    images: torch.Tensor, padding: int, generator: torch.Generator | None, flip: bool = True
) -> torch.Tensor:
    """The supervised CIFAR augmentation (torchvision's ``RandomCrop(size, padding)`` with zero
    fill, then ``RandomHorizontalFlip``), with its own offsets and flip per sample: float
    [B, C, H, W] in, same shape out. One gather on the images' device."""
    b, _, h, w = images.shape
    device = images.device
    x = F.pad(images, (padding, padding, padding, padding))
    span = 2 * padding + 1  # offsets 0 .. 2 * padding

    def offsets() -> torch.Tensor:
        return (_rand((b,), generator, device) * span).long().clamp_(max=span - 1)

    oy, ox = offsets(), offsets()
    rows = (oy[:, None] + torch.arange(h, device=device))[:, :, None]  # [B, H, 1]
    cols = (ox[:, None] + torch.arange(w, device=device))[:, None, :]  # [B, 1, W]
    if flip:
        mirrored = _rand((b,), generator, device) < 0.5
        cols = torch.where(mirrored[:, None, None], cols.flip(-1), cols)
    batch = torch.arange(b, device=device)[:, None, None]
    return x.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


def blur_kernel_size(size: int) -> int:
    """Odd Gaussian kernel width of about 10% of the image side (SimCLR), at least 3."""
    k = max(3, int(0.1 * size))
    return k if k % 2 == 1 else k + 1


def _rand(shape, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """U[0, 1) draws from ``generator`` (on whatever device it lives), moved to ``device``."""
    gen_device = generator.device if generator is not None else device
    u = torch.rand(shape, generator=generator, device=gen_device)
    return u.to(device, non_blocking=True)


def _uniform(u: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * u


def sample_crop_boxes(
    n: int,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Draw ``n`` random-resized-crop boxes as float ``[n, 4]`` = (x0, y0, w, h) in pixels.

    Per sample: up to 10 tries of (area ~ U(scale) * H * W, log-ratio ~ U(log ratio)); the first
    try that fits in the image wins, at a uniform position; a sample with no fitting try gets
    the largest centred box whose ratio is ``ratio`` clamped (torchvision's fallback).
    """
    device = torch.device(device)
    u = _rand((4, n, _CROP_TRIES), generator, device)
    area = height * width * _uniform(u[0], *scale)
    log_r = _uniform(u[1], math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.exp(log_r)
    w = torch.sqrt(area * aspect)
    h = torch.sqrt(area / aspect)
    fits = (w <= width) & (h <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # index of the first fitting try
    w = w.gather(1, first).squeeze(1)
    h = h.gather(1, first).squeeze(1)
    x0 = (width - w).clamp_min(0) * u[2].gather(1, first).squeeze(1)
    y0 = (height - h).clamp_min(0) * u[3].gather(1, first).squeeze(1)

    # fallback: centred box, whole image with the aspect ratio clamped into ``ratio``
    in_ratio = width / height
    if in_ratio < min(ratio):
        fw, fh = float(width), width / min(ratio)
    elif in_ratio > max(ratio):
        fw, fh = height * max(ratio), float(height)
    else:
        fw, fh = float(width), float(height)
    ok = fits.any(dim=1)
    w = torch.where(ok, w, torch.full_like(w, fw))
    h = torch.where(ok, h, torch.full_like(h, fh))
    x0 = torch.where(ok, x0, torch.full_like(x0, (width - fw) / 2))
    y0 = torch.where(ok, y0, torch.full_like(y0, (height - fh) / 2))
    return torch.stack([x0, y0, w, h], dim=1)


@dataclass
class AugmentDraw:
    """Every random choice made for one batch (all tensors have batch size first)."""

    boxes: torch.Tensor  # [B, 4] float (x0, y0, w, h) in input pixels
    flip: torch.Tensor  # [B] bool
    jitter: torch.Tensor  # [B] bool
    jitter_factors: torch.Tensor  # [B, 4] brightness, contrast, saturation factors, hue shift
    jitter_order: torch.Tensor  # [B, n_ops] per-sample permutation of the jitter op ids
    grayscale: torch.Tensor  # [B] bool
    blur: torch.Tensor  # [B] bool
    blur_sigma: torch.Tensor  # [B] float
    solarize: torch.Tensor  # [B] bool

    def slice(self, start: int, stop: int) -> AugmentDraw:
        """The draws of samples ``start:stop``."""
        return AugmentDraw(**{f.name: getattr(self, f.name)[start:stop] for f in fields(self)})


class BatchAugment:
    """SimCLR augmentation of a uint8 batch with per-sample random parameters.

    ``aug(images, generator)`` maps uint8 ``[B, C, H, W]`` (C = 1 or 3) on any device to
    float32 ``[B, C, out_size, out_size]`` in [0, 1] on the same device.
    """

    def __init__(self, params: AugmentParams, out_size: int):
        if out_size < 1:
            raise ValueError(f"out_size must be positive, got {out_size}")
        self.params = params
        self.out_size = int(out_size)
        self.blur_kernel = blur_kernel_size(self.out_size)

    # ------------------------------------------------------------------ random draws
    def draw(
        self,
        batch: int,
        height: int,
        width: int,
        channels: int,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> AugmentDraw:
        """Draw every random parameter for a batch (a fixed number of draws, in a fixed order,
        whatever the probabilities, so a seed always maps to the same stream)."""
        p = self.params
        device = torch.device(device)
        boxes = sample_crop_boxes(
            batch, height, width, p.crop_scale, p.crop_ratio, generator, device
        )
        u = _rand((10, batch), generator, device)
        n_ops = 4 if channels == 3 else 2
        order = torch.argsort(_rand((batch, n_ops), generator, device), dim=1)

        def factor(ui, strength):
            return _uniform(ui, max(0.0, 1.0 - strength), 1.0 + strength)

        factors = torch.stack(
            [
                factor(u[2], p.brightness),
                factor(u[3], p.contrast),
                factor(u[4], p.saturation),
                _uniform(u[5], -p.hue, p.hue),
            ],
            1,
        )
        return AugmentDraw(
            boxes=boxes,
            flip=u[0] < p.flip_p,
            jitter=u[1] < p.jitter_p,
            jitter_factors=factors,
            jitter_order=order,
            grayscale=u[6] < p.grayscale_p,
            blur=u[7] < p.blur_p,
            blur_sigma=_uniform(u[8], *p.blur_sigma),
            solarize=u[9] < p.solarize_p,
        )

    # ------------------------------------------------------------------ application
    def __call__(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] not in (1, 3):
            raise ValueError(
                f"expected images [B, C, H, W] with C in (1, 3), got shape {tuple(images.shape)}"
            )
        b, c, h, w = images.shape
        d = self.draw(b, h, w, c, images.device, generator)
        return self.apply(images, d)

    def apply(self, images: torch.Tensor, d: AugmentDraw) -> torch.Tensor:
        """Apply the drawn parameters ``d`` to ``images`` (deterministic)."""
        p = self.params
        x = _crop_flip(to_float(images), d.boxes, d.flip, self.out_size)
        if p.jitter_p > 0 and (
            p.brightness > 0
            or p.contrast > 0
            or (x.shape[1] == 3 and (p.saturation > 0 or p.hue > 0))
        ):
            x = _color_jitter(x, d.jitter, d.jitter_factors, d.jitter_order, hue_on=p.hue > 0)
        if p.grayscale_p > 0 and x.shape[1] == 3:
            g = _gray(x).expand_as(x)
            x = torch.where(d.grayscale.view(-1, 1, 1, 1), g, x)
        if p.blur_p > 0:
            x = torch.where(
                d.blur.view(-1, 1, 1, 1), _gaussian_blur(x, d.blur_sigma, self.blur_kernel), x
            )
        if p.solarize_p > 0:
            x = torch.where(d.solarize.view(-1, 1, 1, 1) & (x >= 0.5), 1.0 - x, x)
        return x.clamp_(0.0, 1.0)


def multi_view(*augments: BatchAugment, views: int | None = None):
    """A view builder for the cohort and split trainers: ``make(batch, generator)`` returns one
    view of ``batch`` per augmentation, drawn in order from the one generator (so view 1's
    draws come first). ``multi_view(aug, views=2)`` gives two views of the same augmentation
    (SimCLR, MoCo); ``multi_view(aug_1, aug_2)`` one from each (LW-FedSSL's asymmetric pair)."""
    if views is not None:
        if len(augments) != 1:
            raise ValueError("views= repeats a single augmentation")
        augments = augments * views
    if not augments:
        raise ValueError("multi_view needs at least one augmentation")

    def make(batch: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return tuple(augment(batch, generator) for augment in augments)

    return make


# ---------------------------------------------------------------------- batched ops
def _crop_flip(
    x: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, out_size: int
) -> torch.Tensor:
    """Resample each box (x0, y0, w, h) to out_size x out_size, mirrored where ``flip``."""
    b, _, h, w = x.shape
    x0, y0, bw, bh = boxes.unbind(1)
    sx = bw / w
    sy = bh / h
    # normalised centre (align_corners=False: -1 and 1 are the outer pixel edges)
    cx = (2 * x0 + bw) / w - 1
    cy = (2 * y0 + bh) / h - 1
    sx = torch.where(flip, -sx, sx)
    zero = torch.zeros_like(sx)
    theta = torch.stack([torch.stack([sx, zero, cx], 1), torch.stack([zero, sy, cy], 1)], 1)
    grid = F.affine_grid(theta, [b, x.shape[1], out_size, out_size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] -> [B, 1, H, W] luma; 1-channel input is returned as is."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).unsqueeze(1)


def _adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue of each RGB image by ``shift`` (fraction of a turn, per sample).

    Same result as torchvision's ``adjust_hue`` (to float rounding) without building the HSV
    image: a hue rotation keeps the max ``v`` and the chroma ``c = max - min`` of every pixel,
    so only the hue angle (in sixths of a turn) is computed, shifted, and turned back into
    RGB with the closed form ``channel = v - c * ramp(n + 6h)``, n = 5, 3, 1 for R, G, B.
    """
    r, g, b = x.unbind(1)
    v = x.amax(dim=1)
    c = v - x.amin(dim=1)
    is_r = r == v
    is_g = (g == v) & ~is_r
    # angle within the sector of the dominant channel, then the sector offset (0, 2 or 4)
    h6 = torch.where(is_r, g - b, torch.where(is_g, b - r, r - g))
    h6.div_(c.clamp_min(1e-12))  # c = 0 means grey: numerator 0, and c * ramp = 0 anyway
    h6.add_(4.0).sub_(is_g.to(h6.dtype), alpha=2.0).sub_(is_r.to(h6.dtype), alpha=4.0)
    h6.add_(6.0 * shift.view(-1, 1, 1).to(h6.dtype))
    h6.sub_(torch.floor(h6 / 6.0).mul_(6.0))  # now in [0, 6)
    n = torch.tensor([5.0, 3.0, 1.0], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    k = h6.unsqueeze(1) + n  # in [1, 11)
    # ramp(k) = clamp(min(k, 4 - k), 0, 1) on [0, 6), periodic: triangle around 2 (and 8)
    ramp = torch.minimum((k - 2.0).abs_(), (k - 8.0).abs_()).neg_().add_(2.0).clamp_(0.0, 1.0)
    return ramp.mul_(c.unsqueeze(1)).neg_().add_(v.unsqueeze(1))


def _color_jitter(
    x: torch.Tensor, apply: torch.Tensor, factors: torch.Tensor, order: torch.Tensor, hue_on: bool
) -> torch.Tensor:
    """Per-sample colour jitter in a per-sample order.

    Brightness, contrast and saturation are all blends ``f * x + (1 - f) * ref`` (ref = black,
    the image's mean grey level, the grey image), so each step does one blend for the whole
    batch, with a per-sample factor and reference (factor 1, an exact no-op, for samples that
    are not jittered or whose op at this step is the hue). The hue rotation is computed only on
    the samples whose op at this step is the hue (an index/scatter; costs one host sync on CUDA).
    """
    view = (-1, 1, 1, 1)
    ones = torch.ones_like(factors[:, 0])
    for step in range(order.shape[1]):
        op = order[:, step]
        is_blend = apply & (op != HUE)
        f = torch.where(
            is_blend, factors.gather(1, op.clamp(max=2).unsqueeze(1)).squeeze(1), ones
        ).view(view)
        gray = _gray(x)
        # reference image: 0 (brightness), mean grey level (contrast), grey image (saturation)
        ref = gray * (op == SATURATION).to(x.dtype).view(view)
        ref.add_(gray.mean(dim=(1, 2, 3), keepdim=True) * (op == CONTRAST).to(x.dtype).view(view))
        x = x.mul_(f).add_(ref.mul_(1.0 - f)).clamp_(0.0, 1.0)
        if hue_on and x.shape[1] == 3:
            idx = (apply & (op == HUE)).nonzero().squeeze(1)
            if idx.numel():
                x.index_copy_(
                    0, idx, _adjust_hue(x.index_select(0, idx), factors[idx, HUE]).clamp_(0.0, 1.0)
                )
    return x


def _gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, ksize: int) -> torch.Tensor:
    """Separable Gaussian blur with a per-sample sigma (reflect padding, like torchvision)."""
    b, c, h, w = x.shape
    r = ksize // 2
    t = torch.arange(-r, r + 1, device=x.device, dtype=x.dtype)
    kern = torch.exp(-0.5 * (t.view(1, -1) / sigma.view(-1, 1)) ** 2)
    kern = kern / kern.sum(dim=1, keepdim=True)  # [B, k]
    kern = kern.repeat_interleave(c, dim=0).view(b * c, 1, 1, ksize)  # one filter per channel
    y = x.reshape(1, b * c, h, w)
    pad_r = min(r, w - 1, h - 1)
    if pad_r < r:  # image smaller than the kernel: reflect what can be reflected, then edge
        y = F.pad(y, (pad_r, pad_r, pad_r, pad_r), mode="reflect")
        y = F.pad(y, (r - pad_r,) * 4, mode="replicate")
    else:
        y = F.pad(y, (r, r, r, r), mode="reflect")
    y = F.conv2d(y, kern, groups=b * c)  # horizontal
    y = F.conv2d(y, kern.transpose(2, 3), groups=b * c)  # vertical
    return y.view(b, c, h, w)


def views_of(p):
    """The training view of a batch for a supervised method (its params' ``augment`` and
    ``crop_padding``): the image, or its padded random crop + flip."""
    if p.augment == "crop_flip":
        return lambda batch, gen: (pad_crop_flip(to_float(batch), p.crop_padding, gen),)
    return lambda batch, gen: (to_float(batch),)
