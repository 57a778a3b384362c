"""The report's pivot table (MFCL Tab. 2 layout, Tab. 3 cost columns)."""
from __future__ import annotations

from fedssl import params as P
from fedssl.report import pivot_markdown, table_cell
from tests.fixtures import TINY_MFCL_EXPERIMENT

PART = P.PartitionParams.model_validate(
    {"dataset": "c10", "num_clients": 10, "scheme": {"kind": "dirichlet", "alpha": 0.01}})


def mfcl_exp():
    import yaml
    raw = yaml.safe_load(TINY_MFCL_EXPERIMENT.format(norm="gn", secure="false"))
    return P.ExperimentParams.model_validate(raw)


def test_cells_are_method_by_partition_or_by_the_swept_setting():
    assert table_cell(mfcl_exp(), PART, "cifar10") == ("MFCL(GN)", "CIFAR-10 ξ=0.01")
    iid = PART.model_copy(update={"scheme": P.IIDScheme()})
    assert table_cell(mfcl_exp(), iid, "tiny_imagenet") == ("MFCL(GN)", "Tiny IID")
    assert table_cell(mfcl_exp(), PART, "cifar10", "method",
                      "mfcl.client_module.channels_per_group") == ("MFCL(GN)", "channels_per_group=2")
    assert table_cell(mfcl_exp(), PART, "cifar10", "title")[0] == mfcl_exp().title


def row(method, column, acc, alpha=""):
    return {"row": method, "column": column, "linear_top1": acc, "alpha_bits": alpha,
            "beta_GFLOPs": "", "gamma_eq6_MB": "", "client_MB_sent": ""}


def test_pivot_puts_methods_down_partitions_across_and_averages_repeats():
    rows = [row("MFCL(TN)", "ξ=0.01", 84.0, "2.5e+11"), row("MFCL(TN)", "ξ=0.01", 85.0, "2.5e+11"),
            row("MFCL(TN)", "ξ=200", 85.3, "2.5e+11"), row("FedSimCLR", "ξ=200", 81.9)]
    lines = pivot_markdown(rows, "linear_top1").splitlines()
    assert lines[0].split(" | ")[:3] == ["| method", "ξ=0.01", "ξ=200"]
    tn = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert tn[:4] == ["MFCL(TN)", "84.50±0.71", "85.30", "2.5e+11"]
    fed = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert fed[:4] == ["FedSimCLR", "", "81.90", ""]  # no run, no costs stage: blank cells
    assert "α (bits)" not in pivot_markdown(rows, "linear_top1", costs=False)
