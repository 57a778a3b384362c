"""Client autoencoder (Tab. 9 / Tab. 10): sizes, shapes, pooling modes, and a short training run."""

import pytest
import torch
from torch import nn

from fedssl.models.autoencoder import (
    ClientAutoencoder,
    reconstruction_loss,
    resnet18_blocks_on_client,
)
from fedssl.models.norms import TwinNorm


@pytest.mark.parametrize("norm", ["tn", "gn"])
def test_resnet18_parameter_counts(norm):
    ae = ClientAutoencoder("resnet18", norm=norm, channels_per_group=16)
    assert ae.num_parameters() == 77_853
    assert ae.num_parameters("encoder") == 38_976
    assert ae.num_parameters("decoder") == 77_853 - 38_976


def test_resnet50_parameter_counts():
    ae = ClientAutoencoder("resnet50", norm="tn")
    assert ae.num_parameters() == 521_565
    assert ae.num_parameters("encoder") == 260_928
    assert ae.rep_channels == 128


def test_slim_and_bn_counts():
    assert ClientAutoencoder("resnet18", width=32, channels_per_group=8).num_parameters() == 20_541
    # BN has the same learnable parameters (γ, β); running stats are buffers.
    assert ClientAutoencoder("resnet18", norm="bn").num_parameters() == 77_853


def test_layer_structure_follows_tab9():
    ae = ClientAutoencoder("resnet18", norm="tn")
    convs = [m for m in ae.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    spec = [
        (nn.Conv2d, 3, 64),
        (nn.Conv2d, 64, 64),
        (nn.ConvTranspose2d, 64, 64),
        (nn.ConvTranspose2d, 64, 3),
        (nn.Conv2d, 3, 3),
    ]
    assert [(type(m), m.in_channels, m.out_channels) for m in convs] == spec
    assert all(
        m.kernel_size == (3, 3) and m.stride == (1, 1) and m.padding == (1, 1) for m in convs
    )
    norms = [m for m in ae.modules() if isinstance(m, TwinNorm)]
    assert [n.channels for n in norms] == [64, 64, 64, 3]
    assert norms[-1].num_groups == 1  # the 3-channel TN uses one group
    assert not isinstance(ae.decoder[-1], nn.ReLU)  # logits out


@pytest.mark.parametrize("norm", ["tn", "gn", "bn"])
def test_shapes_resnet18(norm):
    ae = ClientAutoencoder("resnet18", norm=norm, width=32, channels_per_group=8)
    x = torch.rand(4, 3, 32, 32)
    assert ae(x).shape == (4, 3, 32, 32)
    assert ae.encode(x).shape == (4, 32, 16, 16)
    assert torch.equal(ae.reconstruction_target(x), x)


def test_shapes_full_width_and_grey():
    x = torch.rand(2, 3, 32, 32)
    assert ClientAutoencoder("resnet18").encode(x).shape == (2, 64, 16, 16)
    grey = ClientAutoencoder("resnet18", in_channels=1, width=32, channels_per_group=8)
    g = torch.rand(2, 1, 28, 28)
    assert grey(g).shape == (2, 1, 28, 28) and grey.encode(g).shape == (2, 32, 14, 14)


def test_shapes_resnet50():
    ae = ClientAutoencoder("resnet50", width=16, channels_per_group=8)
    x = torch.rand(2, 3, 16, 16)
    assert ae(x).shape == (2, 3, 16, 16)
    assert ae.encode(x).shape == (2, 32, 8, 8)


def test_pool_modes():
    x = torch.rand(2, 3, 32, 32)
    up = ClientAutoencoder(width=16, channels_per_group=8, ae_pool="upsample")
    assert up(x).shape == (2, 3, 32, 32)
    down = ClientAutoencoder(width=16, channels_per_group=8, ae_pool="downsampled_target")
    assert down(x).shape == (2, 3, 16, 16)
    target = down.reconstruction_target(x)
    assert target.shape == (2, 3, 16, 16)
    torch.testing.assert_close(target[0, 0, 0, 0], x[0, 0, :2, :2].mean())
    with pytest.raises(ValueError):
        ClientAutoencoder(ae_pool="inside")
    with pytest.raises(ValueError):
        ClientAutoencoder(arch="vgg")


# Width 64, 3×32×32 input: encoder parameters, exported representation (C, H, W) per cut.
CUTS = {
    1: (1_920, (64, 16, 16)),
    2: (38_976, (64, 16, 16)),
    3: (76_032, (64, 16, 16)),
    4: (113_088, (64, 16, 16)),
    5: (150_144, (64, 16, 16)),
    6: (224_256, (128, 8, 8)),
    7: (372_096, (128, 8, 8)),
}


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_cut_sizes_and_shapes(cut):
    ae = ClientAutoencoder("resnet18", norm="gn", cut=cut)
    enc_params, rep = CUTS[cut]
    assert ae.num_parameters("encoder") == enc_params
    # The mirror decoder has the encoder's weights; its biases and norms (3 numbers a channel)
    # sit on the convs' input channels, so the telescoping sum leaves 3·(3 − C); + Conv(3, 3).
    assert ae.num_parameters("decoder") == enc_params + 3 * (3 - rep[0]) + 84
    x = torch.rand(2, 3, 32, 32)
    assert ae.encode(x).shape == (2, *rep) and ae.rep_channels == rep[0]
    assert ae.prepool_shape(32, 32) == (rep[0], 2 * rep[1], 2 * rep[2])
    assert ae(x).shape == x.shape


@pytest.mark.parametrize("cut", [1, 5, 6, 7])
@pytest.mark.parametrize("pool", ["outside", "upsample", "downsampled_target"])
def test_cut_reconstructs_at_the_input_size(cut, pool):
    ae = ClientAutoencoder(
        "resnet18", in_channels=1, width=8, channels_per_group=4, ae_pool=pool, cut=cut
    )
    for size in (28, 32):
        x = torch.rand(2, 1, size, size)
        assert ae(x).shape == ae.reconstruction_target(x).shape
        stride = 4 if cut >= 6 else 2  # the stride-2 sixth conv, then the MaxPool
        assert ae.encode(x).shape[-2:] == (size // stride, size // stride)
        assert ae.prepool_shape(size, size)[1:] == (2 * size // stride, 2 * size // stride)


def test_cut7_layer_structure_mirrors_the_encoder():
    ae = ClientAutoencoder("resnet18", width=8, channels_per_group=4, cut=7)
    enc = [m for m in ae.encoder if isinstance(m, nn.Conv2d)]
    dec = [m for m in ae.decoder if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    assert [(m.in_channels, m.out_channels, m.stride[0]) for m in enc] == [
        (3, 8, 1),
        (8, 8, 1),
        (8, 8, 1),
        (8, 8, 1),
        (8, 8, 1),
        (8, 16, 2),
        (16, 16, 1),
    ]
    assert all(isinstance(m, nn.ConvTranspose2d) for m in dec[:-1])
    assert [
        (m.in_channels, m.out_channels, m.stride[0], m.output_padding[0]) for m in dec[:-1]
    ] == [
        (16, 16, 1, 0),
        (16, 8, 2, 1),
        (8, 8, 1, 0),
        (8, 8, 1, 0),
        (8, 8, 1, 0),
        (8, 8, 1, 0),
        (8, 3, 1, 0),
    ]
    assert type(dec[-1]) is nn.Conv2d and (dec[-1].in_channels, dec[-1].out_channels) == (3, 3)


def test_cut2_is_the_default_model():
    torch.manual_seed(0)
    default = ClientAutoencoder("resnet18", width=16, channels_per_group=8)
    torch.manual_seed(0)
    cut2 = ClientAutoencoder("resnet18", width=16, channels_per_group=8, cut=2)
    assert repr(default) == repr(cut2)
    for (k, v), (k2, v2) in zip(default.state_dict().items(), cut2.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


def test_cut_validation_and_rserver_blocks():
    assert [resnet18_blocks_on_client(c) for c in range(1, 8)] == [0, 0, 1, 1, 2, 2, 3]
    for bad in (0, 8):
        with pytest.raises(ValueError, match="cut must be in 1..7"):
            ClientAutoencoder(cut=bad)
    with pytest.raises(ValueError, match="cut applies to arch resnet18 only"):
        ClientAutoencoder("resnet50", cut=3)
    assert ClientAutoencoder("resnet50", width=8, channels_per_group=4).prepool_shape(64, 64) == (
        16,
        64,
        64,
    )


def test_tn_autoencoder_needs_twins():
    with pytest.raises(ValueError, match="even"):
        ClientAutoencoder(width=16, channels_per_group=8)(torch.rand(3, 3, 8, 8))


def test_reconstruction_loss():
    logits = torch.tensor([[0.0, 2.0]])
    target = torch.tensor([[0.5, 1.0]])
    bce = reconstruction_loss(logits, target, "bce")
    expected = (
        -(
            0.5 * torch.log(torch.tensor(0.5))
            + 0.5 * torch.log(torch.tensor(0.5))
            + torch.log(torch.sigmoid(torch.tensor(2.0)))
        )
        / 2
    )
    torch.testing.assert_close(bce, expected)
    mse = reconstruction_loss(logits, target, "mse")
    torch.testing.assert_close(mse, ((torch.sigmoid(torch.tensor(2.0)) - 1) ** 2) / 2)
    with pytest.raises(ValueError):
        reconstruction_loss(logits, target, "l1")
    with pytest.raises(ValueError):
        reconstruction_loss(logits, target[:, :1])


def test_tn_autoencoder_trains():
    torch.manual_seed(0)
    ae = ClientAutoencoder("resnet18", width=32, channels_per_group=8, norm="tn")
    # Smooth random images in [0, 1], twin-ordered: view 2 = horizontally flipped view 1.
    base = torch.nn.functional.interpolate(
        torch.rand(4, 3, 4, 4), size=16, mode="bilinear", align_corners=False
    )
    x = torch.cat([base, base.flip(-1)])
    opt = torch.optim.Adam(ae.parameters(), lr=1e-3)
    losses = []
    for _ in range(12):
        loss = reconstruction_loss(ae(x), ae.reconstruction_target(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.01
    assert min(losses[-3:]) < losses[0]


def test_a_channels_last_twin_norm_autoencoder_trains_without_view_copies():
    """Twin Norm hands a channels-last batch back as a view; a ReLU applied in place on it
    would make autograd rebuild the gradient through copies of every activation (the
    channels-last step ran 0.88x of contiguous): the graph holds none."""
    torch.manual_seed(0)
    ae = ClientAutoencoder("resnet18", in_channels=1, width=8, norm="tn", channels_per_group=4)
    ae = ae.to(memory_format=torch.channels_last)
    x = torch.rand(4, 1, 12, 12).contiguous(memory_format=torch.channels_last)
    out = ae(x)
    seen, stack, names = set(), [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    assert "NativeGroupNormBackward0" in names  # Twin Norm's fused kernel is in the graph
    assert not {"CopySlices", "AsStridedBackward0"} & names
