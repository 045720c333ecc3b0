"""Build a Triton model repository for embedding models: export, validate, render."""
