"""clustercheck: prove that a cluster of GPU nodes is ready for multi-node PyTorch training."""

__version__ = "0.1.0"
