"""Centralised training, the pieces the fine-tune, MFCL's rServer and CP-CFL's server
pretraining share: the resumable epoch loop with the federated engine's checkpoint rules, and
the LARS optimiser with its warmup + cosine schedule."""
