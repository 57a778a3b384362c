"""STL-10 (Coates et al., 2011), in its binary layout: train, test and unlabeled splits."""

from fedssl.data.sets import DatasetSpec, register
from fedssl.data.sets._torchvision import presence_checked, torchvision_source

STL10 = torchvision_source(
    "stl10",
    lambda: presence_checked("STL10"),
    "stl10_binary",
    ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin", "unlabeled_X.bin"],
    {s: {"split": s} for s in ("train", "test", "unlabeled")},
    lambda x: x,  # torchvision already undoes STL's column-major storage: NCHW, labels 0-based
)

register(DatasetSpec("stl10", "STL-10", 10, (3, 96, 96), 5000, "fedssl.data.sets.stl10:STL10"))
