"""Tiny-ImageNet (200 classes, 64x64), from its unzipped archive."""

from fedssl.data.catalog import DatasetSpec, register

register(
    DatasetSpec(
        "tiny_imagenet",
        "Tiny",
        200,
        (3, 64, 64),
        100000,
        "fedssl.data.sources:TINY_IMAGENET",
        downloadable=False,  # the archive needs unzipping by hand
    )
)
