"""clusterfl's methods for any Flower app: `ClusteredStrategy` drives *standard* ClientApps
(`@app.train()` / `@app.evaluate()` as in Flower's quickstart examples) with a clustered
method's own server steps; `clusterfl.flower.client` holds the small helpers a ClientApp adds
for the methods that need more than train/evaluate. See docs/flower.md.

Nothing here is imported by `import clusterfl`; Flower is imported when a strategy starts.
"""

from clusterfl.flower.strategy import DRIVABLE, ClusteredResult, ClusteredStrategy

__all__ = ["DRIVABLE", "ClusteredResult", "ClusteredStrategy"]
