"""Tests of the batched, per-sample SimCLR augmentation (fedssl.data.augment)."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.transforms.v2.functional as TF

from fedssl.data.augment import (
    AugmentDraw,
    BatchAugment,
    blur_kernel_size,
    sample_crop_boxes,
    to_float,
)
from fedssl.params import AugmentParams

# every op off, full-image crop: the pipeline is then the identity (for out_size = input size)
PLAIN = dict(
    crop_scale=(1.0, 1.0),
    crop_ratio=(1.0, 1.0),
    flip_p=0.0,
    jitter_p=0.0,
    grayscale_p=0.0,
    blur_p=0.0,
    solarize_p=0.0,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_images(n: int, c: int = 3, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, c, size, size), dtype=torch.uint8, generator=gen(seed))


def plain(**over) -> AugmentParams:
    return AugmentParams(**{**PLAIN, **over})


def draw_for(n: int, c: int = 3, **fields) -> AugmentDraw:
    """A hand-made draw: full-image boxes (32 x 32) and no op, with ``fields`` overriding."""
    base = dict(
        boxes=torch.tensor([[0.0, 0.0, 32.0, 32.0]]).repeat(n, 1),
        flip=torch.zeros(n, dtype=torch.bool),
        jitter=torch.zeros(n, dtype=torch.bool),
        jitter_factors=torch.tensor([[1.0, 1.0, 1.0, 0.0]]).repeat(n, 1),
        jitter_order=torch.arange(4 if c == 3 else 2).repeat(n, 1),
        grayscale=torch.zeros(n, dtype=torch.bool),
        blur=torch.zeros(n, dtype=torch.bool),
        blur_sigma=torch.ones(n),
        solarize=torch.zeros(n, dtype=torch.bool),
    )
    base.update(fields)
    return AugmentDraw(**base)


# ----------------------------------------------------------------------------- basics
@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("in_size,out_size", [(32, 32), (32, 24), (16, 32)])
def test_shape_dtype_range_device(c, in_size, out_size):
    aug = BatchAugment(AugmentParams(blur_p=0.5, solarize_p=0.2), out_size)
    out = aug(random_images(16, c, in_size), gen())
    assert out.shape == (16, c, out_size, out_size)
    assert out.dtype == torch.float32 and out.device.type == "cpu"
    assert out.min() >= 0.0 and out.max() <= 1.0 and torch.isfinite(out).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batch_stays_on_device_and_is_reproducible():
    imgs = random_images(64).cuda()
    aug = BatchAugment(AugmentParams(blur_p=0.5, solarize_p=0.2), 32)
    a = aug(imgs, torch.Generator("cuda").manual_seed(3))
    b = aug(imgs, torch.Generator("cuda").manual_seed(3))
    assert a.device == imgs.device and torch.equal(a, b)
    # a CPU generator also works: draws are moved to the batch's device
    assert aug(imgs, gen(3)).device == imgs.device


def test_to_float():
    imgs = random_images(4)
    out = to_float(imgs)
    assert out.dtype == torch.float32
    assert torch.allclose(out * 255.0, imgs.float())
    assert to_float(torch.tensor([0, 255], dtype=torch.uint8)).tolist() == [0.0, 1.0]


def test_bad_input_is_rejected():
    aug = BatchAugment(AugmentParams(), 32)
    with pytest.raises(ValueError):
        aug(torch.zeros(2, 2, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError):
        aug(torch.zeros(3, 32, 32, dtype=torch.uint8))


# ----------------------------------------------------------------------------- randomness
def test_same_seed_same_views_and_new_draws_differ():
    imgs = random_images(32)
    aug = BatchAugment(AugmentParams(blur_p=0.5, solarize_p=0.2), 32)
    assert torch.equal(aug(imgs, gen(7)), aug(imgs, gen(7)))
    g = gen(7)
    v1, v2 = aug(imgs, g), aug(imgs, g)
    assert not torch.allclose(v1, v2)
    # most samples get a visibly different second view
    assert ((v1 - v2).abs().flatten(1).amax(1) > 0.05).float().mean() > 0.9


def test_every_sample_draws_its_own_parameters():
    img = random_images(1)
    aug = BatchAugment(AugmentParams(), 32)
    out = aug(img.repeat(256, 1, 1, 1), gen(1))
    distinct = torch.unique(out.flatten(1), dim=0).shape[0]
    assert distinct >= 250
    d = aug.draw(256, 32, 32, 3, "cpu", gen(1))
    assert torch.unique(d.boxes, dim=0).shape[0] == 256
    assert torch.unique(d.jitter_factors[:, 0]).numel() == 256
    # per-sample jitter order: each row a permutation of the 4 ops, many different orders
    assert torch.equal(d.jitter_order.sort(1).values, torch.arange(4).repeat(256, 1))
    assert torch.unique(d.jitter_order, dim=0).shape[0] > 12


# ----------------------------------------------------------------------------- crop and flip
def test_identity_when_everything_is_off():
    imgs = random_images(8)
    for c in (1, 3):
        x = imgs[:, :c]
        out = BatchAugment(plain(), 32)(x, gen())
        assert torch.allclose(out, to_float(x), atol=1e-5)
    # jitter always on but with zero strength is also the identity
    zero_jitter = plain(jitter_p=1.0, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0)
    assert torch.allclose(BatchAugment(zero_jitter, 32)(imgs, gen()), to_float(imgs), atol=1e-5)


def test_flip_rate_and_flip_is_a_mirror():
    img = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    img[..., :, :8] = 255  # bright left band: asymmetric
    out = BatchAugment(plain(flip_p=0.5), 32)(img.repeat(1000, 1, 1, 1), gen(2))
    ref = to_float(img)
    flipped = torch.isclose(out, ref.flip(-1), atol=1e-5).flatten(1).all(1)
    kept = torch.isclose(out, ref, atol=1e-5).flatten(1).all(1)
    assert bool((flipped ^ kept).all())  # every output is exactly one of the two
    assert abs(flipped.float().mean().item() - 0.5) < 0.1


@pytest.mark.parametrize("scale,ratio", [((0.2, 1.0), (3 / 4, 4 / 3)), ((0.08, 0.5), (0.5, 2.0))])
def test_crop_boxes_statistics(scale, ratio):
    boxes = sample_crop_boxes(4000, 32, 32, scale, ratio, gen(4))
    x0, y0, w, h = boxes.unbind(1)
    area = w * h / (32 * 32)
    assert area.min() >= scale[0] - 1e-5 and area.max() <= scale[1] + 1e-5
    aspect = w / h
    assert aspect.min() >= ratio[0] - 1e-4 and aspect.max() <= ratio[1] + 1e-4
    assert (x0 >= 0).all() and (y0 >= 0).all()
    assert (x0 + w <= 32 + 1e-4).all() and (y0 + h <= 32 + 1e-4).all()
    # area ~ U(scale) (slightly less for large areas with extreme ratios, which do not fit)
    mid = (scale[0] + scale[1]) / 2
    assert mid - 0.08 < area.mean().item() < mid + 0.02
    assert area.min() < scale[0] + 0.02 and area.max() > scale[1] - 0.02
    # log-ratio ~ uniform, positions uniform over the free room
    assert abs(aspect.log().mean().item() - (math.log(ratio[0]) + math.log(ratio[1])) / 2) < 0.05
    room = (32 - w).clamp_min(1e-6)
    assert abs((x0 / room).mean().item() - 0.5) < 0.05


def test_crop_falls_back_to_the_centre_when_nothing_fits():
    # a 10 x 100 image: no square-ish box of full area fits, so the centred box with the
    # ratio clamped to 4/3 is used
    boxes = sample_crop_boxes(50, 10, 100, (1.0, 1.0), (3 / 4, 4 / 3), gen())
    expected = torch.tensor([100 / 2 - 40 / 3 / 2 * 1.0, 0.0, 40 / 3, 10.0])
    assert torch.allclose(boxes, expected.expand(50, 4), atol=1e-4)


def test_crop_samples_the_drawn_box():
    """On an image whose value is its x (or y) pixel coordinate, bilinear resampling is exact,
    so every output pixel must hold the coordinate the drawn box puts it at."""
    size, out_size, n = 48, 20, 64
    coord = torch.arange(size, dtype=torch.float32)
    img = torch.stack(
        [
            coord.view(1, -1).expand(size, size),  # channel 0: x
            coord.view(-1, 1).expand(size, size),  # channel 1: y
            torch.zeros(size, size),
        ]
    ).unsqueeze(0) / (size - 1)
    aug = BatchAugment(AugmentParams(flip_p=0.5, jitter_p=0.0, grayscale_p=0.0), out_size)
    d = aug.draw(n, size, size, 3, "cpu", gen(5))
    out = aug.apply(img.repeat(n, 1, 1, 1), d) * (size - 1)
    x0, y0, w, h = d.boxes.unbind(1)
    j = torch.arange(out_size, dtype=torch.float32) + 0.5
    # continuous position of output pixel j in the input, minus 0.5 to get the pixel index
    xs = (x0.view(-1, 1) + j * (w / out_size).view(-1, 1) - 0.5).clamp(0, size - 1)
    ys = (y0.view(-1, 1) + j * (h / out_size).view(-1, 1) - 0.5).clamp(0, size - 1)
    xs = torch.where(d.flip.view(-1, 1), xs.flip(1), xs)
    assert torch.allclose(
        out[:, 0], xs.view(n, 1, out_size).expand(n, out_size, out_size), atol=1e-3
    )
    assert torch.allclose(
        out[:, 1], ys.view(n, out_size, 1).expand(n, out_size, out_size), atol=1e-3
    )
    assert d.flip.any() and not d.flip.all()


# ----------------------------------------------------------------------------- colour ops
def test_jitter_ops_match_torchvision():
    imgs = random_images(4, seed=9)
    x = to_float(imgs)
    aug = BatchAugment(plain(jitter_p=1.0), 32)
    cases = [
        (0, 1.3, TF.adjust_brightness),
        (1, 0.6, TF.adjust_contrast),
        (2, 1.5, TF.adjust_saturation),
        (3, 0.2, TF.adjust_hue),
        (3, -0.45, TF.adjust_hue),
        (0, 0.7, TF.adjust_brightness),
    ]
    for op, value, fn in cases:
        factors = torch.tensor([[1.0, 1.0, 1.0, 0.0]]).repeat(4, 1)
        factors[:, op] = value
        order = torch.tensor([op] + [o for o in range(4) if o != op]).repeat(4, 1)
        d = draw_for(
            4, jitter=torch.ones(4, dtype=torch.bool), jitter_factors=factors, jitter_order=order
        )
        out = aug.apply(imgs, d)
        ref = torch.stack([fn(xi, value) for xi in x])
        assert torch.allclose(out, ref, atol=1e-5), (op, value)


def test_jitter_order_is_per_sample():
    """Brightness then contrast differs from contrast then brightness (clamping at 1)."""
    imgs = random_images(2, seed=3)
    x = to_float(imgs[:1])
    factors = torch.tensor([[1.8, 0.5, 1.0, 0.0]]).repeat(2, 1)
    order = torch.tensor([[0, 1, 2, 3], [1, 0, 2, 3]])
    aug = BatchAugment(plain(jitter_p=1.0), 32)
    out = aug.apply(
        imgs[:1].repeat(2, 1, 1, 1),
        draw_for(
            2, jitter=torch.ones(2, dtype=torch.bool), jitter_factors=factors, jitter_order=order
        ),
    )
    bc = TF.adjust_contrast(TF.adjust_brightness(x[0], 1.8), 0.5)
    cb = TF.adjust_brightness(TF.adjust_contrast(x[0], 0.5), 1.8)
    assert torch.allclose(out[0], bc, atol=1e-5) and torch.allclose(out[1], cb, atol=1e-5)
    assert not torch.allclose(bc, cb, atol=1e-3)


def test_jitter_probability_and_skipped_samples_untouched():
    imgs = random_images(1, seed=4).repeat(600, 1, 1, 1)
    aug = BatchAugment(plain(jitter_p=0.3), 32)
    out = aug(imgs, gen(6))
    unchanged = torch.isclose(out, to_float(imgs), atol=1e-6).flatten(1).all(1)
    assert abs((~unchanged).float().mean().item() - 0.3) < 0.07


def test_one_channel_jitter_uses_brightness_and_contrast_only():
    imgs = random_images(256, c=1, seed=2)
    aug = BatchAugment(plain(jitter_p=1.0, grayscale_p=1.0), 32)
    d = aug.draw(256, 32, 32, 1, "cpu", gen(8))
    assert d.jitter_order.shape == (256, 2)
    out = aug.apply(imgs, d)
    assert out.shape == (256, 1, 32, 32)
    # reproduce with torchvision in each sample's own order
    x = to_float(imgs)
    ops = {0: TF.adjust_brightness, 1: TF.adjust_contrast}
    for i in range(0, 256, 37):
        ref = x[i]
        for op in d.jitter_order[i].tolist():
            ref = ops[op](ref, d.jitter_factors[i, op].item())
        assert torch.allclose(out[i], ref, atol=1e-5)


def test_grayscale_gives_equal_channels():
    imgs = random_images(300, seed=5)
    out = BatchAugment(plain(grayscale_p=1.0), 32)(imgs, gen())
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    assert torch.allclose(out, TF.rgb_to_grayscale(to_float(imgs), 3), atol=1e-5)
    # with probability 0.2 about a fifth of the colour images turn grey
    out = BatchAugment(plain(grayscale_p=0.2), 32)(imgs, gen())
    grey = (out[:, 0] == out[:, 1]).flatten(1).all(1) & (out[:, 1] == out[:, 2]).flatten(1).all(1)
    assert abs(grey.float().mean().item() - 0.2) < 0.07
    # one channel: no-op
    one = imgs[:, :1]
    assert torch.allclose(BatchAugment(plain(grayscale_p=1.0), 32)(one, gen()), to_float(one))


def test_solarize_inverts_pixels_above_half():
    imgs = random_images(8, seed=6)
    x = to_float(imgs)
    out = BatchAugment(plain(solarize_p=1.0), 32)(imgs, gen())
    assert torch.allclose(out, torch.where(x >= 0.5, 1.0 - x, x), atol=1e-6)
    assert out.max() <= 0.5 + 1e-6


def test_blur_matches_torchvision_per_sample_sigma():
    imgs = random_images(6, seed=7)
    x = to_float(imgs)
    aug = BatchAugment(plain(blur_p=1.0), 32)
    k = blur_kernel_size(32)
    assert k % 2 == 1 and k >= 3
    sigma = torch.tensor([0.1, 0.5, 1.0, 1.5, 2.0, 3.0])
    out = aug.apply(imgs, draw_for(6, blur=torch.ones(6, dtype=torch.bool), blur_sigma=sigma))
    for i in range(6):
        ref = TF.gaussian_blur(x[i], [k, k], [sigma[i].item()] * 2)
        assert torch.allclose(out[i], ref, atol=1e-5)
    # kernel ~10% of the image size, odd
    assert blur_kernel_size(96) == 9 and blur_kernel_size(224) == 23 and blur_kernel_size(64) == 7
    # a constant image stays constant; blur_p=0.5 blurs about half the samples
    const = torch.full((4, 3, 32, 32), 77, dtype=torch.uint8)
    assert torch.allclose(aug(const, gen()), to_float(const), atol=1e-6)
    d = BatchAugment(plain(blur_p=0.5), 32).draw(1000, 32, 32, 3, "cpu", gen())
    assert abs(d.blur.float().mean().item() - 0.5) < 0.06
    assert d.blur_sigma.min() >= 0.1 and d.blur_sigma.max() <= 2.0


def test_full_pipeline_on_one_channel_and_small_images():
    params = AugmentParams(blur_p=0.5, solarize_p=0.2)
    for c in (1, 3):
        for size in (1, 2, 7):
            out = BatchAugment(params, size)(random_images(5, c, size), gen())
            assert out.shape == (5, c, size, size)
            assert out.min() >= 0 and out.max() <= 1
