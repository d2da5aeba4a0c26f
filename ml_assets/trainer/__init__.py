"""Pure PyTorch training, run by torchrun. Imports no dagster: only dagster_pipes, on rank 0."""
