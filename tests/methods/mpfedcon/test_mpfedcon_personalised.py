"""The personalised baselines of MpFedcon's Tab. 1 (spec methods/baselines.md §8-11): what
defines SCAFFOLD, APFL, Ditto and Per-FedAvg, each in a test that fails when its rule changes by
one line; their traffic, resumption and a run through the stages of a tiny project."""

from __future__ import annotations

import json

import pytest
import torch
from torch.func import functional_call

from fedssl.fl.cohort import Batch
from fedssl.methods.mpfedcon import personalised as P
from fedssl.methods.mpfedcon import run as R
from fedssl.methods.mpfedcon import train as T
from fedssl.stage.runtime import numpy_rng
from fedssl.strategies import perfedavg
from fedssl.strategies import scaffold as S
from tests.fixtures import federation_changed, make_tiny_project, toy_images
from tests.methods.mpfedcon.test_mpfedcon import (
    CPU,
    killed_and_resumed,
    params,
    run,
    toy_federation,
)
from tests.methods.mpfedcon.test_mpfedcon_chain import EXPERIMENT, PARTITION, run_in_process

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = (1, 28, 28)


def net_of(state: dict, prefix: str = "net") -> dict:
    return {k: v for k, v in state.items() if k.startswith(prefix + ".")}


def toy_batch(n: int = 12, seed: int = 0) -> Batch:
    images, labels = toy_images(n, seed)
    x = torch.from_numpy(images[:, None]).float() / 255
    return Batch((x,), torch.from_numpy(labels), torch.ones(n, dtype=torch.bool))


def assert_equal(a: dict, b: dict, rename=lambda k: k):
    assert a.keys() and {rename(k) for k in a} <= set(b)
    for k, v in a.items():
        assert torch.equal(v, b[rename(k)]), k


# ------------------------------------------------------------------ SCAFFOLD
def quadratic_run(rounds: int, scaffold: bool, steps: int = 20, lr: float = 0.05):
    """Spec §8.6: two clients f_i(w) = a_i/2 ||w - b_i||^2, K local GD steps, full
    participation; every step descends the corrected gradient (or FedAvg's plain one)."""
    a = [1.0, 10.0]
    b = [torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([-3.0, 0.5]).double()]
    x, c = {"w": torch.zeros(2, dtype=torch.float64)}, {"w": torch.zeros(2, dtype=torch.float64)}
    c_i = [{"w": torch.zeros(2, dtype=torch.float64)} for _ in a]
    for _ in range(rounds):
        ys, dcs = [], []
        for i in range(2):
            y = x["w"].clone()
            for _ in range(steps):
                g = a[i] * (y - b[i])
                y = y - lr * (g - c_i[i]["w"] + c["w"] if scaffold else g)
            ys.append({"w": y})
            new = S.option_two(c_i[i], c, x, ys[-1], steps, lr) if scaffold else c_i[i]
            dcs.append({"w": new["w"] - c_i[i]["w"]})
            c_i[i] = new
        x, c = S.scaffold_server(x, c, ys, dcs, 1.0, 2)
    optimum = (a[0] * b[0] + a[1] * b[1]) / sum(a)
    return x["w"], optimum


def test_scaffold_reaches_the_optimum_of_the_two_client_quadratic_where_fedavg_does_not():
    fedavg, optimum = quadratic_run(300, scaffold=False)
    scaffold, _ = quadratic_run(300, scaffold=True)
    assert (fedavg - optimum).norm() > 0.3  # client drift: FedAvg's fixed point is elsewhere
    assert (scaffold - optimum).norm() < 1e-4


def test_the_server_control_variate_grows_by_the_sum_of_updates_over_all_clients():
    x, c = {"w": torch.zeros(3)}, {"w": torch.ones(3)}
    ys = [{"w": torch.full((3,), 2.0)}, {"w": torch.full((3,), 4.0)}]
    dcs = [{"w": torch.full((3,), 4.0)}, {"w": torch.full((3,), 8.0)}]
    new_x, new_c = S.scaffold_server(x, c, ys, dcs, 0.5, 6)  # 2 of N = 6 clients sampled
    assert torch.equal(new_x["w"], torch.full((3,), 1.5))  # eta_g * mean(y - x)
    assert torch.equal(new_c["w"], torch.full((3,), 3.0))  # 1 + 12 / 6, not 12 / 2


def test_the_scaffold_loss_descends_the_gradient_corrected_by_c_minus_c_i():
    p = params("scaffold")
    model = R.seeded_model(p, SHAPE, 4, CPU)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for k in net_of(state, "correction"):
        state[k] = torch.randn(state[k].shape, generator=g)
    buffers = {k: state.pop(k) for k in ("centres", "has_centre")}
    batch = toy_batch()
    net = {k: v.requires_grad_(True) for k, v in net_of(state).items()}
    weights = {**state, **net}
    plain = torch.autograd.grad(T.ce_loss()(model, weights, buffers, batch), list(net.values()))
    corrected = torch.autograd.grad(
        P.scaffold_loss()(model, weights, buffers, batch), list(net.values())
    )
    for k, gp, gc in zip(net, plain, corrected):
        assert torch.allclose(gc, gp + state["correction." + k[len("net.") :]], atol=1e-6), k


def test_scaffold_keeps_c_i_on_each_client_and_c_is_their_mean_over_all_clients(tmp_path):
    """c starts at 0 and every c_i at 0, so c = (1/N) sum_i c_i after any round when the
    server adds (1/N) sum of the sampled clients' updates; idle clients keep theirs."""
    p = params("scaffold", rounds=3, client_fraction=2 / 3, momentum=0.0, weight_decay=0.0)
    fed, state = run(tmp_path, p)
    c = state.server["control"]
    for k, v in c.items():
        held = [state.clients[i]["control." + k] for i in state.clients]
        assert torch.allclose(v, torch.stack(held).sum(0) / 3, atol=1e-6), k
        assert v.abs().sum() > 0
    # the control variates travel both ways, as big as the model itself
    assert state.ledger.up[0]["control"] == state.ledger.up[0]["model"] > 0
    assert state.ledger.down[0]["control"] == state.ledger.down[0]["model"]


def test_option_two_divides_the_clients_move_by_its_steps_and_the_local_lr(tmp_path):
    """Round 1 from c = c_i = 0, eta_g = 1, all 3 clients: c_i+ = (x - y_i) / (K lr) with K =
    2 epochs x ceil(20 / 8) = 6 steps, so c = mean c_i+ = (x_0 - x_1) / (K lr)."""
    p = params("scaffold", rounds=1, batch_size=8, body_epochs=2, momentum=0.0, lr=0.05)
    fed, model = toy_federation(tmp_path, p)
    x0 = {k: v.clone() for k, v in fed.start(model).server["global"].items()}
    state = fed.run(fed.start(model))
    for k, c in state.server["control"].items():
        want = (x0[k] - state.server["global"][k]) / (6 * 0.05)
        assert torch.allclose(c, want, atol=1e-5), k


def test_scaffold_starts_as_fedavg_and_then_corrects_its_steps(tmp_path):
    p = params("scaffold", rounds=1, momentum=0.0, weight_decay=0.0)
    _, one = run(tmp_path, p, "s1.pt")
    _, avg = run(tmp_path, params("fedavg", rounds=1, momentum=0.0, weight_decay=0.0), "f1.pt")
    for k, v in avg.server["global"].items():  # c = c_i = 0 in round 1; equal data sizes
        assert torch.allclose(v, one.server["global"][k], atol=1e-6), k
    _, two = run(tmp_path, federation_changed(p, rounds=2), "s2.pt")
    _, avg2 = run(tmp_path, params("fedavg", rounds=2, momentum=0.0, weight_decay=0.0), "f2.pt")
    diff = max((avg2.server["global"][k] - v).abs().max() for k, v in two.server["global"].items())
    assert diff > 1e-4


# ------------------------------------------------------------------ Ditto
def test_ditto_with_lambda_zero_is_local_training_and_its_global_model_is_fedavgs(tmp_path):
    _, ditto = run(tmp_path, params("ditto", ditto_lambda=0.0), "d.pt")
    _, solo = run(tmp_path, params("solo"), "s.pt")
    _, avg = run(tmp_path, params("fedavg"), "f.pt")
    for c in range(3):
        assert_equal(solo.clients[c], ditto.clients[c], lambda k: "personal." + k[len("net.") :])
    assert_equal(avg.server["global"], ditto.server["global"])


def test_ditto_with_a_huge_lambda_follows_the_round_start_global_model(tmp_path):
    fed, model = toy_federation(tmp_path, params("ditto", rounds=2, ditto_lambda=1e9))
    starts = []
    state = fed.run(fed.start(model), on_round=lambda s: starts.append(dict(s.server["global"])))
    for c in range(3):
        v = net_of(state.clients[c], "personal")
        for k, w in starts[0].items():  # round 2 started from round 1's global model
            assert torch.allclose(v["personal." + k[len("net.") :]], w, atol=1e-6), (c, k)
    # a moderate lambda lands in between: not the global model, not local training
    _, mid = run(tmp_path, params("ditto", rounds=2, ditto_lambda=1.0), "mid.pt")
    v = mid.clients[0]["personal.output.weight"]
    assert not torch.allclose(v, starts[0]["net.output.weight"], atol=1e-4)


# ------------------------------------------------------------------ APFL
def test_apfl_with_alpha_zero_scores_the_global_model_which_trains_as_fedavgs(tmp_path):
    fed, apfl = run(tmp_path, params("apfl", apfl_alpha=0.0), "a.pt")
    _, avg = run(tmp_path, params("fedavg"), "f.pt")
    assert_equal(avg.server["global"], apfl.server["global"])
    for c in range(3):  # the scored party is w itself (weights: on the toy data every model
        scored = fed.strategy.party_state(apfl, c)  # scores the same accuracies)
        assert_equal(scored, net_of(avg.server["global"]), "net.".__add__)


def test_apfl_with_alpha_one_trains_its_personal_model_locally(tmp_path):
    fed, apfl = run(tmp_path, params("apfl", apfl_alpha=1.0), "a.pt")
    _, solo = run(tmp_path, params("solo"), "s.pt")
    for c in range(3):
        assert_equal(solo.clients[c], apfl.clients[c], lambda k: "personal." + k[len("net.") :])
    for c in range(3):  # the scored party is v, the locally trained network
        scored = fed.strategy.party_state(apfl, c)
        assert_equal(scored, solo.clients[c], "net.".__add__)


def test_apfl_alpha_follows_the_inner_product_of_v_minus_w_and_the_mixtures_gradient():
    p = params("apfl", apfl_alpha=0.3)
    model = R.seeded_model(p, SHAPE, 4, CPU)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for k in net_of(state, "personal"):
        state[k] = state[k] + 0.3 * torch.randn(state[k].shape, generator=g)
    buffers = {k: state.pop(k) for k in ("centres", "has_centre")}
    alpha = state["alpha"].requires_grad_(True)
    got = torch.autograd.grad(P.apfl_loss(False)(model, state, buffers, toy_batch()), alpha)[0]
    v = {k[len("personal.") :]: state[k] for k in net_of(state, "personal")}
    w = {k[len("net.") :]: state[k] for k in net_of(state)}
    mixed = {k: (0.3 * v[k] + 0.7 * w[k]).requires_grad_(True) for k in v}
    batch = toy_batch()
    ce = T._masked_ce(functional_call(model.net, mixed, batch.views[0]), batch)
    grads = torch.autograd.grad(ce, list(mixed.values()))
    want = sum(((v[k] - w[k]) * gk).sum() for k, gk in zip(mixed, grads))
    assert torch.allclose(got, want, rtol=1e-4)


def test_learned_alpha_moves_and_stays_in_the_unit_interval(tmp_path):
    _, state = run(tmp_path, params("apfl", apfl_adaptive=True, apfl_alpha=0.5, lr=0.5))
    alphas = [float(state.clients[c]["alpha"]) for c in range(3)]
    assert all(0.0 <= a <= 1.0 for a in alphas) and any(a != 0.5 for a in alphas)


# ------------------------------------------------------------------ Per-FedAvg
def meta_setup(order: str):
    p = params("perfedavg", perfedavg_order=order, perfedavg_alpha=0.1)
    model = R.seeded_model(p, SHAPE, 4, CPU)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = {k: state.pop(k) for k in ("centres", "has_centre")}
    return p, model, state, buffers


def meta_gradient(p, model, state, buffers, batch) -> dict:
    net = {k: v.clone().requires_grad_(True) for k, v in net_of(state).items()}
    loss = P.perfedavg_loss(p.perfedavg_alpha, p.perfedavg_order, 1e-3)
    grads = torch.autograd.grad(loss(model, {**state, **net}, buffers, batch), list(net.values()))
    return dict(zip(net, grads))


def ce_of(model, w: dict, data) -> torch.Tensor:
    x, y, valid = data
    return T._masked_ce(functional_call(model.net, w, (x,)), Batch((x,), y, valid))


def test_first_order_per_fedavg_steps_along_the_gradient_at_the_adapted_weights():
    p, model, state, buffers = meta_setup("first_order")
    batch = toy_batch(20)
    got = meta_gradient(p, model, state, buffers, batch)
    d, d1 = perfedavg.slices(batch, 2)
    w = {k[len("net.") :]: v.clone().requires_grad_(True) for k, v in net_of(state).items()}
    g_in = torch.autograd.grad(ce_of(model, w, d), list(w.values()))
    adapted = {k: (v - 0.1 * g).detach().requires_grad_(True) for (k, v), g in zip(w.items(), g_in)}
    want = torch.autograd.grad(ce_of(model, adapted, d1), list(adapted.values()))
    for (k, gw), gg in zip(got.items(), want):
        assert torch.allclose(gw, gg, atol=1e-6), k
    plain = torch.autograd.grad(ce_of(model, w, d1), list(w.values()))
    assert any(not torch.allclose(a, b, atol=1e-5) for a, b in zip(want, plain))


def test_hessian_free_per_fedavg_matches_exact_maml_within_a_percent():
    p, model, state, buffers = meta_setup("hessian_free")
    batch = toy_batch(30)
    got = meta_gradient(p, model, state, buffers, batch)
    d, d1, d2 = perfedavg.slices(batch, 3)
    w = {k[len("net.") :]: v.clone().double() for k, v in net_of(state).items()}
    model = model.double()

    def grad_at(weights, data):
        weights = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
        x, y, valid = data
        loss = ce_of(model, weights, (x.double(), y, valid))
        return dict(zip(weights, torch.autograd.grad(loss, list(weights.values()))))

    g_in = grad_at(w, d)
    g = grad_at({k: w[k] - 0.1 * g_in[k] for k in w}, d1)
    wr = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    x2, y2, v2 = d2
    g2 = torch.autograd.grad(
        ce_of(model, wr, (x2.double(), y2, v2)), list(wr.values()), create_graph=True
    )
    hvp = torch.autograd.grad(g2, list(wr.values()), grad_outputs=[g[k] for k in wr])
    exact = torch.cat([(g[k] - 0.1 * h).flatten() for k, h in zip(wr, hvp)])
    hf = torch.cat([got["net." + k].double().flatten() for k in wr])
    plain = torch.cat([g[k].flatten() for k in wr])
    assert (hf - exact).norm() / exact.norm() < 1e-2
    assert (plain - exact).norm() / exact.norm() > (hf - exact).norm() / exact.norm()


def test_per_fedavg_scores_each_party_after_one_alpha_step_on_its_own_data(tmp_path):
    fed, state = run(tmp_path, params("perfedavg", rounds=1))
    s, p, data = fed.strategy, fed.strategy.p, fed.data
    w = {k[len("net.") :]: v for k, v in state.server["global"].items()}
    _, _, probs = s.outputs(state, 0)
    for c in range(3):
        order = numpy_rng(p.seed, "adapt", 0, c).permutation(data.clients[c])[
            : p.federation.batch_size
        ]
        x = data.images[torch.as_tensor(order)].float() / 255
        y = data.labels[torch.as_tensor(order)]
        wr = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        g = torch.autograd.grad(
            T._masked_ce(functional_call(s.model.net, wr, (x,)), Batch((x,), y, None)),
            list(wr.values()),
        )
        mine = {k: w[k] - p.perfedavg_alpha * gk for k, gk in zip(w, g)}
        xt = s.tests.images[torch.as_tensor(s.tests.clients[c])].float() / 255
        with torch.no_grad():
            want = functional_call(s.model.net, mine, (xt,)).softmax(1)
            unadapted = functional_call(s.model.net, w, (xt,)).softmax(1)
        assert torch.allclose(torch.from_numpy(probs[c]), want, atol=1e-5), c
        assert not torch.allclose(want, unadapted, atol=1e-4), c


# ------------------------------------------------------------------ all four
VARIANTS = {
    "scaffold": {},
    "apfl": {"apfl_adaptive": True},
    "ditto": {},
    "perfedavg": {"perfedavg_order": "hessian_free"},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_killed_run_resumes_exactly(tmp_path, variant):
    p = params(variant, rounds=3, client_fraction=2 / 3, **VARIANTS[variant])
    full, start, fed = killed_and_resumed(tmp_path, p)
    assert start.round == 2
    resumed = fed.run(start)
    for part in full.server:
        assert_equal(full.server[part], resumed.server[part])
    assert full.clients.keys() == resumed.clients.keys()
    for c in full.clients:
        assert_equal(full.clients[c], resumed.clients[c])
    assert full.memo == resumed.memo and full.ledger == resumed.ledger


def test_the_four_baselines_run_through_the_stages_of_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag

    root = make_tiny_project(tmp_path, git=False)
    params_dir = root / "params"
    (params_dir / "partitions" / "tiny_shards.yaml").write_text(PARTITION)
    names = []
    for variant in VARIANTS:
        name = f"tiny_{variant}"
        extra = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in VARIANTS[variant].items())
        text = EXPERIMENT.format(variant=variant, seed=0).replace(
            "  seed: 0\n", "  seed: 0\n" + extra
        )
        (params_dir / "experiments" / f"{name}.yaml").write_text(text)
        names.append(name)
    with open(params_dir / "pipelines.yaml", "a") as f:
        f.write(f"  pfl: [{', '.join(names)}]\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    run_in_process(Dag("pfl"))
    exp = root / "artifacts" / "experiments"
    comm = json.loads((exp / "tiny_scaffold" / "train" / "communication.json").read_text())
    assert all(set(c["up_by_kind"]) == {"model", "control"} for c in comm["per_client"])
    report = json.loads((root / "results/reports/pfl/report.json").read_text())
    tab1 = report["tables"]["mpfedcon_tab1"]
    order = ["SCAFFOLD (canonical", "Per-FedAvg (HF)", "APFL (α=learned)", "Ditto (λ=1)"]
    assert [tab1.index("| " + label) for label in order] == sorted(
        tab1.index("| " + label) for label in order
    )
    for name in names:
        metrics = json.loads((root / f"results/experiments/{name}/metrics.json").read_text())
        assert metrics["personal_last2"] > 0, name


def test_fedrep_code_mode_shows_in_the_row_label_and_sets_fedreps_choices():
    from fedssl.methods.mpfedcon import MpFedcon

    label = MpFedcon().row_label
    assert params("scaffold").scaffold_eta_g == 1.0
    assert params("scaffold", fedrep_code=True).scaffold_eta_g == 0.1
    assert label(params("scaffold", fedrep_code=True)) == "SCAFFOLD (FedRep code, η_g=0.1)"
    assert label(params("apfl", apfl_alpha=0.75, fedrep_code=True)) == "APFL (α=0.75, FedRep code)"
    assert label(params("ditto", ditto_lambda=0.1)) == "Ditto (λ=0.1)"
    # FedRep's APFL trains v through alpha v + alpha w: at alpha = 1 that is v + w, not v
    p = params("apfl", apfl_alpha=1.0)
    model = R.seeded_model(p, SHAPE, 4, CPU)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = {k: state.pop(k) for k in ("centres", "has_centre")}
    v = {k: t.requires_grad_(True) for k, t in net_of(state, "personal").items()}
    grads = [
        torch.autograd.grad(
            P.apfl_loss(code)(model, {**state, **v}, buffers, toy_batch()), list(v.values())
        )
        for code in (False, True)
    ]
    assert any(not torch.allclose(a, b) for a, b in zip(*grads))
