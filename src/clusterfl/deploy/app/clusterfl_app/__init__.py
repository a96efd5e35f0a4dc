"""The Flower App of clusterfl (shipped in the FAB): a light ClientApp, see `client.py`."""
