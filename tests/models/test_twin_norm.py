"""Twin Normalization (spec §2.4): GN equivalence, pair independence, moments, variants."""

import pytest
import torch
from torch import nn

from fedssl.models.norms import TwinNorm, has_running_stats, make_norm


def _randomise_affine(m: nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        m.weight.copy_(torch.randn(m.weight.shape, generator=gen) + 1.0)
        m.bias.copy_(torch.randn(m.bias.shape, generator=gen))


@pytest.mark.parametrize("channels,per_group", [(64, 16), (64, 1), (32, 8), (3, 16), (12, 4)])
@pytest.mark.parametrize("variance", ["joint", "avg_of_views"])
def test_twin_of_itself_equals_groupnorm(channels, per_group, variance):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, channels, 7, 6, generator=gen) * 3 + 1
    tn = TwinNorm(channels, per_group, variance=variance)
    _randomise_affine(tn, gen)
    groups = channels // min(per_group, channels)
    gn = nn.GroupNorm(groups, channels, eps=1e-5)
    with torch.no_grad():
        gn.weight.copy_(tn.weight)
        gn.bias.copy_(tn.bias)
    y = tn(torch.cat([x, x]))
    ref = gn(x)
    torch.testing.assert_close(y[:5], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y[5:], ref, atol=1e-5, rtol=1e-5)


def test_pairs_are_independent():
    gen = torch.Generator().manual_seed(1)
    k = 6
    x = torch.randn(2 * k, 32, 5, 5, generator=gen)
    tn = TwinNorm(32, 8)
    _randomise_affine(tn, gen)
    y = tn(x)
    x2 = x.clone()
    j = 2  # change both views of pair j
    x2[j] = torch.randn(32, 5, 5, generator=gen) * 10
    x2[j + k] = torch.randn(32, 5, 5, generator=gen) - 4
    y2 = tn(x2)
    others = [i for i in range(2 * k) if i not in (j, j + k)]
    assert torch.equal(y[others], y2[others])
    assert not torch.allclose(y[[j, j + k]], y2[[j, j + k]])


def test_twin_pairing_uses_rows_k_and_k_plus_K():
    """Only the twin (row k+K) influences row k: swapping another row's twin does nothing."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(8, 16, 4, 4, generator=gen)
    tn = TwinNorm(16, 4)
    y = tn(x)
    x_mod = x.clone()
    x_mod[5] += 3.0  # twin of row 1
    y_mod = tn(x_mod)
    assert not torch.allclose(y[1], y_mod[1])
    assert torch.equal(y[[0, 2, 3, 4, 6, 7]], y_mod[[0, 2, 3, 4, 6, 7]])


def test_pooled_moments_are_standardised():
    gen = torch.Generator().manual_seed(3)
    k, c, lam, h, w = 4, 32, 8, 6, 5
    x = torch.randn(2 * k, c, h, w, generator=gen) * 5 + 2
    x[k:] = x[k:] * 0.3 - 1.5  # second views on a different scale and offset
    y = TwinNorm(c, lam)(x).detach().double()
    pooled = y.reshape(2, k, c // lam, lam * h * w).permute(1, 2, 0, 3).reshape(k, c // lam, -1)
    assert pooled.shape[-1] == 2 * lam * h * w
    torch.testing.assert_close(
        pooled.mean(-1), torch.zeros(k, c // lam, dtype=torch.double), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        pooled.var(-1, unbiased=False),
        torch.ones(k, c // lam, dtype=torch.double),
        atol=1e-3,
        rtol=0,
    )


def test_joint_and_avg_of_views_differ_by_between_view_term():
    gen = torch.Generator().manual_seed(4)
    k, c, lam, h, w = 3, 8, 4, 5, 5
    eps = 1e-5
    x = (
        torch.randn(2 * k, c, h, w, generator=gen, dtype=torch.double)
        + torch.randn(2 * k, c, 1, 1, generator=gen, dtype=torch.double) * 2
    )
    joint = TwinNorm(c, lam, eps=eps, variance="joint").double()
    avg = TwinNorm(c, lam, eps=eps, variance="avg_of_views").double()
    yj, ya = joint(x), avg(x)
    # Per (pair, group) moments of each view, computed by hand.
    xg = x.reshape(2, k, c // lam, lam * h * w)
    m1, m2 = xg[0].mean(-1), xg[1].mean(-1)
    v1, v2 = xg[0].var(-1, unbiased=False), xg[1].var(-1, unbiased=False)
    var_avg = (v1 + v2) / 2
    var_joint = var_avg + ((m1 - m2) / 2) ** 2
    torch.testing.assert_close(
        xg.permute(1, 2, 0, 3).reshape(k, c // lam, -1).var(-1, unbiased=False), var_joint
    )
    # Same centring, scales related through the two variances:
    # yj * sqrt(vj+eps) == ya * sqrt(va+eps)
    scale_j = (var_joint + eps).sqrt().repeat_interleave(lam, dim=1)[None, :, :, None, None]
    scale_a = (var_avg + eps).sqrt().repeat_interleave(lam, dim=1)[None, :, :, None, None]
    yj5 = yj.reshape(2, k, c, h, w)
    ya5 = ya.reshape(2, k, c, h, w)
    torch.testing.assert_close(yj5 * scale_j, ya5 * scale_a)
    assert (var_joint - var_avg).min() > 0  # the between-view term is really there
    assert not torch.allclose(yj, ya)


def test_variants_coincide_for_identical_twins():
    x = torch.randn(3, 16, 4, 4)
    xx = torch.cat([x, x])
    torch.testing.assert_close(TwinNorm(16, 4)(xx), TwinNorm(16, 4, variance="avg_of_views")(xx))


def test_odd_batch_and_bad_channels_raise():
    tn = TwinNorm(16, 4)
    with pytest.raises(ValueError, match="even batch"):
        tn(torch.randn(3, 16, 4, 4))
    with pytest.raises(ValueError, match="channels"):
        tn(torch.randn(4, 8, 4, 4))
    with pytest.raises(ValueError, match="groups"):
        TwinNorm(24, 16)
    with pytest.raises(ValueError, match="variance"):
        TwinNorm(16, 4, variance="nope")


def test_gradients_flow():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 8, 3, 3, generator=gen, requires_grad=True)
    tn = TwinNorm(8, 4)
    target = torch.randn(4, 8, 3, 3, generator=gen)
    loss = ((tn(x) - target) ** 2).sum()
    loss.backward()
    for t in (x.grad, tn.weight.grad, tn.bias.grad):
        assert t is not None and torch.isfinite(t).all() and t.abs().sum() > 0


def test_a_channels_last_batch_is_normalised_alike_and_stays_channels_last():
    """The channels-last path pairs the same rows (k, k + K) and the same channel groups as the
    contiguous one: equal outputs and gradients, and its output keeps the layout."""
    torch.manual_seed(0)
    norm = TwinNorm(16, 4)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = torch.randn(6, 16, 5, 7)
    last = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    plain = x.clone().requires_grad_()
    out_last, out_plain = norm(last), norm(plain)
    assert out_last.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out_last, out_plain)
    upstream = torch.randn(6, 16, 5, 7)
    (out_last * upstream).sum().backward()
    (out_plain * upstream).sum().backward()
    torch.testing.assert_close(last.grad, plain.grad)


def test_gradcheck_double():
    x = torch.randn(4, 4, 2, 3, dtype=torch.double, requires_grad=True)
    for variance in ("joint", "avg_of_views"):
        tn = TwinNorm(4, 2, variance=variance).double()
        assert torch.autograd.gradcheck(tn, (x,))


def test_no_running_stats_and_train_eval_identical():
    tn = TwinNorm(8, 4)
    assert not has_running_stats(tn) and len(list(tn.buffers())) == 0
    x = torch.randn(6, 8, 3, 3)
    y_train = tn.train()(x)
    y_eval = tn.eval()(x)
    assert torch.equal(y_train, y_eval)


def test_make_norm_kinds():
    assert isinstance(make_norm("bn", 8), nn.BatchNorm2d)
    gn = make_norm("gn", 64, 16)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 4
    assert make_norm("gn", 3, 16).num_groups == 1
    tn = make_norm("tn", 64, 16)
    assert isinstance(tn, TwinNorm) and tn.num_groups == 4 and tn.variance == "joint"
    tn3 = make_norm("tn", 3, 16, tn_variance="avg_of_views")
    assert tn3.num_groups == 1 and tn3.variance == "avg_of_views"
    with pytest.raises(ValueError):
        make_norm("ln", 8)
    with pytest.raises(ValueError):
        make_norm("gn", 24, 16)


@pytest.mark.parametrize("variance", ["joint", "avg_of_views"])
def test_twin_norm_leaves_a_pair_signature_mirrored_group_means(variance):
    """The signature the Twin Norm question is about, pinned to the layer: per pair and group,
    the two normalised views have opposite means (m_a = -m_b), whatever the content, and each
    view's variance is tied to that mean (joint: var_a + m_a^2 + var_b + m_b^2 = 2)."""
    torch.manual_seed(0)
    k, c, per_group = 5, 8, 4
    layer = TwinNorm(c, per_group, affine=False, variance=variance)
    x = torch.randn(2 * k, c, 6, 6) * 3 + torch.randn(2 * k, c, 1, 1) * 2
    y = layer(x).view(2 * k, c // per_group, -1)
    m_a, m_b = y[:k].mean(-1), y[k:].mean(-1)
    assert torch.allclose(m_a, -m_b, atol=1e-5)
    assert (m_a.abs() > 0.05).any()  # a real signature, not zero
    if variance == "joint":
        second = (y[:k] ** 2).mean(-1) + (y[k:] ** 2).mean(-1)
        assert torch.allclose(second, torch.full_like(second, 2.0), atol=1e-3)


def test_restandardizing_the_rservers_inputs_removes_group_means():
    from fedssl.models.rserver import Restandardize, RServerModel

    z = torch.randn(4, 8, 5, 5) + torch.arange(8.0).view(1, 8, 1, 1)
    g = Restandardize("group", 4)(z).view(4, 2, -1)
    assert torch.allclose(g.mean(-1), torch.zeros(4, 2), atol=1e-5)
    assert torch.allclose(g.var(-1, unbiased=False), torch.ones(4, 2), atol=1e-3)
    c = Restandardize("channel_mean")(z)
    assert torch.allclose(c.mean((2, 3)), torch.zeros(4, 8), atol=1e-5)
    assert torch.equal(Restandardize("none")(z), z)
    plain = RServerModel("resnet18", 8, 4, 16, 8)
    assert set(plain.state_dict()) == set(
        RServerModel("resnet18", 8, 4, 16, 8, restandardize="group").state_dict()
    )  # no parameters added


def test_cross_and_pseudo_export_pairings_share_nothing_between_positives():
    from fedssl.methods.mfcl.run import encode_pair
    from fedssl.models.autoencoder import ClientAutoencoder

    torch.manual_seed(0)
    model = ClientAutoencoder("resnet18", 1, 8, "tn", 4).eval()
    v1, v2 = torch.rand(6, 1, 28, 28), torch.rand(6, 1, 28, 28)
    with torch.no_grad():
        cross = encode_pair(model, v1, v2, "cross")
        twin = encode_pair(model, v1, v2, "twin")
        changed = v2.clone()
        changed[2] = torch.rand(1, 28, 28)  # sample 2's second view
        after = encode_pair(model, v1, changed, "cross")
    assert torch.allclose(after[2], cross[2])  # its first view did not see it...
    assert not torch.allclose(after[3], cross[3])  # ...sample 3's first view did (cross)
    assert not torch.allclose(twin[2], cross[2])
    # cross: view 1 of sample k is normalised with view 2 of sample k-1
    manual = model.encode(torch.cat([v1, v2.roll(1, 0)]))[:6]
    assert torch.allclose(cross[:6], manual, atol=1e-6)
