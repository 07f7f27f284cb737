"""`MlflowWriter` against a real local MLflow store (sqlite)."""

from __future__ import annotations

import json

import pytest

from pipekit_train.core._errors import ConfigError


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")
def test_mlflow_writer_logs_batches_and_resumes(tmp_path):
    pytest.importorskip("mlflow")
    from pipekit_train.core.writers import AsyncWriter, MlflowWriter

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    w = MlflowWriter(
        tracking_uri=uri,
        experiment_name="pipekit-test",
        run_name="run-1",
        params={"lr": 0.01, "model": "mlp", "layers": [2, 3]},
    )
    for step in range(1, 1201):  # > 1000 metrics: several log_batch calls
        w.write(step, {"loss": 1.0 / step})
    w.write(1200, {"val_loss": 0.5})
    w.flush()
    saved = json.loads(json.dumps(w.state_dict()))
    run_id = w.run_id
    assert saved == {"run_id": run_id}
    w.close()

    client = w.client
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 1201))
    assert {m.step: m.value for m in history}[4] == pytest.approx(0.25)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val_loss")] == [
        (1200, 0.5)
    ]
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.01", "model": "mlp", "layers": "[2, 3]"}
    assert run.info.run_name == "run-1" and run.info.status == "FINISHED"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "pipekit-test"

    # resume into the same run through AsyncWriter's state forwarding
    resumed = AsyncWriter(MlflowWriter(tracking_uri=uri, experiment_name="pipekit-test"))
    resumed.load_state_dict(saved)
    resumed.write(1201, {"loss": 0.001})
    resumed.close()
    assert len(client.get_metric_history(run_id, "loss")) == 1201
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_mlflow_writer_bad_arguments():
    pytest.importorskip("mlflow")
    from pipekit_train.core.writers import MlflowWriter

    with pytest.raises(ConfigError, match="`experiment_name`"):
        MlflowWriter(experiment_name="")
    with pytest.raises(ConfigError, match="`params` must be a dict"):
        MlflowWriter(params=[("lr", 1)])
