"""MFCL's Tab. 2 layout: every method's accuracy per ξ beside the paper's number and rank."""

from __future__ import annotations

from fedssl.methods.mfcl.tables import paper_tab2, tab2, tables


def row(label, xi, seed_value, method="fedsimclr", metric="linear_top1"):
    return {"row": label, "column": f"F-MNIST ξ={xi}", "method": method, metric: seed_value}


def test_paper_table_is_whole():
    paper = paper_tab2()
    assert len(paper) == 12 * 3 * 3  # methods × data sets × ξ
    assert paper[("FedEMA", "CIFAR-10", 0.1)] == (81.9, 0.09)
    assert paper[("MFCL(TN)", "Tiny-ImageNet", 200.0)] == (42.2, 0.18)


def test_layout_ours_beside_the_paper_with_ranks():
    rows = [
        row("MFCL(TN)", 0.1, 70.0, method="mfcl"),
        row("MFCL(TN)", 0.1, 72.0, method="mfcl"),
        row("FedEMA", 0.1, 75.0, method="fedema"),
        row("FedProx (μ=0.01)", 0.1, 60.0, method="supervised", metric="global_top1"),
    ]
    rows[-1]["linear_top1"] = 79.0  # a probe of the supervised model's encoder, not Tab. 2's
    lines = {line.split(" | ")[0].strip("| "): line for line in tab2(rows).splitlines()[2:]}
    # ours: mean ± sample SD over seeds, ranked; the paper's CIFAR-10 value for the same ξ
    assert "| 71.0±1.4 (2) | 84.6±0.21 (1) |" in lines["MFCL(TN)"]
    assert "| 75.0 (1) | 81.9±0.09 (3) |" in lines["FedEMA"]
    # a supervised row reads its trained model's top-1; its μ is not part of the paper's name
    assert "| 60.0 (3) | 83.0±0.19 (2) |" in lines["FedProx (μ=0.01)"]


def test_unknown_method_has_no_paper_cell_and_one_method_makes_no_table():
    rows = [row("MFCL(TN)", 0.01, 70.0, method="mfcl"), row("FedU", 0.01, 60.0)]
    rows.append(row("Mine", 0.01, 50.0))
    line = tab2(rows).splitlines()[-1]
    assert line.startswith("| Mine | 50.0 (3) | – |")
    assert tab2([rows[0], rows[2]]) is None  # one method the paper has: nothing to rank
    assert "mfcl_tab2" not in tables([row("FedEMA", 0.1, 75.0), row("FedU", 0.1, 74.0)])
