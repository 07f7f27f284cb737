"""Trajectory sources over field data on disk, for `Trajectories.from_source`.

`XarraySource` / `read_xarray` (`_xarray`): xarray datasets, zarr stores and NetCDF
files (weather and climate data: variables on `time × level × lat × lon`).
"""

from ._xarray import XarraySource, read_xarray

__all__ = ["XarraySource", "read_xarray"]
