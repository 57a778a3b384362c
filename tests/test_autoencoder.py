"""Client autoencoder (Tab. 9 / Tab. 10): sizes, shapes, pooling modes, and a short training run."""
import pytest
import torch
from torch import nn

from fedssl.models.autoencoder import ClientAutoencoder, reconstruction_loss
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
    spec = [(nn.Conv2d, 3, 64), (nn.Conv2d, 64, 64), (nn.ConvTranspose2d, 64, 64),
            (nn.ConvTranspose2d, 64, 3), (nn.Conv2d, 3, 3)]
    assert [(type(m), m.in_channels, m.out_channels) for m in convs] == spec
    assert all(m.kernel_size == (3, 3) and m.stride == (1, 1) and m.padding == (1, 1) for m in convs)
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


def test_tn_autoencoder_needs_twins():
    with pytest.raises(ValueError, match="even"):
        ClientAutoencoder(width=16, channels_per_group=8)(torch.rand(3, 3, 8, 8))


def test_reconstruction_loss():
    logits = torch.tensor([[0.0, 2.0]])
    target = torch.tensor([[0.5, 1.0]])
    bce = reconstruction_loss(logits, target, "bce")
    expected = -(0.5 * torch.log(torch.tensor(0.5)) + 0.5 * torch.log(torch.tensor(0.5))
                 + torch.log(torch.sigmoid(torch.tensor(2.0)))) / 2
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
    base = torch.nn.functional.interpolate(torch.rand(4, 3, 4, 4), size=16, mode="bilinear",
                                           align_corners=False)
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
