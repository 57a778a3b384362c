"""The precision policy: what each setting resolves to, that ``fp32`` is the plain fp32 code
path bit for bit, that bf16 steps stay close to fp32 ones, and that every committed result
resolves to the precision it was made in."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.func import functional_call

from fedssl import precision
from fedssl.losses import nt_xent
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.params import ModelParams, ParamsError
from fedssl.presets import Presets
from tests.fl.test_engine import simclr_loss

SHAPE = (1, 16, 16)
MODEL = ModelParams(arch="small_cnn", norm="bn", width=8, proj_hidden=32, proj_dim=16)


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Pretend the CPU does (True) or does not (False) multiply bf16 in hardware."""

    def pretend(native: bool):
        monkeypatch.setattr(precision, "native_bf16", lambda device_type: native)

    return pretend


@pytest.mark.parametrize(
    "setting, native, expected",
    [
        ("auto", True, torch.bfloat16),
        ("auto", False, None),
        ("fp32", True, None),
        ("fp32_channels_last", True, None),
        ("fp32_channels_last", False, None),
        ("bf16", False, torch.bfloat16),
    ],
)
def test_settings_resolve(cpu_bf16, setting, native, expected):
    cpu_bf16(native)
    before = precision.active()
    with precision.policy(setting):
        assert precision.autocast_dtype("cpu") is expected
        assert precision.channels_last() is (setting != "fp32")  # fp32 under auto too
        assert precision.resolved("cpu") == ("fp32" if expected is None else "bf16")
        # the compiled-step table's key: fp32 in each layout, bf16
        layout = "_channels_last" if setting != "fp32" else ""
        assert precision.mode("cpu") == ("bf16" if expected else f"fp32{layout}")
    assert precision.active() == before  # the block's setting ends with it


def test_cuda_is_native_and_cpu_detection_reads_torch(monkeypatch):
    assert precision.native_bf16("cuda") and not precision.native_bf16("meta")
    for cap in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):  # the suite may run capped
        monkeypatch.delenv(cap, raising=False)
    precision.native_bf16.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert precision.native_bf16("cpu")
    precision.native_bf16.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not precision.native_bf16("cpu")
    precision.native_bf16.cache_clear()


@pytest.mark.parametrize(
    "caps, native",
    [
        ({}, True),
        ({"ATEN_CPU_CAPABILITY": "avx2"}, False),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, False),
        ({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, True),
    ],
)
def test_an_isa_cap_below_bf16_makes_a_bf16_cpu_compute_as_one_without(monkeypatch, caps, native):
    """ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA below AVX-512 BF16 keep torch's kernels off the
    bf16 instructions: `auto` must then stay in fp32, as on an AVX2 CPU."""
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in caps.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    precision.native_bf16.cache_clear()
    try:
        assert precision.native_bf16("cpu") is native
        assert precision.native_bf16("cuda")
    finally:
        precision.native_bf16.cache_clear()


def test_bad_setting_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fp16"), precision.policy("fp16"):
        pass
    exp = Path("params/experiments/fmnist_fedsimclr.yaml").read_text()
    root = tmp_path / "params"
    for sub in ("datasets", "partitions", "experiments"):
        (root / sub).mkdir(parents=True)
    bad = re.sub(r"(?m)^precision: .*$", "precision: fp16", exp)  # a key given once
    (root / "experiments/x.yaml").write_text(bad if bad != exp else exp + "precision: fp16\n")
    with pytest.raises(ParamsError, match=r"x\.yaml.*\n.*precision"):
        Presets(root).load("experiment", "x")


def train_steps(setting: str | None, steps: int = 3) -> tuple[list[float], dict]:
    """A few SGD steps of the SimCLR loss on fixed random views: under ``setting``, or (None)
    written the way the code ran before the policy existed: no autocast, contiguous tensors."""
    torch.manual_seed(0)
    views = [torch.rand(16, *SHAPE) for _ in range(2)]
    batch = SimpleNamespace(views=views, valid=None)

    def plain_loss(model, params, buffers, batch):
        z = functional_call(model, (params, buffers), (torch.cat(batch.views),))
        z1, z2 = z.float().chunk(2)
        return nt_xent(z1, z2, 0.5, batch.valid)

    with precision.policy(setting or "fp32"):
        model = seeded_contrastive_model(MODEL, SHAPE, 0, torch.device("cpu"))
        loss_fn = simclr_loss(0.5) if setting else plain_loss
        params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
        buffers = dict(model.named_buffers())
        opt = torch.optim.SGD(params.values(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(steps):
            loss = loss_fn(model, params, buffers, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, {k: v.detach() for k, v in params.items()}


def test_fp32_is_the_plain_code_path_bit_for_bit(cpu_bf16):
    cpu_bf16(True)  # even where bf16 is native, fp32 means fp32
    plain_losses, plain = train_steps(None)
    losses, params = train_steps("fp32")
    assert losses == plain_losses
    assert all(torch.equal(params[k], plain[k]) for k in plain)
    cpu_bf16(False)  # auto on a CPU without native bf16: fp32, laid out channels-last, so
    auto_losses, _ = train_steps("auto")  # the same numbers up to fp32 rounding
    assert auto_losses == pytest.approx(plain_losses, rel=1e-4)


def test_bf16_steps_stay_close_to_fp32():
    """Three steps in bf16 against fp32 (8 bits of mantissa against 24): the losses agree to
    0.1 %, the weights' updates to 15 % of their size (measured: 3e-5 and 8 %), yet they
    differ (autocast really ran)."""
    fp32_losses, fp32 = train_steps("fp32")
    bf16_losses, bf16 = train_steps("bf16")
    _, start = train_steps("fp32", steps=0)

    def update(params):
        return torch.cat([(params[k] - start[k]).flatten() for k in start])

    assert bf16_losses == pytest.approx(fp32_losses, rel=1e-3)
    gap = (update(bf16) - update(fp32)).norm() / update(fp32).norm()
    assert 0 < gap < 0.15


@pytest.mark.parametrize("native", [True, False])
def test_models_are_channels_last_but_under_fp32(cpu_bf16, native):
    """auto lays convolutions out channels-last whether it computes in bf16 or, on a CPU
    without native bf16, in fp32 (faster there too: benchmarks/fp32_layout.py); the fp32
    setting keeps the contiguous layout of the results made before the policy."""
    cpu_bf16(native)
    with precision.policy("auto"):
        model = seeded_contrastive_model(MODEL, SHAPE, 0, torch.device("cpu"))
    conv = second_conv(model)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    with precision.policy("fp32"):
        model = seeded_contrastive_model(MODEL, SHAPE, 0, torch.device("cpu"))
    assert second_conv(model).is_contiguous()


def second_conv(model):
    """A convolution weight with several input channels (one channel fits either layout)."""
    return next(p for p in model.parameters() if p.dim() == 4 and p.shape[1] > 1)


def test_committed_results_resolve_to_their_precision():
    """Every experiment of a committed report keeps the precision its row records (fp32 for
    rows made before it was recorded), or is auto where its row was made in bf16 (what auto
    computes on the CPUs that made the committed results: an fp32 row under an auto preset
    would be stale there); the default pipeline runs auto; the paper, GPU and benchmark
    presets get auto."""
    presets = Presets()
    for report in sorted(Path("results/reports").glob("*/report.json")):
        for row in json.loads(report.read_text())["rows"]:
            made_in = row.get("precision") or "fp32"
            preset = presets.load("experiment", row["experiment"]).precision
            assert preset in (made_in, "auto" if made_in == "bf16" else made_in), (
                report.parent.name,
                row["experiment"],
            )
    for name in ("fmnist_fedsimclr", "fmnist_random_init", "fmnist_pixels"):
        assert presets.load("experiment", name).precision == "auto", name
    for name in ("gpu_fedsimclr", "gpu_pixels", "gpu_mfcl_tn", "paper_leakage", "cifar10_mfcl"):
        assert presets.load("experiment", name).precision == "auto", name
    assert presets.load("experiment", "bench_fedsimclr_iid_s0").precision == "auto"


@pytest.mark.parametrize("setting", ["bf16", "auto", "fp32_channels_last"])
def test_the_cohort_trains_convolutions_channels_last_but_under_fp32(cpu_bf16, setting):
    """Aggregation returns contiguous weights; the cohort trainer's stacked copy puts them
    back in the policy's layout every round (fp32: untouched), auto on a CPU that computes
    it in fp32 included."""
    from fedssl.fl.cohort import stack

    cpu_bf16(False)
    state = {"conv": torch.randn(4, 3, 3, 3), "bias": torch.randn(4)}
    with precision.policy(setting):
        row = stack([state, state])["conv"][1]
    assert row.is_contiguous(memory_format=torch.channels_last) and not row.is_contiguous()
    with precision.policy("fp32"):
        assert stack([state])["conv"][0].is_contiguous()


def test_a_one_channel_first_layer_runs_channels_last_too(cpu_bf16):
    """A weight with one input channel is channels-last and contiguous at once, and the
    convolution reads NCHW from its strides unless the channel stride is 1; the cohort's copy
    gives it that stride, so the first layer's activations are channels-last like the rest
    (mixed layouts made the round's ReLU backward 4.6x slower)."""
    from fedssl.fl.cohort import stack

    cpu_bf16(False)
    state = {"conv": torch.randn(8, 1, 3, 3)}
    with precision.policy("auto"):
        weight = stack([state, state])["conv"][1]
    assert weight.stride(1) == 1 and torch.equal(weight, state["conv"])
    out = torch.nn.functional.conv2d(torch.randn(2, 1, 6, 6), weight, padding=1)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()


def test_the_cohorts_stack_copies_any_tensor_a_state_holds():
    """Each client's slice keeps its laid-out strides; a view with gaps (no dense layout to
    copy) is stacked as torch.stack does, values intact."""
    from fedssl.fl.cohort import stack

    gapped = torch.arange(8.0)[::2]  # stride 2, 4 values: rows laid out by it would overlap
    states = [{"v": gapped, "s": torch.tensor(2.0)}, {"v": gapped + 1, "s": torch.tensor(3.0)}]
    out = stack(states)
    assert torch.equal(out["v"], torch.stack([gapped, gapped + 1]))
    assert torch.equal(out["s"], torch.tensor([2.0, 3.0]))


def test_global_pooling_hands_back_a_broadcast_gradient():
    """The encoders' pool equals ``AdaptiveAvgPool2d(1)``; its gradient is a stride-0 view,
    which a channels-last ReLU's backward reads at full speed (a contiguous one, the adaptive
    pool's, mixes layouts)."""
    from fedssl.models.pooling import GlobalAvgPool

    x = torch.randn(3, 4, 5, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    pooled = GlobalAvgPool()(x)
    torch.testing.assert_close(pooled, torch.nn.AdaptiveAvgPool2d(1)(x))
    seen = []
    x.register_hook(lambda g: seen.append(g.stride()))
    pooled.sum().backward()
    assert seen == [(4, 1, 0, 0)]


def test_stages_cap_the_kernel_cache_unless_the_user_did(monkeypatch):
    """oneDNN's kernel cache held memory per batch shape, so peak memory grew with the client
    count; stages cap it before computing, and a user's own cap wins."""
    import os

    from fedssl.stage.base import KERNEL_CACHE, bound_kernel_cache

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    bound_kernel_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(KERNEL_CACHE) == "128"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    bound_kernel_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


@pytest.mark.usefixtures("one_thread")
def test_a_stage_computes_in_its_experiments_precision_and_records_it(tmp_path):
    """A tiny FedSimCLR pretraining set to bf16: it runs under bf16 (its model channels-last)
    and says so in meta.json (which the report reads) and in its run record."""
    import json

    from fedssl.stage import context as stage
    from tests.fixtures import in_project, make_tiny_project, run_stage

    root = make_tiny_project(tmp_path, git=False)
    exp = root / "params/experiments/tiny_simclr.yaml"
    exp.write_text(exp.read_text() + "precision: bf16\n")
    seen = []
    with in_project(root) as planned:
        pretrain = planned("pretrain", "tiny_simclr")
        real = precision.policy

        def spy(setting):
            seen.append(setting)
            return real(setting)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(precision, "policy", spy)
            run_stage(pretrain, upstream=True)
        meta = json.loads((Path(pretrain.spec.out) / "meta.json").read_text())
        record = json.loads((stage.RUNS_DIR / f"{pretrain.name}.json").read_text())
    assert seen == ["bf16"] and precision.active() == "fp32"
    assert meta["precision"] == "bf16"
    assert record["precision"] == "bf16" and record["precision_setting"] == "bf16"
    assert "precision" in pretrain.spec.params[str(Path("params/experiments/tiny_simclr.yaml"))]


def test_only_the_policy_applies_autocast():
    """Precision is applied in one place (:func:`fedssl.precision.under_policy`): local losses
    reach it through the cohort's ``forward``, centralised loops (the probes, fine-tuning, a
    method's own) through :mod:`fedssl.training.epochs`; no method, nor any other library
    module, opens an autocast region itself."""
    package = Path("fedssl")
    opening = [
        str(f.relative_to(package)) for f in package.rglob("*.py") if "autocast(" in f.read_text()
    ]
    assert opening == ["precision.py"]
    assert "autocast" not in "".join(f.read_text() for f in (package / "methods").rglob("*.py"))
    assert (package / "precision.py").read_text().count("torch.autocast(") == 1


POLICY_CALL = re.compile(r"(?<![\w.])under_policy\(")
OWNERS = {"fl/cohort.py", "training/epochs.py", "methods/mocosfl/trainer.py"}


def test_the_runtime_owns_the_precision_regions():
    """The policy's regions are drawn by the runtime: the cohort's forward, the loops of
    :mod:`fedssl.training.epochs` and MocoSFL's split trainer (a step of its own over two parties),
    at most 4 calls in all; no other method names ``under_policy`` (imported or called), so
    a method cannot move a region's boundary and with it its committed numbers."""
    package = Path("fedssl")
    calls = {}
    for f in sorted(package.rglob("*.py")):
        text, name = f.read_text(), str(f.relative_to(package))
        if name != "precision.py" and (n := len(POLICY_CALL.findall(text))):
            calls[name] = n
        if name.startswith("methods/") and name not in OWNERS:
            assert "under_policy" not in text, (
                f"{name}: run it through fedssl.training.epochs instead"
            )
    assert set(calls) <= OWNERS and sum(calls.values()) <= 4, calls


def autocast_log(log: list, where: str):
    """A function that notes whether autocast is on where it runs, then returns its input."""

    def note(x, *rest):
        log.append((where, torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))
        return x

    return note


@pytest.mark.parametrize("setting, on", [("bf16", True), ("fp32", False)])
def test_the_loops_put_only_the_forward_under_the_policy(setting, on):
    """:func:`fedssl.training.epochs.train_steps` runs each forward in the policy's region and
    the batch's preparation, the loss of the outputs and the after-step outside it (where the
    committed loops drew them); :func:`fedssl.training.epochs.encoded` runs its encoder in the
    region, without gradients, and leaves the caller's code between batches with them."""
    from fedssl.training.epochs import encoded, train_steps

    log, layer = [], torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    prepare, note = autocast_log(log, "batch"), autocast_log(log, "forward")

    def batches():
        for i in range(2):
            yield (prepare(torch.full((2, 3), float(i))),)

    def loss(out):
        return autocast_log(log, "loss")(out).float().pow(2).mean()

    after = autocast_log(log, "after")
    with precision.policy(setting):
        train_steps(opt, "cpu", lambda x: note(layer(x)), batches(), loss, lambda: after(0))
        for _ in encoded("cpu", lambda x: autocast_log(log, "encode")(x), batches()):
            log.append(("caller", torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))
    step = [("batch", False, True), ("forward", on, True), ("loss", False, True)]
    encode = [("batch", False, False), ("encode", on, False), ("caller", False, True)]
    assert log == [*step, ("after", False, True)] * 2 + encode * 2


def test_train_steps_is_the_plain_loop_bit_for_bit():
    """The runner's steps and mean loss are those of the loop it replaced, number for number."""
    from fedssl.training.epochs import train_steps

    def run(runner: bool):
        torch.manual_seed(0)
        layer, data = torch.nn.Linear(4, 2), torch.randn(3, 5, 4)
        opt = torch.optim.Adam(layer.parameters(), lr=0.01)
        if runner:
            mean = train_steps(opt, "cpu", layer, ((x,) for x in data), lambda o: o.pow(2).mean())
            return mean, layer.weight
        total = 0.0
        for x in data:
            value = layer(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            total += value.item()
        return total / len(data), layer.weight

    (mean, weight), (plain_mean, plain_weight) = run(True), run(False)
    assert mean == plain_mean and torch.equal(weight, plain_weight)


def activation_dtypes(model) -> set:
    """Records the dtype of every convolution's and linear layer's output while it runs."""
    seen = set()
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
    return seen


FEDERATED = ["fedsimclr", "fedbyol"]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", FEDERATED)
@pytest.mark.parametrize("setting, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_a_methods_local_training_computes_in_the_policys_precision(name, setting, dtype, tmp_path):
    """One round of a federated method's local training through its own federation: every
    layer's activation is bf16 under bf16 and fp32 under fp32, the method naming no dtype."""
    from fedssl.methods import federated
    from tests.fl.test_engine import SHAPE, toy_data
    from tests.methods.test_method_contract import tiny

    p = tiny(name, rounds=1)
    with precision.policy(setting):
        model = federated.build_model(p, SHAPE, torch.device("cpu"))
        seen = activation_dtypes(model)
        fed = federated.make_federation(p, model, toy_data(), tmp_path / "ckpt.pt", "precision")
        fed.run(fed.start(model))
    assert seen == {dtype}


@pytest.mark.parametrize("setting, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_a_methods_own_loss_computes_in_the_policys_precision(setting, dtype):
    """MFCL's reconstruction loss (a loss of its own, not on the model's outputs) calls its
    autoencoder through the cohort's forward: bf16 activations under bf16, fp32 otherwise; the
    loss itself is fp32 either way."""
    from fedssl.fl.cohort import Batch
    from fedssl.methods.mfcl.run import autoencoder_loss
    from fedssl.models.autoencoder import ClientAutoencoder

    torch.manual_seed(0)
    model = ClientAutoencoder(in_channels=1, width=4, norm="tn", channels_per_group=2)
    seen = activation_dtypes(model)
    views = (torch.rand(4, *SHAPE), torch.rand(4, *SHAPE))
    batch = Batch(views, torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    with precision.policy(setting):
        loss = autoencoder_loss("bce")(model, params, buffers, batch)
    assert seen == {dtype} and loss.dtype == torch.float32


@pytest.mark.parametrize("setting, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_the_probes_features_are_computed_in_the_policys_precision(setting, dtype):
    """The probes' feature pass runs the encoder under the policy and hands back fp32."""
    import numpy as np

    from fedssl.eval.probes import extract_features

    encoder = seeded_contrastive_model(MODEL, SHAPE, 0, torch.device("cpu")).backbone
    seen = activation_dtypes(encoder)
    images = np.random.default_rng(0).integers(0, 256, (6, *SHAPE), dtype=np.uint8)
    with precision.policy(setting):
        features = extract_features(encoder, images, 4, torch.device("cpu"))
    assert seen == {dtype} and features.dtype == np.float32
