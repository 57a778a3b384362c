"""fedssl: federated self-supervised learning as a declarative Snakemake/DVC pipeline."""
