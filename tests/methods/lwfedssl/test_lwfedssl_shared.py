"""The generic pieces the LW-FedSSL session added to shared modules: AdamW and an after-step
hook in the cohort trainer, traffic kinds in the engine's ledger, methods' own cost columns,
several metrics files per report row, paper tables over every row, Method.steps_for in the
DAG, and the shared fine-tuning."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedssl import costs
from fedssl.data.augment import to_float
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, StackedOptimizer
from fedssl.fl.state import FederationConfig
from fedssl.reporting import report
from fedssl.rounds.loop import Federation, LocalTraining
from fedssl.strategies.base import Strategy
from tests.fixtures import toy_images

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_adamw_decays_the_weights_apart_from_the_adam_step():
    """With a zero gradient AdamW only shrinks the weights by (1 - lr * wd); Adam with L2
    turns the decay into a gradient and takes a full normalised step."""
    grads = {"w": torch.zeros(1, 3)}
    out = {}
    for kind in ("adamw", "adam"):
        params = {"w": torch.ones(1, 3)}
        opt = StackedOptimizer(OptimizerConfig(kind, weight_decay=0.1))
        opt.step(params, grads, opt.init(params), lr=0.1)
        out[kind] = params["w"]
    torch.testing.assert_close(out["adamw"], torch.full((1, 3), 0.99))
    torch.testing.assert_close(out["adam"], torch.full((1, 3), 0.9), atol=1e-6, rtol=0)


class Counting(nn.Module):
    """A linear model and a frozen step counter the after-step hook advances."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(784, 4)
        self.steps = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.lin(x.flatten(1))


def counted_loss(model, params, buffers, batch):
    logits = functional_call(model, (params, buffers), (batch.views[0],))
    return nn.functional.cross_entropy(logits, batch.labels)


@pytest.mark.parametrize("parallel", [False, True])
def test_after_step_sees_every_step_of_every_client(parallel):
    """Clients with 4, 3 and 2 batches: the hook runs after each of their steps, on the rows
    that stepped (vectorised: the others wait), and what it writes into frozen tensors stays."""
    images, labels = toy_images(90, 0)
    data = LocalData(
        torch.from_numpy(images[:, None]),
        torch.from_numpy(labels),
        [np.arange(40), np.arange(40, 70), np.arange(70, 90)],
    )

    def advance(trained, frozen, buffers):
        frozen["steps"] += 1

    model = Counting()
    cohort = CohortTrainer(
        model,
        lambda b, g: (to_float(b),),
        counted_loss,
        OptimizerConfig("adamw"),
        batch_size=10,
        local_epochs=1,
        parallel=parallel,
        after_step=advance,
    )
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trained, _ = cohort.train(
        [start] * 3,
        data,
        [0, 1, 2],
        0.01,
        (0,),
        torch.Generator(),
        trainable={"lin.weight", "lin.bias"},
    )
    assert trained["steps"].tolist() == [4.0, 3.0, 2.0]


class Kinds(Strategy):
    def traffic(self, tensors):
        return {
            "weights": {k: v for k, v in tensors.items() if k.endswith("weight")},
            "biases": {k: v for k, v in tensors.items() if k.endswith("bias")},
        }


def test_the_ledger_counts_each_traffic_kind_apart(tmp_path):
    images, labels = toy_images(40, 0)
    data = LocalData(
        torch.from_numpy(images[:, None]),
        torch.from_numpy(labels),
        [np.arange(20), np.arange(20, 40)],
    )
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 4))
    cohort = CohortTrainer(
        model,
        lambda b, g: (to_float(b),),
        lambda m, p, b, batch: nn.functional.cross_entropy(
            functional_call(m, (p, b), (batch.views[0],)), batch.labels
        ),
        OptimizerConfig("sgd"),
        batch_size=10,
        local_epochs=1,
    )
    cfg = FederationConfig(2, 1.0, 0.1)
    fed = Federation(Kinds(cfg), LocalTraining(cohort), data, cfg, tmp_path / "k.pt", "fp")
    state = fed.run(fed.start(model))
    row = state.ledger.summary()["per_client"][0]
    assert row["up_by_kind"] == {"weights": 2 * 784 * 4 * 4, "biases": 2 * 4 * 4}
    assert row["down_by_kind"] == row["up_by_kind"]
    assert row["bytes_up"] == 2 * (784 * 4 + 4) * 4


def test_methods_add_their_own_cost_columns():
    rows = [
        {"client": 0, "bytes_exchanged": 10, "peak_step_bytes": 4, "paper_flops": 2.0},
        {"client": 1, "bytes_exchanged": 30, "peak_step_bytes": 8, "paper_flops": 4.0},
    ]
    assert costs.summarize_client_costs(rows) == {
        "mean_bytes_exchanged": 20.0,
        "mean_peak_step_bytes": 6.0,
    }
    assert costs.summarize_client_costs(rows, ("paper_flops",))["mean_paper_flops"] == 3.0


def test_a_report_row_merges_every_metrics_file_and_the_methods_cost_columns(tmp_path):
    from fedssl.methods import registry

    step = tmp_path / "grow_1"
    step.mkdir()
    (step / "meta.json").write_text(json.dumps({"wall_seconds": 2.0, "rounds": 3}))
    probe, tune = tmp_path / "metrics.json", tmp_path / "finetune.json"
    probe.write_text('{"linear_top1": 70.0}')
    tune.write_text('{"finetune_top1": 80.0}')
    (tmp_path / "costs.json").write_text(
        json.dumps({"mean_bytes_exchanged": 2e6, "mean_paper_flops": 123456.0, "mean_rounds": 99.0})
    )

    class Exp:
        title, partition = "t", "p"

        class method:  # noqa: N801 - stands in for params
            vit = type("V", (), {"width": 8, "depth": 2})

    row = report.experiment_row(
        "e", Exp, registry.get("fedmoco_lw"), [step], [probe, tune], tmp_path
    )
    assert row["linear_top1"] == 70.0 and row["finetune_top1"] == 80.0
    assert row["client_MB_exchanged"] == "2" and row["paper_flops"] == 123500.0
    assert row["rounds"] == 3  # a method's column never overwrites the row's own


def test_paper_tables_see_every_row_of_the_pipeline():
    rows = [
        {
            "method": "fedmoco",
            "row": "FedMoCo",
            "column": "c",
            "linear_top1": 60.0,
            "peak_step_MB": "10",
            "paper_flops": 100.0,
            "client_GFLOPs": "5",
            "encoder_bytes": 8.0,
            "block_bytes": 8.0,
        },
        {
            "method": "lw_fedssl",
            "row": "LW-FedSSL",
            "column": "c",
            "linear_top1": 59.0,
            "peak_step_MB": "3",
            "paper_flops": 48.0,
            "client_GFLOPs": "2",
            "encoder_bytes": 2.5,
            "block_bytes": 3.0,
        },
        {"method": "mfcl", "row": "MFCL(TN)", "column": "c", "linear_top1": 50.0},
    ]
    blank = {
        "paper_bits": "",
        "paper_memory_MB": "",
        "client_MB_exchanged": "",
        "client_GFLOPs": "",
    }
    rows = [{**blank, **r} for r in rows]
    tables = report.report_tables(rows)  # the tables of every method the rows name
    name = next(k for k in tables if "Tab. 3" in k)
    table = tables[name][1]
    lw = next(line for line in table.splitlines() if line.startswith("| LW-FedSSL"))
    assert [c.strip() for c in lw.split("|")[3:8]] == ["0.300", "0.480", "0.400", "0.312", "0.375"]
    assert "MFCL" not in table


def test_finetuning_trains_the_encoder_and_a_head(tmp_path):
    from fedssl.eval.finetune import finetune
    from fedssl.params import FinetuneParams

    train, test = toy_images(160, 0), toy_images(80, 1)
    train = (train[0][:, None], train[1])
    test = (test[0][:, None], test[1])
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(784, 16))
    encoder.requires_grad_(False)  # as the probes' frozen encoders come
    before = encoder[1].weight.clone()
    p = FinetuneParams(epochs=6, warmup_epochs=1, lr=3e-3, batch_size=32)
    out = finetune(encoder, train, test, p, torch.device("cpu"), tmp_path / "ft.pt", "fp")
    assert out["finetune_top1"] > 90 and len(out["log"]) == 6
    assert not torch.equal(before, encoder[1].weight)
    # resumable: a finished run's checkpoint gives the same result without training again
    again = finetune(
        nn.Sequential(nn.Flatten(), nn.Linear(784, 16)),
        train,
        test,
        p,
        torch.device("cpu"),
        tmp_path / "ft.pt",
        "fp",
    )
    assert again["finetune_top1"] == out["finetune_top1"] and again["log"] == out["log"]
