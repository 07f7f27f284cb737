"""Orbax steps are sealed with a SHA-256 digest; a damaged or unsealed step is never resumed.

Real Orbax, real files: a run checkpoints steps 4 and 8; each test damages step 8 on a
copy and resumes to step 12, which must fall back to step 4 with a
`TornCheckpointWarning` naming the step and the file, and end byte-identical to an
uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
import threading
import warnings
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, TornCheckpointWarning, TrainingLoop
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.checkpoint._digest import FOLDER_DIGEST, check_folder, seal_folder
from pipekit_train.equinox import EquinoxModelOp

# Every file of an Orbax step directory (`_files_of`), by a stable pattern: the array
# chunk files under `d/` have random names. `test_the_patterns_cover_every_file` keeps
# this list complete if Orbax's layout changes.
PATTERNS = [
    "_CHECKPOINT_METADATA",
    "commit_success.txt",
    "pipekit-digest.json",
    "meta/metadata",
    "meta/commit_success.txt",
    "pipekit/metadata",
    "pipekit/commit_success.txt",
    "state/_METADATA",
    "state/_sharding",
    "state/commit_success.txt",
    "state/manifest.ocdbt",
    "state/array_metadatas/*",
    "state/d/*",
    "state/ocdbt.process_*/manifest.ocdbt",
    "state/ocdbt.process_*/d/*",
]


def _files_of(step: Path) -> list[str]:
    return sorted(p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file())


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def build(regression: tuple[Any, Any]) -> Callable[..., TrainingLoop]:
    train, val = regression

    def make(max_steps: int, checkpoint: Checkpoint | None = None) -> TrainingLoop:
        return TrainingLoop(
            model=EquinoxModelOp(
                "pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0
            ),
            data=train,
            validation=val,
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.02},
            batch_size=16,
            max_steps=max_steps,
            seed=0,
            progress=False,
            checkpoint=checkpoint,
        )

    return make


@pytest.fixture(scope="module")
def saved(build: Callable[..., TrainingLoop], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 4 and 8 of a run, sealed."""
    root = tmp_path_factory.mktemp("saved")
    build(8, Checkpoint(root, every_n_steps=4, max_to_keep=None)).run()
    assert step_dirs(root) == [4, 8]
    return root


@pytest.fixture(scope="module")
def reference(build: Callable[..., TrainingLoop]) -> bytes:
    """The weights of the uninterrupted 12-step run."""
    return build(12).run().model.serialize_weights()


def _copy(saved: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    return root


def _resume_from_4(
    build: Callable[..., TrainingLoop], root: Path, reference: bytes, problem: str
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        art = build(12, Checkpoint(root, every_n_steps=4, max_to_keep=None)).run()
    torn = [str(w.message) for w in caught if issubclass(w.category, TornCheckpointWarning)]
    assert len(torn) == 1, torn
    assert "step 8" in torn[0] and problem in torn[0], torn[0]
    assert art.resumed_from_step == 4
    assert art.model.serialize_weights() == reference
    # Step 8 was written again, from the right timeline, and sealed.
    assert step_dirs(root) == [4, 8, 12]
    assert all(check_folder(root / str(s)) is None for s in (4, 8, 12))


def test_every_step_is_sealed_off_the_training_thread(
    build: Callable[..., TrainingLoop], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    seal = seal_folder

    def spy(folder: Path, step: int, **kw: Any) -> None:
        threads.append(threading.current_thread().name)
        seal(folder, step, **kw)

    from pipekit_train.core.checkpoint import _store  # the store seals the step the engine wrote

    monkeypatch.setattr(_store, "seal_folder", spy)
    build(8, Checkpoint(tmp_path, every_n_steps=4, max_to_keep=None)).run()
    assert len(threads) == 2 and threading.main_thread().name not in threads
    for step in (4, 8):
        folder = tmp_path / str(step)
        record = json.loads((folder / FOLDER_DIGEST).read_text())
        assert record["step"] == step
        assert sorted(record["files"]) == [f for f in _files_of(folder) if f != FOLDER_DIGEST]
        assert check_folder(folder) is None


def test_the_patterns_cover_every_file(saved: Path) -> None:
    files = _files_of(saved / "8")
    assert [f for f in files if not any(fnmatch(f, p) for p in PATTERNS)] == []
    assert [p for p in PATTERNS if not any(fnmatch(f, p) for f in files)] == []


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_flipped_byte_in_any_file_is_never_resumed(
    build: Callable[..., TrainingLoop],
    saved: Path,
    reference: bytes,
    tmp_path: Path,
    pattern: str,
) -> None:
    names = [f for f in _files_of(saved / "8") if fnmatch(f, pattern)]
    assert names
    for i, name in enumerate(names):  # one file at a time
        root = _copy(saved, tmp_path / str(i))
        _flip_byte(root / "8" / name)
        problem = "digest" if name == FOLDER_DIGEST else name
        _resume_from_4(build, root, reference, problem)


def test_an_unsealed_step_is_skipped(
    build: Callable[..., TrainingLoop], saved: Path, reference: bytes, tmp_path: Path
) -> None:
    root = _copy(saved, tmp_path)
    (root / "8" / FOLDER_DIGEST).unlink()
    _resume_from_4(build, root, reference, f"no {FOLDER_DIGEST}")


def test_a_removed_or_added_file_is_torn(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    (root / "8" / "meta" / "metadata").unlink()
    assert check_folder(root / "8") == "meta/metadata is missing"
    (root / "4" / "state" / "extra").write_bytes(b"x")
    assert check_folder(root / "4") == f"state/extra is not in its {FOLDER_DIGEST}"


def test_sync_saves_are_sealed_and_nothing_unsealed_is_resumed(
    build: Callable[..., TrainingLoop], tmp_path: Path
) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=4, max_to_keep=None, async_save=False)
    build(8, policy).run()
    for step in (4, 8):
        assert check_folder(tmp_path / str(step)) is None
        (tmp_path / str(step) / FOLDER_DIGEST).unlink()
    with pytest.warns(TornCheckpointWarning) as record:
        art = build(8, policy).run()
    assert sum(issubclass(w.category, TornCheckpointWarning) for w in record) == 2
    assert art.resumed_from_step is None  # no sealed step: a fresh start
    assert step_dirs(tmp_path) == [4, 8]
