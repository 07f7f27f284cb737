"""`pipekit-train run` on the real backends, through the installed console script.

Keras (on jax): the example config trains, is SIGKILLed mid-run, and the same command
run again resumes from the latest complete checkpoint and ends with the same weight
bytes as an uninterrupted run; `registry list` shows the result. Equinox (in this
process, through `main`): a short run writes Orbax checkpoints, which `checkpoint
inspect` verifies without importing jax, and its verdict on damaged steps is the one the
adapter acts on when resuming.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipekit_train.core import TornCheckpointWarning
from pipekit_train.core.cli import main

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "cli_direct.toml"
SCRIPT = str(Path(sys.executable).parent / "pipekit-train")
SMALL = [
    "max_steps=60",
    "validate_every_n_steps=20",
    "log_every_n_steps=10",
    "checkpoint.every_n_steps=20",
    "checkpoint.max_to_keep=all",
    "data.kwargs.n=640",
    "model.kwargs.width=16",
    "progress=lines",
]
KILL = "callbacks=[{type = 'cli_kill:KillAt', step = 45, marker = 'killed-once'}]"


def _cli(*args: str, cwd: Path, sets: list[str] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(HERE)}
    command = [SCRIPT, *args, *(x for s in sets for x in ("--set", s))]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_keras_run_is_killed_and_resumes_to_the_same_weights(tmp_path: Path) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    (reference / "killed-once").write_text("")  # the same command, never killed
    run = ["run", str(EXAMPLE), "--backend", "keras"]

    out = _ok(_cli(*run, cwd=reference, sets=[*SMALL, KILL]))
    assert "training from step 0 to 60" in out
    assert "registered: cli-direct version 1" in out

    proc = _cli(*run, cwd=killed, sets=[*SMALL, KILL])
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (killed / "killed-once").read_text() == "45"
    assert "done:" not in proc.stdout
    ckpt = killed / "runs" / "cli_direct" / "keras" / "checkpoints"
    report = json.loads(_ok(_cli("checkpoint", "inspect", str(ckpt), "--json", cwd=killed)))
    assert report["latest_complete"] in (20, 40)
    assert all(s["engine"] == "directory" for s in report["steps"])
    latest = next(s for s in report["steps"] if s["step"] == report["latest_complete"])
    assert latest["resume_key"]["backend"] == "keras"
    assert not (killed / "runs" / "models").exists()  # a killed run registers nothing

    out = _ok(_cli(*run, cwd=killed, sets=[*SMALL, KILL]))  # the same command again
    assert f"resumed from checkpoint at step {report['latest_complete']}/60" in out
    assert "registered: cli-direct version 1" in out

    weights = [
        (d / "runs" / "models" / "cli-direct" / "1" / "weights.bin").read_bytes()
        for d in (reference, killed)
    ]
    assert weights[0] == weights[1]
    manifests = [
        json.loads((d / "runs" / "models" / "cli-direct" / "1" / "manifest.json").read_text())
        for d in (reference, killed)
    ]
    assert manifests[0]["metrics"] == manifests[1]["metrics"]
    sha = re.findall(r"weights sha256: ([0-9a-f]{64})", out)
    assert sha == [manifests[1]["weights_sha256"]]

    listing = _ok(_cli("registry", "list", "runs/models", cwd=killed)).splitlines()
    assert listing[2].split()[:4] == ["cli-direct", "1", "1", "keras"]
    shown = _ok(_cli("registry", "show", "runs/models", "cli-direct:1", cwd=killed))
    assert f"sha256 {sha[0]} (verified)" in shown and "factory=toymodels:keras_mlp" in shown


@pytest.mark.slow
def test_equinox_orbax_checkpoints_are_inspected_as_the_adapter_restores_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process (jax is imported once per session): `main` is the console script.
    monkeypatch.chdir(tmp_path)
    sets = [*SMALL, "max_steps=30", "checkpoint.every_n_steps=10", "validate_every_n_steps=10"]
    run = ["run", str(EXAMPLE), "--backend", "equinox", *(x for s in sets for x in ("--set", s))]
    assert main(run) == 0
    assert "done: 30 steps (max_steps)" in capsys.readouterr().out
    ckpt = tmp_path / "runs" / "cli_direct" / "equinox" / "checkpoints"

    assert main(["checkpoint", "inspect", str(ckpt)]) == 0
    text = capsys.readouterr().out
    assert re.findall(r"step +(\d+) +orbax +complete", text) == ["10", "20", "30"]
    assert "latest complete: step 30" in text
    assert "model: toymodels:equinox_mlp(depth=2, in_size=3, out_size=1, width=16)" in text

    # step 30: one array file changed; step 20: never sealed (no digest)
    array = max((ckpt / "30" / "state").rglob("*"), key=lambda p: p.stat().st_size)
    data = array.read_bytes()
    array.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (ckpt / "20" / "pipekit-digest.json").unlink()
    assert main(["checkpoint", "inspect", str(ckpt), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    status = {s["step"]: (s["complete"], s["problem"]) for s in report["steps"]}
    name = array.relative_to(ckpt / "30").as_posix()
    assert status == {
        10: (True, None),
        20: (
            False,
            "it has no pipekit-digest.json (the save was interrupted before it was sealed)",
        ),
        30: (False, f"{name} does not match its SHA-256 digest"),
    }
    assert report["latest_complete"] == 10

    with pytest.warns(TornCheckpointWarning):  # the adapter agrees: it resumes at 10
        assert main(run) == 0
    out = capsys.readouterr().out
    assert "resumed from checkpoint at step 10/30" in out
    assert "done: 30 steps (max_steps, resumed at step 10)" in out


@pytest.mark.slow
def test_preempted_run_exits_75_with_one_line_and_the_same_command_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(HERE))
    preempt = "callbacks=[{type = 'cli_kill:PreemptAt', step = 13, marker = 'preempted-once'}]"
    sets = [*SMALL, "max_steps=30", "checkpoint.every_n_steps=1000", preempt]
    run = ["run", str(EXAMPLE), "--backend", "equinox", *(x for s in sets for x in ("--set", s))]
    assert main(run) == 75
    captured = capsys.readouterr()
    ckpt = tmp_path / "runs" / "cli_direct" / "equinox" / "checkpoints"
    line = f"pipekit-train: preempted: Preempted by SIGTERM at step 13 (checkpoint saved at {ckpt / '13'}"
    assert captured.err.strip().splitlines()[-1].startswith(line), captured.err[-2000:]
    assert "done:" not in captured.out
    assert main(run) == 0  # the same command again
    out = capsys.readouterr().out
    assert "resumed from checkpoint at step 13/30" in out
    assert "done: 30 steps (max_steps, resumed at step 13)" in out
