"""Federated learning: the engine with hooks, cohort training, momentum, secure aggregation."""
