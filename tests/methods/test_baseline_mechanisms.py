"""The baselines' defining mechanisms, each asserted where it happens (not through an end
metric that a neighbouring method would also reach): Orchestra's rotated third view, FeatARC's
anchor of the assigned cluster, SCAFFOLD's corrected step, APFL's scored α-mixture, FSL's
local loss on the client part, FedProx's proximal gradient. Each test kills a one-line mutant
of ``benchmarks/mutants.toml`` that the rest of the suite let pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import Batch, OptimizerConfig, StackedOptimizer, clip_grad_norm
from fedssl.losses import nt_xent
from fedssl.methods import federated
from fedssl.methods import federated_supervised as runtime
from fedssl.methods.featarc import strategy as featarc
from fedssl.methods.fedbyol import FedEMAParams
from fedssl.methods.mpfedcon import personalised as P
from fedssl.methods.mpfedcon import train as T
from fedssl.methods.orchestra.model import orchestra_views
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.strategies.references import REFERENCES
from tests.fl.test_engine import SHAPE, toy_data
from tests.methods.featarc import test_featarc_rules as featarc_rules
from tests.methods.fedbyol import test_fedbyol_rules as byol_rules
from tests.methods.fedsimclr import test_fedsimclr_rules as fedsimclr_rules
from tests.methods.fsl import test_fsl_rules as fsl_rules
from tests.methods.mpfedcon.test_mpfedcon import params as mpfedcon_params
from tests.methods.mpfedcon.test_mpfedcon import toy_federation
from tests.methods.mpfedcon.test_mpfedcon_personalised import toy_batch
from tests.methods.orchestra.test_orchestra_rules import tiny_params as orchestra_params
from tests.methods.supervised import test_supervised_rules as sup_rules

pytestmark = pytest.mark.usefixtures("one_thread")


def randn_like(tensors: dict, seed: int, scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(v.shape, generator=g) for k, v in tensors.items()}


# ------------------------------------------------------------------ Orchestra
def test_orchestras_third_view_is_an_augmentation_turned_by_its_rotation_label():
    p = orchestra_params()
    augment, prime = BatchAugment(p.augment, 28), BatchAugment(p.augment_prime, 28)
    images = toy_data(12).images
    g = torch.Generator().manual_seed(3)
    x1, x2, x3, turns = orchestra_views(augment, prime)(images, g)
    g = torch.Generator().manual_seed(3)  # the same draws, in the same order
    y1, y2, y3 = augment(images, g), prime(images, g), augment(images, g)
    assert torch.equal(x1, y1) and torch.equal(x2, y2)
    assert len(set(turns.tolist())) > 1  # 12 draws of 4 turns: some are not 0
    for i, k in enumerate(turns.tolist()):
        assert torch.equal(x3[i], torch.rot90(y3[i], k, dims=(1, 2))), (i, k)


# ------------------------------------------------------------------ FeatARC
def test_featarc_trains_from_and_aligns_to_the_cluster_the_client_is_assigned(tmp_path):
    p = featarc_rules.tiny_params()  # C = 3 independently drawn cluster models
    fed, state = featarc_rules.federation(p, tmp_path)
    s = fed.strategy
    state.memo["assignment"] = [2, 1, 0]
    for client, cluster in enumerate([2, 1, 0]):
        start = s.local_start(state, client, s.download(state, client))
        model = state.server[featarc.cluster_key(cluster)]
        for k in s.backbone_keys:  # the anchor is the assigned cluster's backbone
            anchor = featarc.ANCHOR + k[len(featarc.NET + "backbone.") :]
            assert torch.equal(start[anchor], model[k]), (client, k)
        for k, v in model.items():  # and the client trains from that cluster's model
            assert torch.equal(start[k], v), (client, k)
    other = state.server[featarc.cluster_key(0)][s.backbone_keys[0]]
    assert not torch.equal(other, state.server[featarc.cluster_key(2)][s.backbone_keys[0]])


# ------------------------------------------------------------------ SCAFFOLD
def test_one_scaffold_step_descends_g_minus_c_i_plus_c(tmp_path):
    p = mpfedcon_params("scaffold")
    fed, model = toy_federation(tmp_path, p)
    state, s = fed.start(model), fed.strategy
    state.server["control"] = randn_like(state.server["control"], 0)
    c = state.server["control"]
    c_i = randn_like(c, 1)
    state.clients[0] = {"control." + k: v for k, v in c_i.items()}
    start = s.local_start(state, 0, s.download(state, 0))
    weights = {k: v.clone() for k, v in start.items()}
    buffers = {k: weights.pop(k) for k in ("centres", "has_centre")}
    net = {k: weights[k].requires_grad_(True) for k in c}
    batch = toy_batch()
    g = torch.autograd.grad(T.ce_loss()(model, weights, buffers, batch), list(net.values()))
    step = torch.autograd.grad(
        P.scaffold_loss()(model, weights, buffers, batch), list(net.values())
    )
    for k, g_k, step_k in zip(net, g, step):
        assert torch.allclose(step_k, g_k - c_i[k] + c[k], atol=1e-6), k


# ------------------------------------------------------------------ APFL
@pytest.mark.parametrize("alpha", [0.25, 0.7])
def test_apfl_scores_each_party_with_the_mixture_alpha_v_plus_one_minus_alpha_w(tmp_path, alpha):
    fed, model = toy_federation(tmp_path, mpfedcon_params("apfl", apfl_alpha=0.5))
    state, s = fed.start(model), fed.strategy
    personal = {k: v for k, v in s.initial.items() if k.startswith("personal.")}
    state.clients[1] = {**randn_like(personal, 2), "alpha": torch.tensor(alpha)}
    w = {k[len("net.") :]: v for k, v in state.server["global"].items() if k.startswith("net.")}
    v = {k[len("personal.") :]: t for k, t in state.clients[1].items() if k != "alpha"}
    scored = s.party_state(state, 1)
    assert scored.keys() == v.keys()
    for k in v:
        assert torch.allclose(scored[k], alpha * v[k] + (1 - alpha) * w[k], atol=1e-6), k


# ------------------------------------------------------------------ FSL
def test_fsl_client_part_and_aux_head_descend_the_local_loss_the_server_copy_its_own():
    p = fsl_rules.params()
    model = runtime.build_model(p, SHAPE, fsl_rules.CLASSES, torch.device("cpu"))
    x, batch = sup_rules._batch()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    loss = runtime.trainer_loss(p)(model, params, buffers, batch)
    got = torch.autograd.grad(loss, list(params.values()))
    local = F.cross_entropy(model.aux(model.client(x)), batch.labels)
    server = F.cross_entropy(model.server(model.client(x).detach()), batch.labels)
    want = torch.autograd.grad(local + server, list(params.values()), allow_unused=True)
    for k, a, b in zip(params, got, want):
        assert b is not None and b.abs().sum() > 0, k  # every part learns
        assert torch.allclose(a, b, atol=1e-6), k


def test_an_fsl_round_moves_the_client_part_and_lowers_its_local_loss(tmp_path):
    p = fsl_rules.params(local_epochs=3)
    model = runtime.build_model(p, SHAPE, fsl_rules.CLASSES, torch.device("cpu"))
    data = toy_data()
    x, y = data.images[:20].float() / 255, data.labels[:20]

    def local_loss(weights):
        with torch.no_grad():
            model.load_state_dict(weights)
            model.eval()
            return float(F.cross_entropy(model.aux(model.client(x)), y))

    start = {k: v.clone() for k, v in model.state_dict().items()}
    state, _ = fsl_rules.one_round(p, tmp_path / "f.pt", model)
    end = state.server["global"]
    for k in (k for k, _ in model.named_parameters() if k.startswith(("client.", "aux."))):
        assert not torch.equal(end[k], start[k]), k
    assert local_loss(end) < local_loss(start)


# ------------------------------------------------------------------ FedProx
def test_the_fedprox_gradient_is_the_ce_gradient_plus_mu_times_w_minus_the_global_model():
    p, model = sup_rules._perturbed(2, "fedprox", 0.7)
    _, batch = sup_rules._batch()
    net = dict(model.net.named_parameters())
    got = torch.autograd.grad(sup_rules._loss(p, model, batch), list(net.values()))
    x = batch.views[0]
    ce = torch.autograd.grad(F.cross_entropy(model.net(x), batch.labels), list(net.values()))
    glob = dict(model.glob.named_parameters())
    for (k, w), g_ce, g in zip(net.items(), ce, got):
        assert torch.allclose(g, g_ce + p.federation.strategy.mu * (w - glob[k]), atol=1e-6), k
    # and the loss gives the frozen references no gradient
    assert all(not w.requires_grad for w in model.glob.parameters())
    assert REFERENCES == ("glob", "prev")


def test_a_clipped_step_rescales_each_clients_gradient_to_the_norm_as_torch_does():
    grads = {"a": torch.tensor([[3.0, 4.0], [0.3, 0.4]]), "b": torch.tensor([[12.0], [0.0]])}
    clipped = clip_grad_norm(grads, 10.0)  # client 0: norm 13 -> 10; client 1: 0.5 stays
    for i in range(2):
        params = [torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)]
        for w, k in zip(params, grads):
            w.grad = grads[k][i].clone()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        for w, k in zip(params, grads):
            assert torch.allclose(clipped[k][i], w.grad, atol=1e-6), (i, k)
    opt = StackedOptimizer(OptimizerConfig("sgd", momentum=0.0, clip_norm=10.0))
    params = {k: torch.zeros_like(g) for k, g in grads.items()}
    opt.step(params, grads, opt.init(params), 0.1)
    assert all(torch.allclose(params[k], -0.1 * clipped[k]) for k in grads)


def test_scaffold_clips_its_steps_only_when_asked(tmp_path):
    """FedRep's code clips every SCAFFOLD step at norm 10 (scaffold_clip_norm); the default
    (None) is the canonical unclipped step of the committed results."""
    moved = {}
    for clip in (None, 1e-3):
        p = mpfedcon_params("scaffold", rounds=1, momentum=0.0, scaffold_clip_norm=clip)
        fed, model = toy_federation(tmp_path, p, f"c{clip}.pt")
        start = fed.start(model)
        x0 = {k: v.clone() for k, v in start.server["global"].items()}
        end = fed.run(start).server["global"]
        moved[clip] = max(float((end[k] - x0[k]).abs().max()) for k in fed.strategy.net_params)
    # 2 steps of lr 0.05 at norm <= 1e-3: no weight moves by more than 1e-4 (+ weight decay)
    assert moved[1e-3] < 2e-4 < moved[None]


# ------------------------------------------------------------------ MOON
def test_a_moon_client_that_never_trained_has_no_negative_even_after_round_one(tmp_path):
    p = sup_rules.params("moon", 1.0, rounds=3)
    fed, model = sup_rules.federation(p, tmp_path / "m.pt")
    state = fed.start(model)
    state.round = 2  # partial participation: client 2 is sampled for the first time
    state.clients[0] = {k: v + 1 for k, v in state.server["global"].items()}
    received = state.server["global"]
    assert float(fed.strategy.local_start(state, 0, received)["has_prev"]) == 1.0
    start = fed.strategy.local_start(state, 2, received)
    assert float(start["has_prev"]) == 0.0  # l_con = 0: CE alone


def test_the_authors_first_round_negative_adds_log_2_and_no_gradient():
    """Their never-trained client's negative is its initial network, in round 1 the global
    model: the term is the constant log 2, so the step is the CE step, as here."""
    p, model = sup_rules._perturbed(4)
    model.prev.load_state_dict(model.glob.state_dict())
    _, batch = sup_rules._batch()
    net = list(model.net.parameters())
    with_term = torch.autograd.grad(sup_rules._loss(p, model, batch), net)
    model.has_prev.fill_(0.0)
    without = torch.autograd.grad(sup_rules._loss(p, model, batch), net)
    for a, b in zip(with_term, without):
        assert torch.allclose(a, b, atol=1e-6)


def test_featarc_evaluates_the_cluster_serving_the_most_data_not_cluster_zero(tmp_path):
    p = featarc_rules.tiny_params()
    fed, state = featarc_rules.federation(p, tmp_path)
    s = fed.strategy
    # toy clients hold 20, 30 and 40 samples: clusters 1 and 2 serve 50 and 40, cluster 0 none
    state.memo["assignment"] = [1, 1, 2]
    assert s.served(state) == [0, 50, 40]
    final = s.final_model(state)
    for k, v in state.server[featarc.cluster_key(1)].items():
        assert torch.equal(final[k], v), k
    state.memo["assignment"] = [1, 0, 2]  # now cluster 2 serves the most (40 against 30, 20)
    assert torch.equal(
        s.final_model(state)[s.backbone_keys[0]],
        state.server[featarc.cluster_key(2)][s.backbone_keys[0]],
    )


# ------------------------------------------------------------------ FedSimCLR, FedEMA
def test_fedsimclrs_local_loss_leaves_the_padded_rows_of_a_short_batch_out():
    p = fedsimclr_rules.tiny_params()
    model = seeded_contrastive_model(p.model, (1, 28, 28), 0, torch.device("cpu"))
    x = toy_data(8).images.float() / 255
    v1, v2 = x, x.flip(-1)
    valid = torch.tensor([True] * 6 + [False] * 2)
    batch = Batch((v1, v2), torch.zeros(8), valid)
    weights, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    got = federated.trainer_loss(p)(model, weights, buffers, batch)
    with torch.no_grad():
        z1, z2 = model(torch.cat([v1, v2])).chunk(2)
    assert torch.allclose(got, nt_xent(z1, z2, p.temperature, valid), atol=1e-5)
    assert not torch.allclose(got, nt_xent(z1, z2, p.temperature), atol=1e-3)


def test_fedemas_decay_is_capped_at_one(tmp_path):
    p = byol_rules.params(FedEMAParams, tau=0.7, divergence="local_progress")
    fed, model = byol_rules.federation(p, tmp_path)
    state = fed.start(model)
    state.memo["divergence"] = {0: 0.5}
    state.memo["scaler"] = {0: 0.7 / 0.1}  # fixed at a first divergence of 0.1
    assert fed.strategy.decay(state, 0, {}, {}) == 1.0  # lambda d = 3.5: capped
    state.memo["divergence"] = {0: 0.05}
    assert fed.strategy.decay(state, 0, {}, {}) == pytest.approx(0.35)
