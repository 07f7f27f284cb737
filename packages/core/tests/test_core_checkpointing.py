"""The checkpoint policy and the atomic directory store."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from pipekit_train.core import Checkpoint, CheckpointError, ConfigError, TornCheckpointWarning
from pipekit_train.core.adapter import DirectoryCheckpointer, HostBuffers


def _store(tmp_path: Path, **kw) -> DirectoryCheckpointer:
    policy = Checkpoint(tmp_path / "ck", **kw)
    return DirectoryCheckpointer(
        policy,
        encode=lambda state: {"state.json": json.dumps(state).encode()},
        decode=lambda blobs, template: json.loads(blobs["state.json"]),
    )


@pytest.mark.parametrize("async_save", [False, True])
def test_save_and_restore_latest(tmp_path: Path, async_save: bool) -> None:
    store = _store(tmp_path, max_to_keep=None, async_save=async_save)
    for step in (2, 4, 6):
        store.save(step, {"w": step}, {"step": step, "data_iter": {"index": step}}, {})
    store.close()
    restored = _store(tmp_path).restore_latest(None)
    assert restored is not None
    assert (restored.step, restored.state, restored.meta["data_iter"]) == (
        6,
        {"w": 6},
        {"index": 6},
    )
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["2", "4", "6"]


def test_torn_steps_are_skipped_with_a_warning(tmp_path: Path) -> None:
    store = _store(tmp_path, max_to_keep=None, async_save=False)
    for step in (1, 2, 3):
        store.save(step, {"w": step}, {"step": step}, {})
    (tmp_path / "ck" / "3" / "state.json").write_text('{"w": 999}')  # content no longer matches
    (tmp_path / "ck" / "2" / "MANIFEST.json").unlink()  # an interrupted write
    (tmp_path / "ck" / ".tmp-4-abcdef").mkdir()  # a write killed before the rename
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = _store(tmp_path).restore_latest(None)
    assert restored is not None and restored.step == 1 and restored.state == {"w": 1}
    messages = [str(w.message) for w in caught if issubclass(w.category, TornCheckpointWarning)]
    assert len(messages) == 2 and "SHA-256" in messages[0] and "MANIFEST" in messages[1]
    assert not (tmp_path / "ck" / ".tmp-4-abcdef").exists()


def test_retention_keeps_latest_and_best(tmp_path: Path) -> None:
    store = _store(tmp_path, max_to_keep=2, keep_best=1, monitor="val_loss", async_save=False)
    scores = {1: 0.5, 2: 0.1, 3: 0.4, 4: 0.3, 5: 0.6}
    for step, score in scores.items():
        store.save(step, {"w": step}, {"step": step}, {"val_loss": score})
    assert sorted(int(p.name) for p in (tmp_path / "ck").iterdir()) == [2, 4, 5]


def test_resave_of_same_step_replaces_it(tmp_path: Path) -> None:
    store = _store(tmp_path, async_save=False)
    store.save(4, {"w": 1}, {"step": 4}, {})
    store.save(4, {"w": 2}, {"step": 4}, {})
    assert store.restore_latest(None).state == {"w": 2}


def test_async_error_surfaces_on_wait(tmp_path: Path) -> None:
    store = _store(tmp_path, async_save=True)
    # A file appearing where the folder should be after construction (which refuses a file).
    (tmp_path / "ck").write_text("not a directory")
    store.save(1, {"w": 1}, {"step": 1}, {})
    with pytest.raises(CheckpointError, match=r"checkpoint of step 1 .*FileExistsError"):
        store.wait()
    store.wait()  # raised once: the failure is not raised again


def test_reserved_blob_names_are_refused(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", async_save=False)
    store = DirectoryCheckpointer(
        policy, encode=lambda s: {"meta.json": b"{}"}, decode=lambda b, t: None
    )
    with pytest.raises(CheckpointError):
        store.save(1, None, {}, {})


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"max_to_keep": 0}, "max_to_keep"),
        ({"keep_best": -1}, "keep_best"),
        ({"mode": "up"}, "mode"),
        ({"resume": "sometimes"}, "resume"),
        ({"directory": ""}, "directory"),
    ],
)
def test_policy_validation(tmp_path: Path, kwargs: dict, fragment: str) -> None:
    kwargs.setdefault("directory", tmp_path / "ck")
    with pytest.raises(ConfigError, match=fragment):
        Checkpoint(**kwargs)


def test_policy_schedule() -> None:
    policy = Checkpoint("x", every_n_steps=5)
    assert [s for s in range(0, 13) if policy.due(s)] == [5, 10]
    assert policy.due(12, final=True)
    assert not Checkpoint("x", every_n_steps=5, save_on_end=False).due(12, final=True)


def test_host_buffers_are_reused_and_decoupled_from_the_source() -> None:
    import numpy as np

    buffers = HostBuffers()
    source = np.arange(6.0).reshape(2, 3).T  # not contiguous
    first = buffers.copy("w", source)
    source[0, 0] = 99.0  # the training step changes the live array
    assert first[0, 0] == 0.0 and first.flags.c_contiguous
    again = buffers.copy("w", source)
    assert again is first and again[0, 0] == 99.0  # the same buffer, refilled
    other = buffers.copy("w", source.astype(np.float32))
    assert other is not first and other.dtype == np.float32  # a new dtype: a new buffer
    assert len(buffers) == 1 and buffers.nbytes == other.nbytes


def test_snapshot_runs_on_the_training_thread_and_encode_on_the_writer(tmp_path: Path) -> None:
    import threading

    threads: dict[str, str] = {}

    def snapshot(state: dict) -> dict:
        threads["snapshot"] = threading.current_thread().name
        return dict(state)

    def encode(snap: dict) -> dict:
        threads["encode"] = threading.current_thread().name
        return {"state.json": json.dumps(snap).encode()}

    store = DirectoryCheckpointer(
        Checkpoint(tmp_path / "ck", async_save=True),
        snapshot=snapshot,
        encode=encode,
        decode=lambda blobs, template: json.loads(blobs["state.json"]),
    )
    state = {"w": 1}
    store.save(5, state, {"step": 5}, {})
    state["w"] = 2  # after save() returns: not in the checkpoint
    store.close()
    assert threads["snapshot"] == threading.current_thread().name
    assert threads["encode"].startswith("pipekit-ckpt")
    assert _store(tmp_path).restore_latest(None).state == {"w": 1}
