"""Checkpoints: the policy (`Checkpoint`), where steps live (the stores) and the engines.

- `Checkpoint` says what is saved and when (`_policy`); `Location` parses where
  (`_location`: a local directory or any fsspec URI).
- `CheckpointStore` is one interface over local disks (`LocalStore`) and object stores
  (`FsspecStore`): atomic step commits, folder digests, retention, torn-step fallback
  (`_store`, `_remote`, `_digest`; the atomic writes are `core._atomic`).
- `RunLease` holds one run's lease on its location (`_lease`: one run per location, a
  generation per taking; `_lease_records`: one record per generation, created
  exclusively; `_lease_rules`: who is dead); `read_lease` says who holds one. `_fencing`
  decides which steps a run may resume by the generation that wrote them.
- `Checkpointer` is the engine interface a backend implements; `DirectoryCheckpointer`
  is core's SHA-256-verified blob engine for backends without one (`_engine`);
  `HostBuffers` reuses host arrays for non-blocking snapshots (`_snapshot`).

Nothing here knows about a run: the run (`pipekit_train.core.run`) decides when to save.
Users find `Checkpoint` at `pipekit_train.core`; `step_dirs` and the stores are here for
tools and tests that look into a checkpoint location.
"""

from ._engine import Checkpointer, DirectoryCheckpointer, Restored, has_checkpoints, step_dirs
from ._lease import LeaseError, LeaseHolder, read_lease
from ._policy import Checkpoint
from ._snapshot import HostBuffers
from ._store import (
    CheckpointStore,
    FsspecStore,
    LocalStore,
    TornCheckpointWarning,
    TornStepError,
    open_store,
)

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "Checkpointer",
    "DirectoryCheckpointer",
    "FsspecStore",
    "HostBuffers",
    "LeaseError",
    "LeaseHolder",
    "LocalStore",
    "Restored",
    "TornCheckpointWarning",
    "TornStepError",
    "has_checkpoints",
    "open_store",
    "read_lease",
    "step_dirs",
]
