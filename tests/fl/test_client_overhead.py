"""A client's fixed costs in a round stay paid once a step or once a round, not once a tensor
or once a call: counted in operators and calls, not timed (``benchmarks/client_overhead.py``
times them)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch.nn.utils import stateless
from torch.utils._python_dispatch import TorchDispatchMode

from fedssl.fl.cohort import OptimizerConfig, StackedOptimizer, forward, refill
from fedssl.strategies.aggregation import RunningMean


class Ops(TorchDispatchMode):
    """Counts the aten operators run inside it, by name."""

    def __init__(self):
        super().__init__()
        self.count: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def adam_step_ops(tensors: int) -> Counter:
    params = {f"w{i}": torch.randn(2, 3, 4) for i in range(tensors)}
    opt = StackedOptimizer(OptimizerConfig("adam"))
    state = opt.init(params)
    grads = {k: torch.randn_like(v) for k, v in params.items()}
    with Ops() as ops:
        opt.step(params, grads, state, 0.1)
    return ops.count


def test_an_adam_step_runs_as_many_operators_for_any_tensor_count():
    """Every operation of a step is one call over the model's tensors, and the bias corrections
    are computed once a step (two powers): per tensor, a tiny client's step paid ~11 operator
    calls x 20 tensors of Python dispatch on the default CNN (views aside: free)."""
    few, many = adam_step_ops(2), adam_step_ops(20)
    assert few["pow"] == many["pow"] == 2
    del few["view"], many["view"]
    assert few == many


def test_adam_step_unchanged_by_hoisting():
    """The step's bits: Adam's update written out per tensor, bias corrections and all."""
    torch.manual_seed(0)
    p = {"a": torch.randn(2, 5), "b": torch.randn(2, 3, 2)}
    g = {k: torch.randn_like(v) for k, v in p.items()}
    opt = StackedOptimizer(OptimizerConfig("adam"))
    ref = {k: v.clone() for k, v in p.items()}
    state = opt.init(p)
    for _ in range(3):
        opt.step(p, g, state, 0.01)
    for k, v in ref.items():
        m, s = torch.zeros_like(v), torch.zeros_like(v)
        for t in range(1, 4):
            m.mul_(0.9).add_(g[k], alpha=1 - 0.9)
            s.mul_(0.999).addcmul_(g[k], g[k], value=1 - 0.999)
            step = torch.full((2,), float(t))
            bc1, bc2 = 1 - 0.9**step, 1 - 0.999**step
            shape = (-1,) + (1,) * (v.dim() - 1)
            v.sub_(0.01 * (m / bc1.view(shape)) / ((s / bc2.view(shape)).sqrt() + 1e-8))
        assert torch.equal(p[k], v)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_forward_skips_untying_a_model_without_shared_tensors(monkeypatch):
    """``functional_call`` walks every module to untie shared weights on each call, a fixed
    cost of every local step; a model without shared tensors skips it, one with them does not
    (and still sees the given weight under both names)."""
    calls = Counter()
    untie = stateless._untie_named_tensors_map

    def counted(module, tensors):
        calls[type(module).__name__] += 1
        return untie(module, tensors)

    monkeypatch.setattr(stateless, "_untie_named_tensors_map", counted)
    plain = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    x = torch.randn(4, 3)
    for _ in range(3):
        forward(plain, dict(plain.state_dict()), x)
    assert calls["Sequential"] == 0
    tied = Tied()
    w = torch.eye(3) * 2
    out = forward(tied, {"a.weight": w}, torch.ones(1, 3))
    assert calls["Tied"] == 1
    assert torch.equal(out, torch.full((1, 3), 4.0))  # both layers saw w


def test_running_mean_casts_the_weights_once_a_round():
    """Adding a float32 upload copies no weight: the clients' weights are cast to the sums'
    dtypes once, when the mean opens, not per client."""
    mean = RunningMean(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    ups = [{"w": torch.full((2,), float(i)), "n": torch.tensor(i)} for i in range(3)]
    mean.add(ups[0])
    with Ops() as ops:
        mean.add(ups[1])
        mean.add(ups[2])
    assert ops.count["_to_copy"] == 0
    assert torch.allclose(mean.result()["w"], torch.full((2,), 4 / 3))


def add_ops(tensors: int) -> Counter:
    mean = RunningMean(torch.tensor([1.0, 2.0], dtype=torch.float64))
    up = {f"w{i}": torch.randn(3) for i in range(tensors)} | {"n": torch.tensor(1)}
    mean.add(up)
    with Ops() as ops:
        mean.add(up)
    return ops.count


def test_adding_an_upload_runs_as_many_operators_for_any_tensor_count():
    """The running mean's product and sum are one call each over the float tensors, not two
    operators per tensor (56 on the default CNN, ~0.05 ms a client)."""
    assert add_ops(2) == add_ops(20)


def test_running_mean_keeps_its_bits():
    """The sums as written out per tensor, product rounded then added, in client order: float32,
    float64 and half uploads, an integer counter at its maximum."""
    torch.manual_seed(0)
    w = torch.tensor([0.3, 1.7, 2.0], dtype=torch.float64)
    ups = [
        {
            "a": torch.randn(4, 3),
            "b": torch.randn(5, dtype=torch.float64),
            "h": torch.randn(2).half(),
            "n": torch.tensor(i * 3 % 5),
        }
        for i in range(3)
    ]
    mean = RunningMean(w)
    for u in ups:
        mean.add(u)
    got, share = mean.result(), w / w.sum()
    for k, dtype in (("a", torch.float32), ("b", torch.float64), ("h", torch.float32)):
        total = torch.zeros(ups[0][k].shape, dtype=dtype)
        for i, u in enumerate(ups):
            total.add_(share.to(dtype)[i] * u[k].to(dtype))
        assert torch.equal(got[k], total.to(ups[0][k].dtype)), k
    assert got["n"] == 3  # of 0, 3, 1


def refill_ops(tensors: int) -> Counter:
    row = {f"w{i}": torch.zeros(1, 2, 3) for i in range(tensors)}
    state = {k: torch.ones(2, 3) for k in row}
    with Ops() as ops:
        refill(row, state)
    assert all(torch.equal(v[0], state[k]) for k, v in row.items())
    del ops.count["select"]  # the rows' views
    return ops.count


def test_a_clients_row_is_refilled_in_one_call():
    """One-at-a-time training copies the next client's start into the cohort's one-row stack
    with one copy over the tensors (before: a fresh stack of ~4 operators per tensor)."""
    assert refill_ops(2) == refill_ops(20) == Counter({"_foreach_copy_": 1})


def test_refill_refuses_a_state_of_another_shape():
    row = {"w": torch.zeros(1, 3)}
    with pytest.raises(ValueError, match="shapes or dtypes"):
        refill(row, {"w": torch.ones(1)})  # would broadcast silently into the row
    with pytest.raises(ValueError, match="names"):
        refill(row, {"v": torch.ones(3)})


def test_optimizer_reset_is_a_fresh_init():
    opt = StackedOptimizer(OptimizerConfig("adam"))
    params = {"a": torch.randn(1, 3), "b": torch.randn(1, 2, 2)}
    state = opt.init(params)
    opt.step(params, {k: torch.randn_like(v) for k, v in params.items()}, state, 0.1)
    opt.reset(state)
    fresh = opt.init(params)
    assert torch.equal(state["step"], fresh["step"])
    for k in ("m", "v"):
        assert all(torch.equal(state[k][n], fresh[k][n]) for n in params)
