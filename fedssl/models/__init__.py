"""Networks: encoders, heads, ViT, CNNs, split models, norms, MFCL modules."""
