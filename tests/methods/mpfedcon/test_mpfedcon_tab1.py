"""MpFedcon's Tab. 1 layout: ours per column beside the paper's column for the same S."""

from __future__ import annotations

from fedssl.methods.mpfedcon.tables import paper_column, paper_tab1, tab1


def row(label, classes, value, dataset="F-MNIST"):
    return {"row": label, "column": f"{dataset} {classes} classes/client", "personal_last10": value}


def test_paper_table_is_whole():
    paper = paper_tab1()
    assert len(paper) == 11 * 5
    assert paper[("Per-FedAvg", "CIFAR-10", 2)] == (100, 82.27, "FO")
    assert paper[("FedRep", "FEMNIST", 3)] == (150, 78.56, "")
    assert paper[("MpFedcon", "CIFAR-10", 5)] == (100, 77.61, "μ=10")


def test_paper_column_same_data_set_else_cifar10_with_the_same_classes():
    paper = paper_tab1()
    assert paper_column("CIFAR-100 20 classes/client", paper) == ("CIFAR-100", 20)
    assert paper_column("F-MNIST 5 classes/client", paper) == ("CIFAR-10", 5)
    assert paper_column("F-MNIST 7 classes/client", paper) is None
    assert paper_column("F-MNIST ξ=0.1", paper) is None


def test_layout_ranks_ours_and_the_papers():
    rows = [
        row("FedAvg", 2, 30.0),
        row("FedAvg", 2, 32.0),
        row("SCAFFOLD (canonical, η_g=1)", 2, 40.0),
        row("MpFedcon (μ=10)", 2, 50.0),
        row("Mine", 2, 60.0),
    ]
    table = tab1(rows, "personal_last10")
    assert "| F-MNIST 2 classes/client | paper CIFAR-10 (100,2) |" in table
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[4:]}
    assert lines["FedAvg"].endswith("| 31.00±1.41 (4) | 42.65 (2) |")
    assert lines["SCAFFOLD (canonical, η_g=1)"].endswith("| 40.00 (3) | 37.72 (3) |")
    assert lines["MpFedcon (μ=10)"].endswith("| 50.00 (2) | 89.35 (1) |")
    assert lines["Mine"].endswith("| 60.00 (1) |  |")


def test_the_paper_number_stands_beside_the_row_of_its_setting():
    rows = [row("MpFedcon (μ=0.5)", 2, 90.0), row("MpFedcon (μ=10)", 2, 50.0)]
    rows += [row("Ditto (λ=1)", 2, 80.0), row("Ditto (λ=0.1)", 2, 70.0)]
    rows += [row("Per-FedAvg (FO)", 2, 60.0), row("Per-FedAvg (HF)", 2, 55.0)]
    lines = {
        line.split(" | ")[0].strip("| "): line
        for line in tab1(rows, "personal_last10").splitlines()[4:]
    }
    assert lines["MpFedcon (μ=10)"].endswith("| 50.00 (6) | 89.35 (1) |")
    assert lines["MpFedcon (μ=0.5)"].endswith("| 90.00 (1) |  |")
    # FedRep's Per-FedAvg has no second-order term: beside our first-order row
    assert lines["Per-FedAvg (FO)"].endswith("| 60.00 (4) | 82.27 (2) |")
    assert lines["Per-FedAvg (HF)"].endswith("| 55.00 (5) |  |")
    # two Ditto rows and no setting named in the paper's table: neither gets its number
    assert lines["Ditto (λ=1)"].endswith("|  |") and lines["Ditto (λ=0.1)"].endswith("|  |")
