"""Training, checkpoints and inference around the pure-PyTorch ``transformer`` package."""
