"""clusterfl: clustered federated learning (CFL, CFL-GP, CAM, FLT and baselines)."""

__version__ = "0.1.0"
