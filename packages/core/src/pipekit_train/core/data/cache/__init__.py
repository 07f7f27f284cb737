"""The cache: a dataset materialised in a zarr v3 group, built once and read by chunks.

`CachedDataset` (`_cached`) reads a cache: whole when it fits in memory, else through an
LRU of whole chunks (`_chunk_lru`) read straight from their files (`_chunk_files`).
`_build` builds one chunk by chunk, resumably, in this process or in worker processes;
`_ray_build` sends each chunk to a Ray task; `_write_chunk` is what both write per
chunk; `_zarr_store` is where a cache lives and what its metadata holds.
"""

from ._cached import CachedDataset
from ._ray_build import RayBuildExecutor

__all__ = ["CachedDataset", "RayBuildExecutor"]
