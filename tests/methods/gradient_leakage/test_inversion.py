"""Model-inversion decoder and SSIM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.attacks.inversion import (
    InversionDecoder,
    gaussian_window,
    invert,
    reconstruction_mse,
    ssim,
    train_decoder,
)

# small convs: thread hand-offs cost more than they save (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def smooth_images(n: int, channels: int, size: int, seed: int) -> torch.Tensor:
    """Blurred noise in [0, 1]: images with structure at several scales."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.rand((n, channels, size // 4, size // 4), generator=gen)
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def test_gaussian_window_is_normalised_and_symmetric():
    w = gaussian_window(11, 1.5)
    assert w.shape == (11,) and float(w.sum()) == pytest.approx(1.0)
    assert torch.allclose(w, w.flip(0)) and int(w.argmax()) == 5
    assert float(w[5] / w[6]) == pytest.approx(torch.exp(torch.tensor(1 / 4.5)).item())


def test_ssim_of_an_image_with_itself_is_one_and_falls_with_noise():
    x = smooth_images(4, 3, 32, 0)
    assert torch.allclose(ssim(x, x), torch.ones(4), atol=1e-6)
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(x.shape, generator=gen)
    scores = [ssim(x, (x + s * noise).clamp(0, 1)).mean().item() for s in (0.02, 0.1, 0.3)]
    assert 1 > scores[0] > scores[1] > scores[2]
    assert torch.allclose(ssim(x, x + 0.1 * noise), ssim(x + 0.1 * noise, x))  # symmetric


def test_ssim_of_two_flat_images_by_hand():
    # no variance: SSIM = (2ab + C1) / (a^2 + b^2 + C1) with C1 = 0.01^2
    a, b, c1 = 0.5, 0.25, 1e-4
    got = ssim(torch.full((1, 1, 16, 16), a), torch.full((1, 1, 16, 16), b))
    assert got.item() == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-5)


def test_ssim_rejects_tiny_or_mismatched_images():
    with pytest.raises(ValueError, match="window"):
        ssim(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8))
    with pytest.raises(ValueError, match="one shape"):
        ssim(torch.zeros(1, 1, 16, 16), torch.zeros(1, 3, 16, 16))


@pytest.mark.parametrize("in_size,out_size", [(8, 32), (7, 28), (5, 32), (16, 16)])
def test_decoder_output_shape(in_size, out_size):
    decoder = InversionDecoder(12, 3, in_size, out_size, width=32)
    with torch.no_grad():
        out = decoder(torch.randn(2, 12, in_size, in_size))
    assert out.shape == (2, 3, out_size, out_size)
    assert float(out.min()) >= 0 and float(out.max()) <= 1


def test_decoder_learns_to_invert_a_fixed_downsampling_encoder():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU())  # 16 -> 8 px
    train, held_out = smooth_images(256, 1, 16, 1), smooth_images(64, 1, 16, 2)
    with torch.no_grad():
        train_h, held_h = encoder(train), encoder(held_out)
    decoder = InversionDecoder(8, 1, 8, 16, width=32)
    before = reconstruction_mse(invert(decoder, held_h), held_out).mean().item()
    history = train_decoder(decoder, train_h, train, epochs=15, batch_size=32, lr=3e-3)
    assert len(history) == 15 and history[-1] < history[0] / 5
    recon = invert(decoder, held_h)
    after = reconstruction_mse(recon, held_out)
    assert after.shape == (64,)
    assert after.mean().item() < before / 5  # generalises to images it never saw
    flat_guess = ssim(torch.full_like(held_out, 0.5), held_out).mean()
    assert ssim(recon, held_out).mean() > flat_guess + 0.3
