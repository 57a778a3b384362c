"""Privacy attacks: gradient leakage (DLG / iDLG) and model inversion of cut-layer activations."""
