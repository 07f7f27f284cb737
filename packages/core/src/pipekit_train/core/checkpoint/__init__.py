"""Checkpoints: the policy (`Checkpoint`), where steps live (the stores) and the engines.

- `Checkpoint` says what is saved and when (`_policy`); `Location` parses where
  (`_location`: a local directory or any fsspec URI).
- `CheckpointStore` is one interface over local disks (`LocalStore`) and object stores
  (`FsspecStore`): atomic step commits, folder digests, retention, torn-step fallback
  (`_store`, `_remote`, `_digest`, `_fsutil`).
- `Checkpointer` is the engine interface a backend implements; `DirectoryCheckpointer`
  is core's SHA-256-verified blob engine for backends without one (`_engine`);
  `HostBuffers` reuses host arrays for non-blocking snapshots (`_snapshot`).

Nothing here knows about a run: the run (`pipekit_train.core.run`) decides when to save.
"""
