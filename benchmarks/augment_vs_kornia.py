"""Throughput of fedssl's BatchAugment against the equivalent kornia.augmentation pipeline.

Both do per-sample random resized crop, horizontal flip, colour jitter (p=0.8) and random
grayscale (p=0.2) on a batch of uint8 3x32x32 images (kornia gets the uint8 -> float
conversion inside its timing too). kornia is not a dependency of fedssl: ``pip install kornia``.

    python benchmarks/augment_vs_kornia.py [--batch 512] [--repeats 20] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedssl.data.augment import BatchAugment, to_float
from fedssl.params import AugmentParams


def kornia_pipeline(p: AugmentParams, size: int):
    import kornia.augmentation as K

    return K.AugmentationSequential(
        K.RandomResizedCrop(
            (size, size), scale=p.crop_scale, ratio=p.crop_ratio, same_on_batch=False
        ),
        K.RandomHorizontalFlip(p=p.flip_p, same_on_batch=False),
        K.ColorJitter(
            p.brightness, p.contrast, p.saturation, p.hue, p=p.jitter_p, same_on_batch=False
        ),
        K.RandomGrayscale(p=p.grayscale_p, same_on_batch=False),
    )


def time_it(fn, device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Median seconds per call."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        import kornia
    except ImportError:
        kornia = None
        print("kornia is not installed (pip install kornia): timing BatchAugment only")

    params = AugmentParams()  # SimCLR defaults; blur and solarize are off, as in kornia's list
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, kornia {getattr(kornia, '__version__', '-')}, "
        f"{torch.get_num_threads()} CPU threads, batch {args.batch} x 3 x {args.size}^2 uint8"
    )
    for device in devices:
        images = torch.randint(
            0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=device
        )
        gen = torch.Generator(device).manual_seed(0)
        ours = BatchAugment(params, args.size)
        t_ours = time_it(lambda: ours(images, gen), device, args.repeats)
        line = f"[{device.type}] BatchAugment: {args.batch / t_ours:12,.0f} images/s"
        if kornia is not None:
            pipe = kornia_pipeline(params, args.size).to(device)
            t_k = time_it(lambda: pipe(to_float(images)), device, args.repeats)
            line += f" | kornia: {args.batch / t_k:12,.0f} images/s | speed-up x{t_k / t_ours:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
