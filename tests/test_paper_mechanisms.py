"""The papers' defining mechanisms that their value tests leave open (each kills a one-line
mutant of ``benchmarks/mutants.yaml``): MpFedcon's positive is the centre of each sample's own
class."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedssl.fl.cohort import Batch
from fedssl.methods.mpfedcon import run as R
from fedssl.methods.mpfedcon import train as T
from tests.fixtures import toy_images
from tests.test_mpfedcon import CPU, params


def test_mpfedcons_positive_is_the_global_centre_of_each_samples_own_class():
    p = params("mpfedcon", mu=2.0)
    model = R.seeded_model(p, (1, 28, 28), 4, CPU)
    images, labels = toy_images(12, 0)
    assert len(set(labels.tolist())) > 1
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for k in [k for k in state if k.startswith("anchor.")]:
        state[k] = state[k] + 0.1 * torch.randn(state[k].shape, generator=g)
    weights = {k: v for k, v in state.items() if k not in ("centres", "has_centre")}
    buffers = {"centres": torch.randn(4, 8, generator=g), "has_centre": torch.ones(4)}
    x, y = torch.from_numpy(images[:, None]).float() / 255, torch.from_numpy(labels)
    batch = Batch((x,), y, torch.ones(12, dtype=torch.bool))
    logits, z, z_con = torch.func.functional_call(model, (weights, buffers), (x, True))
    pos = F.cosine_similarity(z, buffers["centres"][y]) / 0.5
    neg = F.cosine_similarity(z, z_con) / 0.5
    l_con = (torch.logsumexp(torch.stack([pos, neg]), 0) - pos).mean()
    expected = F.cross_entropy(logits, y) + 2.0 * l_con
    got = T.contrast_loss(2.0, 0.5)(model, weights, buffers, batch)
    assert torch.allclose(got, expected, atol=1e-5)
