"""The `pipekit-train` command line without a backend: config errors, registry, inspector.

Training through the CLI on the real backends (kill and exact resume on Keras, Orbax
checkpoints on Equinox) is in tests-integration/test_cli.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.cli import load_run_config, main
from pipekit_train.core.cli._build import build_loop
from pipekit_train.core.registry import LocalModelRegistry
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "cli_direct.toml"
SCRIPT = Path(sys.executable).parent / "pipekit-train"

GOOD = """
backend = "equinox"
max_steps = 10
batch_size = 8

[model]
factory = "pipekit_train.{backend}.testing:mlp"
kwargs = { in_size = 4, out_size = 1 }

[data]
factory = "pipekit_train.core.testing:regression_task"
kwargs = { n_train = 32, n_val = 8 }
"""


def _write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_run_config(_write(tmp_path, text), overrides=overrides)
    return str(info.value)


# -- the config file --------------------------------------------------------------------


def test_the_example_config_is_valid_for_every_backend() -> None:
    for backend in ("equinox", "lightning", "keras"):
        config = load_run_config(EXAMPLE, backend=backend)
        assert config.backend == backend
        assert config.model.factory_for(backend).startswith("toymodels:")
        assert config.checkpoint is not None
        assert config.checkpoint.path.parts[-2:] == (backend, "checkpoints")
        assert config.pythonpath == (EXAMPLE.parent.resolve(),)
        assert config.registry == {"uri": "runs/models", "name": "cli-direct"}


def test_set_overrides_parse_toml_values_and_fall_back_to_strings(tmp_path) -> None:
    config = load_run_config(
        _write(tmp_path, GOOD),
        overrides=[
            "max_steps=25",
            "optimizer.name=sgd",
            "optimizer.lr=1e-2",
            "shuffle=false",
            "checkpoint.directory=/tmp/some run/ckpt",
            'metrics=["mae"]',
            "model.kwargs.width=8",
        ],
        backend="keras",
    )
    assert config.backend == "keras"
    assert config.loop["max_steps"] == 25 and config.loop["shuffle"] is False
    assert config.loop["optimizer_config"] == {"name": "sgd", "lr": 0.01}
    assert config.loop["metrics"] == ["mae"]
    assert config.model.kwargs == {"in_size": 4, "out_size": 1, "width": 8}
    assert config.model.factory_for("keras") == "pipekit_train.keras.testing:mlp"
    assert config.checkpoint is not None
    assert str(config.checkpoint.directory) == "/tmp/some run/ckpt"


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        (
            "batchsize = 8\n" + GOOD,
            (),
            r"Unknown key `batchsize`.*Did you mean `batch_size`.*Accepted keys at the top level: \['backend'",
        ),
        (
            GOOD + '\n[checkpoint]\ndirectory = "c"\nevery = 5\n',
            (),
            r"Unknown key `checkpoint.every`.*Did you mean one of `every_n_steps`, `every_n_minutes`.*Received: checkpoint.every=5.*Accepted keys at \[checkpoint\]: \['directory', 'every_n_steps'",
        ),
        (
            GOOD,
            ("batch_size=0",),
            r"`batch_size` must be a positive int. Received: batch_size=0",
        ),
        (
            GOOD,
            ("max_steps=ten",),
            r"`max_steps` must be a positive int. Received: max_steps='ten'",
        ),
        (
            GOOD,
            ("backend=jax",),
            r"`backend` must be an installed backend, one of \['equinox', 'keras', 'lightning', 'numpy', 'torch'\]. Received: backend='jax'",
        ),
        (GOOD.replace('backend = "equinox"', ""), (), r"No backend chosen.*pass --backend"),
        (GOOD.replace("max_steps = 10", ""), (), r"Set `max_steps` or `max_epochs`"),
        (GOOD, ("loss=msee",), r"Unknown `loss` name 'msee'|loss.*msee"),
        (GOOD, ("optimizer.name=adamm",), r"\[optimizer\].*adamm"),
        (
            GOOD,
            ("checkpoint.directory=c", "checkpoint.every_n_steps=0"),
            r"\[checkpoint\] `Checkpoint.every_n_steps` must be a positive int",
        ),
        (
            GOOD,
            ("model.factory={equinox = 'a:b', jax = 'a:b'}",),
            r"Unknown key `model.factory.jax`",
        ),
        (
            GOOD,
            ("writers=[{uri = 'm.jsonl'}]",),
            r"`writers\[0\].type` is required: a built-in writer \(\['csv', 'jsonl', 'mlflow', 'tensorboard', 'wandb'\]\)",
        ),
        (
            GOOD,
            ("callbacks=[{type = 'early_stop'}]",),
            r"`callbacks\[0\].type` must be a built-in callback or a 'module:Class' path. Received: callbacks\[0\].type='early_stop'",
        ),
        (
            GOOD,
            ("data.split=[0.9, 0.3]",),
            r"`data.split` must be two fractions.*Received: data.split=\[0.9, 0.3\]",
        ),
        (
            GOOD,
            ("registry.uri=m", "registry.name=bad name"),
            r"\[registry\] `name` must be 1-128 characters",
        ),
        (GOOD, ("adapter.tf.x=1",), r"Unknown key `adapter.tf`"),
        (GOOD, ("normalizer.keys=[]",), r"`normalizer.keys` must be a list of sample keys"),
        (
            GOOD,
            ("normalizer.keys=['x']", "normalizer.per=channel"),
            r"exactly one of `keys`.*`path`.*`per`",
        ),
        (GOOD, ("normalizer.per=grid",), r"`normalizer.per` must be 'channel' or 'feature'"),
        (
            GOOD,
            ("rollout.step=4",),
            r"Unknown key `rollout.step`.*Did you mean `steps`.*Accepted keys at \[rollout\]: "
            r"\['steps', 'weights', 'backprop', 'noise_std', 'schedule', 'residual', "
            r"'gradient_checkpointing', 'target', 'ref_stepper', 'cut_div_chain', "
            r"'coarse_stepper', 'correction', 'reduction'\]",
        ),
        (GOOD, ("rollout.steps=0",), r"\[rollout\] `steps` must be an int >= 1.*steps=0"),
        (
            GOOD,
            ("rollout.steps=2", "rollout.weights=[1.0]"),
            r"\[rollout\] `weights` needs one loss weight per rollout step",
        ),
        (
            GOOD,
            ("rollout.steps=4", "rollout.schedule={0 = 2, 10 = 1}"),
            r"\[rollout\] `schedule` must be monotone",
        ),
        (
            GOOD,
            ("rollout.steps=4", "rollout.schedule={first = 1}"),
            r"`rollout.schedule` maps the first update.*rollout.schedule.first=1",
        ),
        (
            GOOD,
            ("rollout.steps=4", "rollout.schedule={start = 1, every = 10, maximum = 4}"),
            r"Unknown key `rollout.schedule.every`.*every_n_steps",
        ),
        (GOOD, ("rollout=4",), r"`rollout` must be a table"),
        (GOOD, ("pythonpath=['no-such-dir']",), r"`pythonpath` names a folder that does not exist"),
        (GOOD, ("progress=bars",), r"`progress` must be one of \['auto', 'bar', 'lines', 'none'\]"),
        (GOOD, ("oops",), r"`--set` takes key=value.*Received: --set 'oops'"),
    ],
)
def test_bad_configs_name_the_field_the_value_and_the_fix(tmp_path, text, overrides, expected):
    message = _error(tmp_path, text, *overrides)
    assert re.search(expected, message, flags=re.S), message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]  # nothing written


def test_the_rollout_table_is_a_rollout_spec(tmp_path) -> None:
    from pipekit_train.core import Rollout, RolloutSchedule

    text = GOOD + (
        '\n[rollout]\nsteps = 4\nresidual = true\nbackprop = "last"\n'
        "weights = [1, 1, 2, 2]\ngradient_checkpointing = true\n"
        "schedule = { 0 = 1, 100 = 2, 200 = 4 }\n"
    )
    config = load_run_config(_write(tmp_path, text))
    assert config.loop["rollout"] == Rollout(
        steps=4,
        residual=True,
        backprop="last",
        weights=(1, 1, 2, 2),
        gradient_checkpointing=True,
        schedule={0: 1, 100: 2, 200: 4},
    )
    # the other spellings of a schedule, and --set
    config = load_run_config(
        _write(tmp_path, GOOD),
        overrides=[
            "rollout.steps=3",
            "rollout.backprop=2",
            "rollout.schedule={start = 1, every_n_steps = 50, maximum = 3}",
        ],
    )
    assert config.loop["rollout"] == Rollout(
        steps=3, backprop=2, schedule=RolloutSchedule(start=1, every_n_steps=50, maximum=3)
    )
    config = load_run_config(
        _write(tmp_path, GOOD), overrides=["rollout.steps=2", "rollout.schedule=[[0, 1], [9, 2]]"]
    )
    assert config.loop["rollout"].stages() == ((0, 1), (9, 2))


def test_a_per_backend_factory_table_must_name_the_chosen_backend(tmp_path) -> None:
    text = GOOD.replace(
        'factory = "pipekit_train.{backend}.testing:mlp"',
        'factory = { equinox = "pipekit_train.equinox.testing:mlp" }',
    )
    load_run_config(_write(tmp_path, text))  # equinox: fine
    with pytest.raises(ConfigError, match=r"`model.factory` has no entry for backend 'keras'"):
        load_run_config(_write(tmp_path, text), backend="keras")


def test_bad_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"must be a .toml or .json file"):
        load_run_config(_write(tmp_path, GOOD, "run.yaml"))
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_run_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"does not parse as TOML"):
        load_run_config(_write(tmp_path, "max_steps = = 3"))
    data = {
        "backend": "keras",
        "max_steps": 3,
        "model": {"factory": "a:b"},
        "data": {"factory": "c:d"},
    }
    assert load_run_config(_write(tmp_path, json.dumps(data), "run.json")).backend == "keras"


def test_factory_arguments_are_checked_before_any_dataset_is_built(tmp_path) -> None:
    config = load_run_config(_write(tmp_path, GOOD), overrides=["data.kwargs.n_trian=3"])
    with pytest.raises(
        ConfigError,
        match=r"`data.kwargs` does not fit .*regression_task.*n_trian.*Accepted arguments: \['n_train', 'n_val', 'in_size', 'out_size', 'seed'\]",
    ):
        build_loop(config)
    config = load_run_config(
        _write(tmp_path, GOOD), overrides=["data.factory=pipekit_train.core.testing:no_such_task"]
    )
    with pytest.raises(ConfigError, match=r"`data.factory` names an attribute that does not exist"):
        build_loop(config)


def test_a_backend_whose_adapter_does_not_import_names_what_to_install(
    tmp_path, monkeypatch
) -> None:
    from pipekit_train.core.adapter import BackendEntry
    from pipekit_train.core.contract import _backends

    broken = BackendEntry(
        name="keras",
        adapter="pipekit_train.not_installed:Adapter",
        model_op="pipekit_train.core.testing:NumpyLinearOp",
        install="pip install pipekit-train-keras",
    )
    monkeypatch.setattr(_backends, "_load", lambda name: (broken, "pipekit-train-keras"))
    config = load_run_config(_write(tmp_path, GOOD), backend="keras")
    with pytest.raises(
        ConfigError,
        match=r"--backend keras needs pipekit_train.not_installed, which cannot be imported.*Install it with `pip install pipekit-train-keras`",
    ):
        build_loop(config)


def test_main_reports_a_config_error_with_exit_status_2(tmp_path, capsys) -> None:
    path = _write(tmp_path, GOOD + '\n[checkpoint]\ndirectory = "ckpt"\n')
    assert main(["run", str(path), "--set", "batch_size=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipekit-train: error: `batch_size` must be a positive int")
    assert not (tmp_path / "ckpt").exists()


# -- registry list / show ---------------------------------------------------------------


@pytest.fixture
def registry(tmp_path):
    reg = LocalModelRegistry(tmp_path / "models")
    for seed in (1, 2):
        op = NumpyLinearOp("pipekit_train.core.testing:linear", seed=seed, in_size=3, out_size=1)
        reg.register("emulator", op, metrics={"val_loss": 0.5 / seed, "loss": 0.25})
    reg.register("other", NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=2))
    return reg


def test_registry_list_and_show(registry, capsys) -> None:
    assert main(["registry", "list", registry.uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("2 model(s)")
    assert lines[1].split() == ["name", "versions", "latest", "backend", "created", "metrics"]
    assert lines[2].split()[:4] == ["emulator", "1,2", "2", "numpy"]
    assert "val_loss=0.25" in lines[2]
    assert lines[3].split()[:4] == ["other", "1", "1", "numpy"]

    assert main(["registry", "list", registry.uri, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["versions"], m["latest"]) for m in listed["models"]] == [
        ("emulator", [1, 2], 2),
        ("other", [1], 1),
    ]

    assert main(["registry", "show", registry.uri, "emulator:1"]) == 0
    out = capsys.readouterr().out
    record = registry.record("emulator", 1)
    assert out.splitlines()[0].startswith("emulator version 1")
    assert f"sha256 {record.weights_sha256} (verified)" in out
    assert "factory=pipekit_train.core.testing:linear" in out and "val_loss=0.5" in out

    assert main(["registry", "show", registry.uri, "emulator", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 2 and shown["weights_check"] == "verified"
    assert shown["record_sha256"] == registry.record("emulator").record_sha256


def test_registry_show_reports_damage(registry, capsys) -> None:
    version = Path(registry.root) / "emulator" / "2"
    weights = version / "weights.bin"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert main(["registry", "show", registry.uri, "emulator:2"]) == 1
    assert "MISMATCH" in capsys.readouterr().out

    manifest = json.loads((version / "manifest.json").read_text())
    manifest["metrics"]["val_loss"] = 0.0
    (version / "manifest.json").write_text(json.dumps(manifest))
    assert main(["registry", "show", registry.uri, "emulator:2"]) == 1
    assert "IntegrityError" in capsys.readouterr().err
    assert main(["registry", "list", registry.uri]) == 0
    assert "DAMAGED" in capsys.readouterr().out


def test_registry_commands_refuse_bad_input(tmp_path, registry, capsys) -> None:
    missing = tmp_path / "nowhere"
    assert main(["registry", "list", str(missing)]) == 2
    assert "There is no model registry" in capsys.readouterr().err
    assert not missing.exists()
    assert main(["registry", "show", registry.uri, "emulator:0"]) == 2
    assert "NAME:VERSION" in capsys.readouterr().err
    assert main(["registry", "show", registry.uri, "emulator:7"]) == 2
    assert "Available versions: [1, 2]" in capsys.readouterr().err


# -- checkpoint inspect (directory store) -----------------------------------------------


def test_checkpoint_inspect_verifies_the_directory_store(tmp_path, capsys) -> None:
    train, val = regression_task(n_train=32, n_val=8, in_size=2)
    ckpt = tmp_path / "ckpt"
    TrainingLoop(
        NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
        train,
        val,
        optimizer_config={"name": "sgd", "lr": 0.1},
        batch_size=8,
        max_steps=12,
        validate_every_n_steps=4,
        checkpoint=Checkpoint(ckpt, every_n_steps=4, max_to_keep=None),
        adapter=NumpyAdapter(),
    ).run()
    report = json.loads(_inspect(ckpt, capsys))
    assert [(s["step"], s["engine"], s["complete"]) for s in report["steps"]] == [
        (4, "directory", True),
        (8, "directory", True),
        (12, "directory", True),
    ]
    last = report["steps"][-1]
    assert last["epoch"] == 3 and set(last["metrics"]) >= {"loss", "val_loss"}
    assert last["resume_key"]["backend"] == "numpy" and last["resume_key"]["batch_size"] == 8
    assert report["latest_complete"] == 12

    # damage: a changed blob, a missing manifest, an interrupted write
    blob = next(p for p in (ckpt / "12").iterdir() if p.name not in ("MANIFEST.json", "meta.json"))
    data = blob.read_bytes()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (ckpt / "8" / "MANIFEST.json").unlink()
    shutil.copytree(ckpt / "4", ckpt / ".tmp-16-deadbeef")
    assert main(["checkpoint", "inspect", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert f"{blob.name} does not match its SHA-256" in out
    assert "no MANIFEST.json (an interrupted write)" in out
    assert "interrupted write: .tmp-16-deadbeef" in out
    assert "latest complete: step 4" in out and "backend: numpy" in out

    (ckpt / "4" / "meta.json").write_text("{}")  # no longer matches its manifest
    assert main(["checkpoint", "inspect", str(ckpt)]) == 1  # nothing complete is left
    assert "no complete checkpoint" in capsys.readouterr().out
    assert main(["checkpoint", "inspect", str(tmp_path / "none")]) == 2


def _inspect(ckpt: Path, capsys) -> str:
    assert main(["checkpoint", "inspect", str(ckpt), "--json"]) == 0
    return capsys.readouterr().out


# -- the installed console script --------------------------------------------------------


def test_console_script_and_module_run_without_importing_a_backend(tmp_path) -> None:
    reg = LocalModelRegistry(tmp_path / "models")
    reg.register("m", NumpyLinearOp("pipekit_train.core.testing:linear", in_size=1, out_size=1))
    proc = subprocess.run(
        [str(SCRIPT), "registry", "list", str(tmp_path / "models"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["models"][0]["name"] == "m"
    code = (
        "import sys, json\n"
        "from pipekit_train.core.cli import _build, _config, _inspect, _main, _registry_cmd, _run\n"
        "sys.argv = ['pipekit-train', '--version']\n"
        "status = _main.main()\n"
        "banned = ('jax', 'torch', 'keras', 'equinox', 'lightning', 'tensorflow', 'optax', 'orbax')\n"
        "print(json.dumps([status, sorted(m for m in banned if m in sys.modules)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("pipekit-train 0.")
    assert json.loads(proc.stdout.splitlines()[-1]) == [0, []]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipekit_train.core.cli",
            "checkpoint",
            "inspect",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "There is no checkpoint folder" in proc.stderr


# -- errors in CLI terms ------------------------------------------------------------------

NUMPY_RUN = """
backend = "numpy"
max_steps = 6
batch_size = 8
progress = "none"

[optimizer]
name = "sgd"
lr = 0.05

[model]
factory = "pipekit_train.core.testing._numpy_model:linear"
kwargs = { in_size = 4, out_size = 1 }

[data]
factory = "pipekit_train.core.testing:regression_task"
kwargs = { n_train = 32, n_val = 8 }

[checkpoint]
directory = "ckpt"
every_n_steps = 3
async_save = false

[registry]
uri = "models"
name = "lin"
"""


def _no_python(text: str) -> None:
    for python in ("Checkpoint(", " resume='", "version='", "TrainingLoop("):
        assert python not in text, text


def test_a_changed_plan_is_refused_with_cli_fixes(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, NUMPY_RUN)
    assert main(["run", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--set", "optimizer.lr=0.01"]) == 1
    err = capsys.readouterr().err
    assert "was written by a different plan" in err
    assert "--set checkpoint.directory=<new folder>" in err
    assert "--set checkpoint.resume=never" in err
    _no_python(err)

    assert main(["run", str(path), "--set", "checkpoint.resume=never"]) == 2
    err = capsys.readouterr().err
    assert '`checkpoint.resume = "never"` but' in err
    assert "--set checkpoint.resume=auto" in err
    _no_python(err)


def test_registry_show_of_a_missing_version_names_the_cli_spelling(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(_write(tmp_path, NUMPY_RUN))]) == 0
    capsys.readouterr()
    assert main(["registry", "show", "models", "lin:9"]) == 2
    err = capsys.readouterr().err
    assert (
        "Model 'lin' has no complete version 9. Received: 'lin:9'. Available versions: [1]" in err
    )
    assert "pipekit-train registry show models lin:1" in err and "lin:latest" in err
    _no_python(err)
    assert main(["registry", "show", "models", "lin:latest"]) == 0


def test_checkpoint_inspect_prints_the_resume_key_in_the_plan_order(
    tmp_path, capsys, monkeypatch
) -> None:
    from pipekit_train.core.cli._inspect import ordered_resume_key
    from pipekit_train.core.spec._plan import RESUME_KEY_FIELDS

    monkeypatch.chdir(tmp_path)
    assert main(["run", str(_write(tmp_path, NUMPY_RUN))]) == 0
    capsys.readouterr()
    assert main(["checkpoint", "inspect", "ckpt"]) == 0
    out = capsys.readouterr().out
    printed = re.findall(r"^    (\w+): ", out, flags=re.M)
    assert printed == list(RESUME_KEY_FIELDS)
    assert 'checkpoint.resume = "auto"' in out
    _no_python(out)
    # an engine that stores sorted (or shuffled) keys reads back in the same order
    key = {k: i for i, k in enumerate(RESUME_KEY_FIELDS)}
    for stored in (dict(sorted(key.items())), dict(reversed(key.items())), {**key, "zz": 1}):
        assert list(ordered_resume_key(stored))[: len(key)] == list(RESUME_KEY_FIELDS)


def test_a_factory_that_does_not_import_names_the_pythonpath_key(tmp_path) -> None:
    text = GOOD.replace('backend = "equinox"', 'backend = "numpy"').replace(
        "pipekit_train.{backend}.testing:mlp", "pk_missing_models:mlp"
    )
    config = load_run_config(_write(tmp_path, text))
    with pytest.raises(ConfigError) as info:
        build_loop(config)
    message = str(info.value)
    assert (
        "`model.factory` names a module that cannot be imported: No module named 'pk_missing_models'"
        in message
    )
    assert "Received: model.factory='pk_missing_models:mlp', pythonpath=[]" in message
    assert "the config's `pythonpath` key" in message and 'pythonpath = ["."]' in message


def test_nested_keys_get_a_did_you_mean(tmp_path) -> None:
    text = GOOD + '\n[checkpoint]\ndirectory = "c"\n'
    message = _error(tmp_path, text, "checkpoint.every=500")
    assert "Unknown key `checkpoint.every`" in message
    assert "Did you mean one of `every_n_steps`, `every_n_minutes`?" in message
    message = _error(tmp_path, GOOD, "max_step=5")
    assert "Did you mean `max_steps`" in message


def test_model_kwargs_do_not_offer_what_the_operator_supplies(tmp_path) -> None:
    pytest.importorskip("equinox")
    config = load_run_config(_write(tmp_path, GOOD), overrides=["model.kwargs.widht=8"])
    with pytest.raises(ConfigError) as info:
        build_loop(config)
    message = str(info.value)
    assert "Accepted arguments: ['in_size', 'out_size', 'width'" in message
    assert "'key'" not in message.split("Accepted arguments:")[1]
    config = load_run_config(_write(tmp_path, GOOD), overrides=["model.kwargs.key=1"])
    with pytest.raises(
        ConfigError,
        match=r"`model.kwargs.key` is passed to the factory by the equinox model operator \(EquinoxModelOp\)",
    ):
        build_loop(config)
