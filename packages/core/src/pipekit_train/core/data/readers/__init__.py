"""Readers of trajectories stored by other tools, as trajectory sources.

`WellSource` / `read_well`: files in The Well's HDF5 layout (PolymathicAI/the_well),
read window by window (h5py, the `hdf5` extra). Each reader is a source for
`Trajectories.from_source`, so `TrajectoryWindows` and `make_batches` work over it.
"""

from ._well import WellSource, read_well

__all__ = ["WellSource", "read_well"]
