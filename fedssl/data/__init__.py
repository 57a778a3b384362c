"""Data sets: on-disk sources, the prepared store, partitions, augmentation."""
