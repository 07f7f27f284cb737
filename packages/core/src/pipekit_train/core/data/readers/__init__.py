"""Readers of field data stored by other tools, as trajectory sources.

- `WellSource` / `read_well` (`_well`): files in The Well's HDF5 layout
  (PolymathicAI/the_well), read window by window (h5py, the `hdf5` extra);
- `XarraySource` / `read_xarray` (`_xarray`): xarray datasets, zarr stores and NetCDF
  files (weather and climate data: variables on `time × level × lat × lon`; the
  `xarray` extra).

Each reader is a source for `Trajectories.from_source`, so `TrajectoryWindows` and
`make_batches` work over it.
"""

from ._well import WellSource, read_well
from ._xarray import XarraySource, read_xarray

__all__ = ["WellSource", "XarraySource", "read_well", "read_xarray"]
