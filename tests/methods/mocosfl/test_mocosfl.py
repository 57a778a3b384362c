"""MocoSFL / MonAcoSFL: params, the split step against end-to-end backprop, vectorised clients
against one-by-one, data-size-weighted sync and the momentum alignment, exact resume, bytes
against the analytic formulas (Fig. 3 included), and the stages on a tiny project."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.fl.cohort import LocalData, stack
from fedssl.fl.state import FedState, Ledger
from fedssl.losses import moco_queue_loss
from fedssl.methods import registry
from fedssl.methods.mocosfl import MocoSflParams, SflBackbone
from fedssl.methods.mocosfl.comm import (
    ACT_KEY,
    ACT_QUERY,
    GRADIENTS,
    SYNC_MOMENTUM,
    SYNC_ONLINE,
    check_ledger,
    comm_curve,
    paper_bytes,
    protocol_bytes,
)
from fedssl.methods.mocosfl.nets import build_nets
from fedssl.methods.mocosfl.sync import SflSync
from fedssl.methods.mocosfl.train import recipe as split_recipe
from fedssl.methods.mocosfl.trainer import RoundTensors, ServerTensors, SplitRound, StepBatch
from fedssl.models.momentum import misalignment
from fedssl.rounds.recipe import build_federation
from fedssl.strategies.aggregation import fedavg

CPU = torch.device("cpu")
torch.set_num_threads(1)  # tiny convolutions: threads only add overhead (and CI shares cores)
SHAPE = (1, 28, 28)


def params(variant="monacosfl", cut=3, federation=None, **extra) -> MocoSflParams:
    raw = dict(
        name="mocosfl",
        variant=variant,
        cut=cut,
        seed=0,
        backbone=dict(arch="resnet18", width=4, proj_hidden=16, proj_dim=8),
        moco=dict(queue_size=32, symmetric=True),
        federation={**dict(rounds=2, batch_size=6, sync_every=2, lr=0.1), **(federation or {})},
        augment=dict(crop_scale=[0.5, 1.0], saturation=0.0, hue=0.0, grayscale_p=0.0),
    )
    raw.update(extra)
    return MocoSflParams.model_validate(raw)


def toy_data(n: int = 60) -> LocalData:
    """Three clients of unequal sizes, each holding its own two of four classes (non-IID)."""
    from tests.fixtures import toy_images

    images, labels = toy_images(n, 0)
    order = np.argsort(labels, kind="stable")
    clients = [order[:12], order[12:30], order[30:]]
    return LocalData(torch.from_numpy(images[:, None]), torch.from_numpy(labels), clients)


def federation(p, tmp_path, data=None, parallel=True, name="ck.pt"):
    """MocoSFL's federation of ``p`` from its recipe (the one builder), clients vectorised or
    not (``parallel``, whatever ``p`` says)."""
    p = p.model_copy(update={"parallel_clients": "on" if parallel else "off"})
    recipe = split_recipe(p)
    nets = recipe.model(SHAPE, CPU)
    return build_federation(recipe, nets, data or toy_data(), tmp_path / name, "fp")


# ------------------------------------------------------------------ params
def test_params_are_checked_and_labelled():
    p = params()
    assert p.backbone.width == 4 and p.moco.temperature == 0.1 and p.moco.momentum == 0.99
    method = registry.get("mocosfl")
    assert method.row_label(params("mocosfl", cut=7)) == "MocoSFL L13"
    assert method.row_label(params("monacosfl", cut=1)) == "MonAcoSFL L1"
    mobile = params(backbone=dict(arch="mobilenetv2", width_mult=0.25))
    assert method.row_label(mobile) == "MonAcoSFL mobilenetv2 cut 3"
    for bad, field in (
        (dict(cut=10), "cut"),
        (dict(variant="moco"), "variant"),
        (dict(backbone=dict(arch="resnet18", width_mult=0.5)), "width_mult"),
        (dict(backbone=dict(arch="mobilenetv2", width=8)), "width applies"),
        (dict(federation=dict(monitor_every=1)), "method.monitor"),
    ):
        with pytest.raises(ValueError, match=field):
            params(**{"variant": "monacosfl", "cut": 3, **bad})
    with pytest.raises(ValueError, match="sync_every"):
        MocoSflParams.model_validate(
            {**params().model_dump(), "federation": {"rounds": 1, "batch_size": 4}}
        )


@pytest.mark.parametrize("variant,setting", [("mocosfl", "auto"), ("monacosfl", "on")])
def test_the_declared_recipe_builds_the_split_federation(tmp_path, variant, setting):
    """MocoSFL declares its recipe as the other federated methods do, and the one builder
    makes its federation: the seeded split nets, the sync strategy (MonAcoSFL aligns the
    momentum models), the split trainer vectorised as ``parallel_clients`` says (auto: not
    on the CPU), stepping the params' batches at the params' settings."""
    from fedssl.methods import federated
    from fedssl.methods.mocosfl.trainer import SplitMocoTrainer

    p = params(variant, parallel_clients=setting)
    nets = federated.build_model(p, SHAPE, CPU)
    assert nets.client_state().keys() == build_nets(p, SHAPE, CPU).client_state().keys()
    assert all(
        torch.equal(v, build_nets(p, SHAPE, CPU).client_state()[k])
        for k, v in nets.client_state().items()
    )
    fed = federated.make_federation(p, nets, toy_data(), tmp_path / "ck.pt", "fp")
    assert isinstance(fed.strategy, SflSync) and fed.strategy.nets is nets
    assert fed.strategy.align == (variant == "monacosfl")
    assert isinstance(fed.trainer, SplitMocoTrainer) and fed.trainer.nets is nets
    assert fed.trainer.parallel == (setting == "on")
    assert fed.trainer.cfg.schedule.batch_size == 6 and fed.trainer.cfg.temperature == 0.1


class _PretrainStage:
    """What the pretrain stage's context gives the runtime of a tiny run on the toy data."""

    def __init__(self, p, folder):
        from types import SimpleNamespace

        from tests.fixtures import toy_images

        self.exp = SimpleNamespace(
            method=p, title="tiny", features=SimpleNamespace(layer="backbone")
        )
        self.device, self.image_shape, self.fingerprint = CPU, SHAPE, "fp"
        self.out, self.results_dir = folder / "out", folder / "results"
        self.out.mkdir(), self.results_dir.mkdir()
        self.resume_path = folder / "ck.pt"
        self.info, self.run_info = {}, {}
        images, self.labels = toy_images(60, 0)
        self.images = images[:, None]
        self._clients = [np.asarray(c) for c in toy_data().clients]

    def split(self, which):
        return self.images, self.labels

    def clients(self):
        return self._clients

    def input(self, step):
        return self.out


def test_the_one_runtime_runs_its_training_and_keeps_the_split_runs_outputs(tmp_path):
    """MocoSFL's pretrain step is the runtime every federated method's is (no pretrain of its
    own): through the recipe's slots it logs the split model's k-NN monitor, saves the final
    model as its two parts, writes the step log, its figure, the communication check and the
    metrics, records its facts, and leaves the split nets holding the final model."""
    from fedssl.methods import federated
    from fedssl.methods.base import FederatedMethod, Hook
    from fedssl.methods.mocosfl import run

    method = registry.get("mocosfl")
    assert isinstance(method, FederatedMethod) and not hasattr(run, "pretrain")
    assert method.steps[0].runner == Hook(federated.__name__, "pretrain")
    assert method.hook_modules(params(), "pretrain") == [
        federated.__name__,
        "fedssl.methods.mocosfl.train",
    ]
    assert method.flower_steps == {}
    monitor = dict(queries="test", bank_size=24, query_size=12, k=5)
    p = params("monacosfl", federation=dict(client_fraction=0.67), monitor=monitor)
    ctx = _PretrainStage(p, tmp_path)
    method.run_step("pretrain", ctx)

    rounds = list(csv.DictReader(open(ctx.results_dir / "rounds.tsv"), delimiter="\t"))
    assert len(rounds) == 2 and all(0 <= float(r["knn_monitor"]) <= 100 for r in rounds)
    model = torch.load(ctx.out / "model.pt", weights_only=True)
    assert model.keys() == {"client", "server", "image_shape", "cut"} and model["cut"] == 3
    nets = build_nets(p, SHAPE, CPU)
    assert model["client"].keys() == nets.client_state().keys()
    assert model["server"].keys() == nets.top_state().keys()
    steps = list(csv.DictReader(open(ctx.results_dir / "steps.tsv"), delimiter="\t"))
    metrics = json.loads((ctx.out / "metrics.json").read_text())
    assert len(steps) == metrics["steps"] > 0 and metrics["variant"] == "monacosfl"
    assert (ctx.results_dir / "misalignment.png").stat().st_size > 0
    check = json.loads((ctx.out / "communication_check.json").read_text())
    assert check["exact"] and check["align"] and metrics["comm_matches_formula"]
    assert ctx.info["client_parameters"] == nets.client_numel() < ctx.info["parameters"]
    assert ctx.info["mis_after_sync_mean"] == metrics["mis_after_sync_mean"]
    assert metrics["knn_monitor_last"] == float(rounds[-1]["knn_monitor"])
    # the probes' encoder is the saved final model's
    encoder = method.encoder(ctx)
    assert all(torch.equal(v, model["client"][k]) for k, v in encoder.client.state_dict().items())


def test_a_split_strategy_loads_its_final_parts_into_the_nets(tmp_path):
    """The runner loads the strategy's final model into the model: the split model's comes as
    the synced client part and the server's top, each loaded into its template."""
    p = params("mocosfl", federation=dict(rounds=1))
    fed = federation(p, tmp_path)
    state = fed.run(fed.start(None))
    final = fed.strategy.final_model(state)
    assert not torch.equal(
        fed.strategy.nets.client_state()["0.0.weight"], final["client"]["0.0.weight"]
    )
    fed.strategy.load_final(fed.strategy.nets, state)
    for part, module in (("client", fed.strategy.nets.client), ("server", fed.strategy.nets.top)):
        assert all(torch.equal(v, final[part][k]) for k, v in module.state_dict().items())


# ------------------------------------------------------------------ the protocol
def test_a_split_step_gives_the_gradients_of_end_to_end_backprop(tmp_path):
    """Activations up, gradients down: the clients' and the server's updates equal those of
    backprop through the joint network (fixed views, SGD without momentum or decay). Clients
    run one by one here so both sides use the very same kernels: at random initialisation
    the GN + WS network's gradients move by ~2% under 1e-6 changes of its input (float64
    too), so vmap's float-level differences are checked by the next test instead."""
    p = params(
        "mocosfl",
        cut=3,
        federation=dict(momentum=0.0, weight_decay=0.0),
        moco=dict(queue_size=32, symmetric=False, momentum=0.9),
    )
    data = toy_data()
    fed = federation(p, tmp_path, data, parallel=False)
    fed.trainer.make_views = lambda x, g: (to_float(x), 1 - to_float(x))
    state = fed.start(None)
    nets, lr = fed.strategy.nets, 0.1
    start = state.server["client_init"]
    online, momentum = stack([start, start]), stack([start, start])
    opt = {"step": torch.zeros(2), "m": {k: torch.zeros_like(v) for k, v in online.items()}}
    server = {k: v.unsqueeze(0).clone() for k, v in state.server["server"].items()}
    server_m = {k: v.clone() for k, v in state.server["server_momentum"].items()}
    server_opt = {"step": torch.zeros(1), "m": {k: torch.zeros_like(v) for k, v in server.items()}}
    from fedssl.models.momentum import FeatureQueue

    queue = FeatureQueue(32, 8, 1)
    keys_before = queue.keys.clone()
    idx = np.stack([data.clients[0][:6], data.clients[1][:6]])
    valid = np.ones_like(idx, dtype=bool)
    valid[1, 4:] = False  # a short batch: padded rows must not count
    tensors = RoundTensors(
        [0, 1], online, momentum, opt, ServerTensors(server, server_m, server_opt, queue)
    )
    fed.trainer.step(
        SplitRound(state, data, tensors, None), StepBatch([0, 1], [0, 1], idx, valid, lr)
    )

    # the same step by hand, through one graph (the EMA of equal models changes nothing)
    x = to_float(data.images[torch.from_numpy(idx).flatten()]).view(2, 6, *SHAPE)
    phi = [{k: v.clone().requires_grad_(True) for k, v in start.items()} for _ in range(2)]
    top = {k: v.clone().requires_grad_(True) for k, v in state.server["server"].items()}
    q = torch.cat(
        [
            functional_call(nets.top, top, (functional_call(nets.client, phi[i], (x[i],)),))
            for i in range(2)
        ]
    )
    with torch.no_grad():
        k = torch.cat(
            [
                functional_call(
                    nets.top,
                    state.server["server"],
                    (functional_call(nets.client, start, (1 - x[i],)),),
                )
                for i in range(2)
            ]
        )
    loss = moco_queue_loss(q, k, keys_before, p.moco.temperature, torch.from_numpy(valid).flatten())
    assert loss > 0.01
    grads = torch.autograd.grad(loss, [*top.values(), *phi[0].values(), *phi[1].values()])
    n_top, n_client = len(top), len(start)
    for j, name in enumerate(top):
        assert torch.allclose(server[name][0], top[name] - lr * grads[j], atol=1e-7), name
    for i in range(2):
        for j, name in enumerate(start):
            g = grads[n_top + i * n_client + j]
            assert torch.allclose(online[name][i], phi[i][name] - lr * g, atol=1e-7), name
    assert not torch.equal(online["0.0.weight"][0], online["0.0.weight"][1])
    # bytes: only real rows travel; activations of both kinds up, gradients down
    act = 4 * 28 * 28 * 4  # cut 3 = stem + 2 blocks at width 4, 28x28, float32
    row0, row1 = state.ledger.summary()["per_client"][:2]
    assert row0["up_by_kind"] == {ACT_QUERY: 6 * act, ACT_KEY: 6 * act}
    assert row1["up_by_kind"] == {ACT_QUERY: 4 * act, ACT_KEY: 4 * act}
    assert row1["down_by_kind"] == {GRADIENTS: 4 * act}
    assert queue.ptr == 10  # the 10 real keys entered the queue


def test_vectorised_clients_match_one_by_one(tmp_path):
    """The clients of a step as one vmapped call or one after another give the same numbers:
    activations, and a round of two steps where the second leaves a client out (it has no
    batch left) and ends with a sync. Longer runs drift apart chaotically from float noise
    (~10x per step at these tiny widths), so the check stays at two steps."""
    p = params("monacosfl", federation=dict(rounds=1, lr=0.01))
    fed = federation(p, tmp_path)
    state = fed.start(None)
    g = torch.Generator().manual_seed(0)
    starts = stack(
        [
            {
                k: v + 0.01 * torch.randn(v.shape, generator=g)
                for k, v in state.server["client_init"].items()
            }
            for _ in range(3)
        ]
    )
    x = torch.rand(3, 5, *SHAPE, generator=g)
    fed.trainer.parallel = True
    batched = fed.trainer.client_forward(starts, x)
    fed.trainer.parallel = False
    assert torch.allclose(batched, fed.trainer.client_forward(starts, x), atol=1e-5)
    full = toy_data()
    data = LocalData(
        full.images, full.labels, [full.clients[0][:6], full.clients[1][:12], full.clients[2][:12]]
    )
    results = {}
    for parallel in (True, False):
        fed = federation(p, tmp_path, data, parallel=parallel, name=f"{parallel}.pt")
        results[parallel] = fed.run(fed.start(None))
    a, b = results[True], results[False]
    assert [s["step"] for s in a.memo["steps"] if s["sync"]] == [2]
    for c in range(3):
        for k, v in a.clients[c].items():
            assert torch.allclose(v.float(), b.clients[c][k].float(), atol=1e-6), (c, k)
    for k, v in a.server["server"].items():
        assert torch.allclose(v, b.server["server"][k], atol=1e-6), k
    assert torch.allclose(a.server["queue"]["keys"], b.server["queue"]["keys"], atol=1e-6)
    assert a.ledger == b.ledger
    assert [s["loss"] for s in a.memo["steps"]] == pytest.approx(
        [s["loss"] for s in b.memo["steps"]], abs=1e-6
    )


def stacked_state(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    online = {"w": torch.randn(n, 4, 3, generator=g), "b": torch.randn(n, 3, generator=g)}
    momentum = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in online.items()}
    return online, momentum


@pytest.mark.parametrize("align", [False, True])
def test_sync_is_a_data_size_weighted_fedavg_and_monacosfl_also_averages_momentum(align):
    online, momentum = stacked_state()
    before_m = {k: v.clone() for k, v in momentum.items()}
    weights = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    state = FedState(
        0, {"sync": {"count": torch.zeros((), dtype=torch.int64)}}, {}, Ledger.empty([10, 20, 50])
    )
    strategy = SflSync.__new__(SflSync)
    strategy.align = align
    pre = float(misalignment([online], [momentum]))
    uniform = {k: v.mean(0) for k, v in online.items()}
    expected = {
        k: (v * (weights / weights.sum()).float().view(-1, *[1] * (v.dim() - 1))).sum(0)
        for k, v in online.items()
    }
    strategy.sync(state, [0, 1, 2], online, momentum, weights)
    for k, v in online.items():
        for i in range(3):
            assert torch.allclose(v[i], expected[k], atol=1e-6)  # not the uniform mean
    assert not torch.allclose(expected["w"], uniform["w"], atol=1e-3)  # the weights matter here
    if align:
        mean_m = fedavg(before_m, weights)
        assert all(
            torch.allclose(momentum[k][i], mean_m[k], atol=1e-6) for k in momentum for i in range(3)
        )
        # Jensen: |mean(phi - xi)| <= mean|phi - xi|, so the alignment never raises Eq. 2
        assert float(misalignment([online], [momentum])) <= pre
    else:
        assert all(torch.equal(momentum[k], before_m[k]) for k in momentum)
    size = sum(v[0].numel() * 4 for v in online.values())
    row = state.ledger.summary()["per_client"][2]
    kinds = {SYNC_ONLINE: size, **({SYNC_MOMENTUM: size} if align else {})}
    assert row["up_by_kind"] == kinds and row["down_by_kind"] == kinds
    assert int(state.server["sync"]["count"]) == 1


def test_after_the_same_sync_monacosfl_is_never_more_misaligned_than_mocosfl():
    results = {}
    for align in (False, True):
        online, momentum = stacked_state(seed=3)
        state = FedState(
            0, {"sync": {"count": torch.zeros((), dtype=torch.int64)}}, {}, Ledger.empty([1, 1, 1])
        )
        strategy = SflSync.__new__(SflSync)
        strategy.align = align
        strategy.sync(state, [0, 1, 2], online, momentum, torch.ones(3, dtype=torch.float64))
        results[align] = float(misalignment([online], [momentum]))
    assert results[True] < results[False]


def test_a_killed_run_resumes_exactly(tmp_path):
    """Client states, momentum copies, SGD buffers, the server, its queue, the ledger and the
    per-step log: all identical after a kill between rounds and a resume."""
    p = params("mocosfl", federation=dict(rounds=3, client_fraction=0.67))
    full = federation(p, tmp_path, name="full.pt")
    uninterrupted = full.run(full.start(None))
    killed = federation(p, tmp_path, name="killed.pt")

    def stop(state):
        if state.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        killed.run(killed.start(None), on_round=stop)
    again = federation(p, tmp_path, name="killed.pt")
    start = again.start(None)
    assert start.round == 2
    resumed = again.run(start)
    assert set(uninterrupted.clients) == set(resumed.clients)
    for c, kept in uninterrupted.clients.items():
        for k, v in kept.items():
            assert torch.equal(v, resumed.clients[c][k]), (c, k)
    for part in ("server", "server_momentum", "server_opt", "queue", "sync"):
        for k, v in uninterrupted.server[part].items():
            assert torch.equal(v, resumed.server[part][k]), (part, k)
    assert uninterrupted.ledger == resumed.ledger
    assert uninterrupted.memo == resumed.memo
    assert [r["loss"] for r in uninterrupted.log] == [r["loss"] for r in resumed.log]


@pytest.mark.parametrize("variant,symmetric", [("mocosfl", True), ("monacosfl", False)])
def test_bytes_sent_match_the_protocol_formula_with_sampling_and_catch_ups(
    tmp_path, variant, symmetric
):
    p = params(
        variant,
        federation=dict(rounds=4, client_fraction=0.34),
        moco=dict(queue_size=32, symmetric=symmetric),
    )
    fed = federation(p, tmp_path)
    state = fed.run(fed.start(None))
    nets = fed.strategy.nets
    act = int(np.prod(nets.activation_shape(SHAPE)))
    check = check_ledger(
        state.ledger.summary(),
        state.memo["images"],
        state.memo["syncs"],
        state.memo["catch_ups"],
        act,
        nets.client_numel(),
        variant == "monacosfl",
    )
    assert check["exact"], check["per_client"]
    assert sum(state.memo["catch_ups"]) > 0  # one client sat out rounds with syncs
    assert sum(state.memo["images"]) == sum(
        len(fed.data.clients[c]) for r in range(4) for c in fed.strategy.sample(state, r)
    )


def test_protocol_and_paper_formulas():
    assert paper_bytes(250, 100, 10, 1000) == (2 * 250 * 100 + 10 * 1000) * 4
    aligned = protocol_bytes(10, 5, 2, 1, 7, align=True)
    assert aligned["up"] == {ACT_QUERY: 200, ACT_KEY: 200, SYNC_ONLINE: 56, SYNC_MOMENTUM: 56}
    assert aligned["down"] == {GRADIENTS: 200, SYNC_ONLINE: 84, SYNC_MOMENTUM: 84}
    one = protocol_bytes(10, 5, 0, 0, 7, align=False)
    assert one == {"up": {ACT_QUERY: 200, ACT_KEY: 200}, "down": {GRADIENTS: 200}}


def test_fig3_communication_curve_has_its_minimum_at_l11_for_resnet18():
    """Spec §5 [ours]: 224 px, 250 images, 10 syncs: L11 ≈ 157 MiB (96 + 61), L9 ≈ 218,
    L13 ≈ 202, L1 ≈ 383."""
    rows = comm_curve(SflBackbone(arch="resnet18", stem="imagenet"), (3, 224, 224), 250, 10)
    total = {r["layer"]: r["total_MiB"] for r in rows}
    assert min(total, key=total.get) == 11
    assert total[11] == pytest.approx(156.8, abs=0.1)
    assert rows[5]["optimisation_MiB"] == pytest.approx(95.7, abs=0.1)
    assert rows[5]["sync_MiB"] == pytest.approx(61.1, abs=0.1)
    for layer, mib in ((9, 217.5), (13, 201.9), (1, 383.2)):
        assert total[layer] == pytest.approx(mib, abs=0.1)
    mobile = comm_curve(SflBackbone(arch="mobilenetv2", stem="imagenet"), (3, 224, 224), 250, 10)
    assert len(mobile) == 9 and all(r["layer"] is None for r in mobile)


def test_the_misalignment_log_marks_the_syncs(tmp_path):
    p = params("mocosfl", federation=dict(rounds=3, sync_every=3))
    fed = federation(p, tmp_path)
    state = fed.run(fed.start(None))
    steps = state.memo["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    per_round = len(steps) // 3
    syncs = [s["step"] for s in steps if s["sync"]]
    # every 3rd step of a round, and its last step
    assert syncs[:2] == [3, per_round] or syncs[:2] == [3, 6]
    assert all(s["misalignment_pre_sync"] != "" for s in steps if s["sync"])
    assert all(s["misalignment"] > 0 for s in steps)
    assert state.log[-1]["misalignment"] == steps[-1]["misalignment"]


# ------------------------------------------------------------------ stages on a tiny project
TINY = """\
title: {title}
partition: tiny_shards_m3
method:
  name: mocosfl
  variant: {variant}
  seed: 0
  backbone: {{arch: resnet18, width: 4, channels_per_group: 2, proj_hidden: 16, proj_dim: 8}}
  cut: {cut}
  moco: {{queue_size: 32, temperature: 0.1, momentum: 0.99, symmetric: false}}
  federation: {{rounds: 2, batch_size: 16, sync_every: 2, lr: 0.06}}
  augment: {{crop_scale: [0.5, 1.0], saturation: 0.0, hue: 0.0, grayscale_p: 0.0}}
  monitor: {{every: 1, queries: holdout, query_size: 30, bank_size: 40, k: 5}}
  inversion: {{aux_fraction: 0.2, epochs: 2, batch_size: 16, width: 8, eval_images: 20,
              show: 4}}
features: {{layer: backbone, train_size: null, batch_size: 256}}
linear_probe: {{epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}}
knn: {{k: 5, temperature: 0.1}}
"""


def test_the_chain_runs_on_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag
    from tests.fixtures import make_tiny_project
    from tests.methods.mfcl.test_mfcl import run_in_process

    root = make_tiny_project(tmp_path, git=False)
    params_dir = root / "params"
    (params_dir / "partitions" / "tiny_shards_m3.yaml").write_text(
        "dataset: tiny\nnum_clients: 3\nscheme: {kind: shards, classes_per_client: 2}\n"
        "server_holdout: 40\nseed: 0\n"
    )
    names = {}
    for variant in ("mocosfl", "monacosfl"):
        for cut in (1, 4):
            name = f"tiny_{variant}_c{cut}"
            names[name] = (variant, cut)
            (params_dir / "experiments" / f"{name}.yaml").write_text(
                TINY.format(title=name, variant=variant, cut=cut)
            )
    # same content as tiny_mocosfl_c1 under a name that sorts first: its stages own the
    # content (they are named after it and write under its results), the report must follow
    (params_dir / "experiments" / "tiny_a_copy.yaml").write_text(
        TINY.format(title="copy", variant="mocosfl", cut=1)
    )
    names["tiny_a_copy"] = ("mocosfl", 1)
    with open(params_dir / "pipelines.yaml", "a") as f:
        f.write(f"  sfl: [{', '.join(names)}]\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag("sfl")
    assert [s.kind for s in dag.stages.values() if s.name.endswith("tiny_mocosfl_c4")] == [
        "pretrain",
        "inversion",
        "features",
        "evaluate",
        "costs",
    ]
    assert {s.name for s in dag.stages.values() if s.kind == "pretrain"} == {
        f"pretrain__{n}" for n in names if n != "tiny_mocosfl_c1"
    }  # shared with the copy
    run_in_process(dag)
    report = root / "results" / "reports" / "sfl"
    rows = {r["experiment"]: r for r in csv.DictReader(open(report / "report.csv"))}
    assert set(rows) == set(names)
    for name, (variant, cut) in names.items():
        r = rows[name]
        assert r["variant"] == variant and int(r["cut"]) == cut and r["clients"] == "3"
        assert float(r["linear_top1"]) > 0 and float(r["inversion_mse"]) > 0
        assert r["comm_matches_formula"] == "True" and float(r["client_MB_total"]) > 0
        assert float(r["mis_after_sync_mean"]) > 0 and float(r["knn_monitor_last"]) >= 0
        assert float(r["client_GFLOPs"]) > 0 and float(r["peak_step_MB"]) > 0  # the costs stage
        assert float(r["smashed_bytes_per_step"]) > 0
        results = (
            root
            / "results"
            / "experiments"
            / ("tiny_a_copy" if name == "tiny_mocosfl_c1" else name)
        )
        for f in ("rounds.tsv", "steps.tsv", "misalignment.png", "inversion.png"):
            assert (results / f).exists(), f
        log = list(csv.DictReader(open(results / "rounds.tsv"), delimiter="\t"))
        assert len(log) == 2 and all(row["knn_monitor"] != "" for row in log)
    # deeper cut: smaller activations, more client parameters
    assert int(rows["tiny_mocosfl_c4"]["act_numel"]) < int(rows["tiny_mocosfl_c1"]["act_numel"])
    assert int(rows["tiny_mocosfl_c4"]["client_params"]) > int(
        rows["tiny_mocosfl_c1"]["client_params"]
    )
    text = (report / "report.md").read_text()
    for heading in (
        "accuracy and communication per cut",
        "misalignment, Eq. 2's and the authors'",
        "model inversion per cut",
        "Fig. 3 (analytic)",
    ):
        assert heading in text
    assert "![" in text and (report / "misalignment.png").exists()
    mis = text.split("misalignment, Eq. 2's and the authors'")[1].split("##")[0]
    lines = [line for line in mis.splitlines() if line.startswith("| 3 |")]
    assert len(lines) == 2 and all(" / " in line for line in lines)  # per-sync ratios found
    assert all(line.rstrip(" |").split("|")[-1].count(" / ") == 2 for line in lines)  # per step
    assert (report / "inversion.png").exists()
    for heading in ("## Misalignment of", "## Model inversion"):  # which run stands for a cell
        line = next(x for x in text.splitlines() if x.startswith(heading))
        drawn = line.split("; runs drawn: ")[1].split(", ")
        assert len(drawn) == len(set(drawn)) >= 2 and set(drawn) <= set(names), line
    check = json.loads(
        (
            root
            / "artifacts"
            / "experiments"
            / "tiny_monacosfl_c4"
            / "pretrain"
            / "communication_check.json"
        ).read_text()
    )
    assert check["exact"] and check["align"]
