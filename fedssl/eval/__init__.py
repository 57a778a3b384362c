"""Evaluation: probes, personalised evaluation, metrics."""
