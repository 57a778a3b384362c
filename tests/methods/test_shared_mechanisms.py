"""The shared pieces' defining mechanisms that their value tests leave open (each kills a
one-line mutant of ``benchmarks/mutants.yaml``): FedProx's anchor gets no gradient, k-NN
votes are weighted by exp(sim / T), the linear probe standardises the test features with the
training statistics and scores them apart from the training ones, the ledger counts bytes,
not elements, and a client's FLOPs count its samples and rounds."""

from __future__ import annotations

import numpy as np
import torch

from fedssl import costs
from fedssl.eval.probes import knn_accuracy, linear_probe
from fedssl.fl.state import Ledger, nbytes
from fedssl.params import KnnParams, LinearProbeParams
from fedssl.strategies.fedprox import proximal_term
from tests.eval.test_losses_eval import blobs

CPU = torch.device("cpu")


def test_the_proximal_term_pulls_the_weights_and_leaves_the_anchor_alone():
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    g = torch.tensor([0.5, 0.5], requires_grad=True)  # an anchor that could train
    term = proximal_term({"net.w": w, "glob.w": g}, [("net.w", "glob.w")])
    dw, dg = torch.autograd.grad(term, [w, g], allow_unused=True)
    assert torch.equal(dw, 2 * (w - g).detach())
    assert dg is None or not dg.any()


def test_knn_neighbours_vote_with_weight_exp_of_similarity_over_temperature():
    # two weakly similar neighbours of class 0 against one near-identical neighbour of class 1
    train = np.array([[0.5, 0.866], [0.5, -0.866], [0.99, 0.141]], dtype=np.float32)
    labels = np.array([0, 0, 1])
    test = np.array([[1.0, 0.0]], dtype=np.float32)
    sharp = knn_accuracy(train, labels, test, np.array([1]), KnnParams(k=3, temperature=0.07), CPU)
    assert sharp["knn_top1"] == 100.0  # exp(0.99 / 0.07) outweighs 2 exp(0.5 / 0.07)
    flat = knn_accuracy(train, labels, test, np.array([0]), KnnParams(k=3, temperature=100), CPU)
    assert flat["knn_top1"] == 100.0  # at a high temperature the majority wins


def test_the_probe_standardises_test_features_with_the_training_statistics():
    xtr, ytr = blobs(600, 10, 0)
    xte, yte = blobs(300, 10, 1)
    p = LinearProbeParams(epochs=10, lr=0.01, batch_size=64)
    plain = linear_probe(xtr, ytr, xte, yte, p, CPU)["linear_top1"]
    shift, scale = np.linspace(50, 500, 10, dtype=np.float32), np.float32(30)
    moved = linear_probe(xtr * scale + shift, ytr, xte * scale + shift, yte, p, CPU)
    assert plain > 97 and abs(moved["linear_top1"] - plain) < 1


def test_the_probe_reports_the_test_accuracy_and_the_train_accuracy_apart():
    xtr, ytr = blobs(600, 10, 0)
    xte, yte = blobs(300, 10, 1)
    p = LinearProbeParams(epochs=10, lr=0.01, batch_size=64)
    out = linear_probe(xtr, ytr, xte, (yte + 1) % 3, p, CPU)  # every test label renamed
    assert out["linear_train_top1"] > 97 and out["linear_top1"] < 3


def test_the_ledger_counts_bytes_by_dtype():
    ledger = Ledger.empty([5])
    sent = {"w": torch.zeros(3, 2), "h": torch.zeros(4, dtype=torch.float16)}
    assert ledger.sent(0, sent) == 3 * 2 * 4 + 4 * 2 == nbytes(sent)
    ledger.sent(0, {"i": torch.zeros(2, dtype=torch.int64)}, "labels")
    assert ledger.up[0] == {"model": 32, "labels": 16}


def test_a_clients_cost_row_counts_its_flops_over_its_samples_and_rounds():
    traffic = costs.ClientTraffic(samples=[10, 20], rounds=[2, 3], sent=[100, 250])
    rows = costs.client_rows(traffic, flops_per_sample_round=5.0, peak_step_bytes=64)
    assert [r["flops"] for r in rows] == [5.0 * 10 * 2, 5.0 * 20 * 3]
    assert [(r["samples"], r["rounds"], r["bytes_exchanged"]) for r in rows] == [
        (10, 2, 100),
        (20, 3, 250),
    ]
    assert {r["peak_step_bytes"] for r in rows} == {64}
