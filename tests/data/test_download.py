"""A data set that is missing and cannot be downloaded (`download: true` on a machine without
internet) says how to get it, in one message, without a traceback."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import pytest

from fedssl.data.catalog import load_dataset
from fedssl.data.sets import DataNotFound
from tests.fixtures import make_tiny_project


@pytest.fixture
def offline(monkeypatch):
    """Every URL torchvision opens fails as it does without a network."""
    calls = []

    def urlopen(request, *args, **kwargs):
        calls.append(getattr(request, "full_url", request))
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


@pytest.mark.parametrize(
    "name, howto",
    [
        ("fashion_mnist", "apt-get install dataset-fashion-mnist"),
        ("cifar10", "copy cifar-10-batches-py/ from its data_root"),
        ("stl10", "copy stl10_binary/ from its data_root"),
    ],
)
def test_a_failed_download_says_how_to_get_the_data(tmp_path, offline, name, howto):
    with pytest.raises(DataNotFound) as err:
        load_dataset(name, str(tmp_path / "nowhere"), download=True)
    message = str(err.value)
    assert offline, "the download was never tried"
    assert "\n" not in message
    assert f"{name} is not at {tmp_path / 'nowhere'} and could not be downloaded" in message
    assert "Temporary failure in name resolution" in message and "offline?" in message
    assert howto in message and message.endswith("then set `download: false`.")


def test_an_os_error_while_downloading_is_reported_the_same_way(tmp_path, monkeypatch):
    def urlopen(*args, **kwargs):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(DataNotFound, match=r"could not be downloaded \(.*Connection reset"):
        load_dataset("cifar100", str(tmp_path), download=True)


def test_the_prepare_data_stage_prints_one_message_and_exits_2(
    tmp_path, monkeypatch, offline, capsys
):
    from fedssl.stage.context import main_guard
    from stages.prepare_data import run

    root = make_tiny_project(tmp_path, git=False)
    (root / "params" / "datasets" / "tiny.yaml").write_text(
        "name: fashion_mnist\ndata_root: empty\ndownload: true\n"
    )
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["stages.prepare_data", "tiny"])
    with pytest.raises(SystemExit) as exit_:
        main_guard(run)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: fashion_mnist is not at") and err.count("\n") == 1
    assert "apt-get install dataset-fashion-mnist" in err and "Traceback" not in err
    assert not (root / "artifacts" / "data" / "tiny").exists()
