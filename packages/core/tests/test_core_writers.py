"""Metric writers: memory, JSONL/CSV on local and memory:// URIs, TensorBoard, async."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
import threading
import time
import uuid

import fsspec
import pytest

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.writers import (
    AsyncWriter,
    CsvWriter,
    JsonlWriter,
    MemoryWriter,
    TensorBoardWriter,
    check_writer,
)

# --------------------------------------------------------------------------- memory


def test_memory_writer_records_series_and_state():
    w = MemoryWriter()
    w.write(1, {"loss": 1.0})
    w.write(2, {"loss": 0.5, "lr": 0.1})
    w.write(2, {"val_loss": 0.7})
    assert w.records == [(1, {"loss": 1.0}), (2, {"loss": 0.5, "lr": 0.1}), (2, {"val_loss": 0.7})]
    assert w.series("loss") == ([1, 2], [1.0, 0.5])
    assert w.series("val_loss") == ([2], [0.7])
    assert w.names() == ["loss", "lr", "val_loss"]
    with pytest.raises(ConfigError, match=r"Received: name='acc'. Known names: \['loss'"):
        w.series("acc")
    again = MemoryWriter()
    again.load_state_dict(json.loads(json.dumps(w.state_dict())))
    assert again.records == w.records


# --------------------------------------------------------------------------- files


def _read(uri):
    with fsspec.open(uri, "rt") as f:
        return f.read()


@pytest.fixture(params=["local", "memory"])
def base_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "logs")
    return f"memory://test-core-writers-{uuid.uuid4().hex}"


def test_jsonl_writer_lines_flush_and_append(base_uri):
    uri = f"{base_uri}/sub/metrics.jsonl"
    w = JsonlWriter(uri, flush_every=2)
    w.write(1, {"loss": 1.0})
    assert not fsspec.core.url_to_fs(uri)[0].exists(fsspec.core.url_to_fs(uri)[1])  # buffered
    w.write(2, {"loss": float("nan"), "lr": 0.1})  # flush_every reached
    assert len(_read(uri).splitlines()) == 2
    w.write(3, {"val_loss": 0.25})
    w.close()
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        w.write(4, {"loss": 1.0})
    # a resumed run appends
    w2 = JsonlWriter(uri)
    w2.write(4, {"loss": 0.125})
    w2.flush()
    rows = [json.loads(line) for line in _read(uri).splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert math.isnan(rows[1]["loss"]) and rows[1]["lr"] == 0.1
    assert rows[2] == {"step": 3, "val_loss": 0.25}


def test_csv_writer_new_keys_rewrite_header(base_uri):
    uri = f"{base_uri}/metrics.csv"
    w = CsvWriter(uri)
    w.write(1, {"loss": 1.0})
    w.write(2, {"loss": 0.5})
    w.flush()
    assert _read(uri).splitlines() == ["step,loss", "1,1.0", "2,0.5"]
    w.write(2, {"val_loss": 0.75})  # same step, disjoint keys: same row only while buffered
    w.write(3, {"loss": 0.25, "lr": 0.01})
    w.write(3, {"val_loss": float("inf")})  # merged into the step-3 row
    w.close()
    rows = list(csv.DictReader(io.StringIO(_read(uri))))
    assert list(rows[0]) == ["step", "loss", "val_loss", "lr"]
    assert [(r["step"], r["loss"], r["val_loss"], r["lr"]) for r in rows] == [
        ("1", "1.0", "", ""),
        ("2", "0.5", "", ""),
        ("2", "", "0.75", ""),
        ("3", "0.25", "inf", "0.01"),
    ]
    # resume: append with the existing header, widen it once for a new key
    w2 = CsvWriter(uri)
    w2.write(4, {"loss": 0.125})
    w2.flush()
    assert _read(uri).splitlines()[-1] == "4,0.125,,"
    w2.write(5, {"grad_norm": 2.0})
    w2.close()
    rows = list(csv.DictReader(io.StringIO(_read(uri))))
    assert list(rows[0]) == ["step", "loss", "val_loss", "lr", "grad_norm"]
    assert len(rows) == 6 and rows[-1]["grad_norm"] == "2.0" and rows[0]["grad_norm"] == ""
    assert float(rows[3]["val_loss"]) == math.inf


def test_file_writer_errors(tmp_path):
    with pytest.raises(ConfigError, match="`uri` must be"):
        JsonlWriter("")
    with pytest.raises(ConfigError, match="`flush_every`"):
        CsvWriter(tmp_path / "m.csv", flush_every=0)
    w = JsonlWriter(tmp_path / "m.jsonl")
    with pytest.raises(ConfigError, match="may not be named 'step'"):
        w.write(1, {"step": 1.0})


def test_check_writer():
    assert isinstance(check_writer(MemoryWriter()), MemoryWriter)
    with pytest.raises(ConfigError, match=r"lacks \['flush', 'close'\]"):
        check_writer(type("W", (), {"write": lambda self, s, m: None})())


# --------------------------------------------------------------------------- tensorboard


def test_tensorboard_writer_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    w = TensorBoardWriter(logdir)
    for step in range(1, 6):
        w.write(step, {"loss": 1.0 / step, "lr": 0.1})
    w.write(5, {"val_loss": 0.3})
    w.flush()
    w.close()
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "lr", "val_loss"}
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2], rel=1e-6)
    assert [(e.step, e.value) for e in acc.Scalars("val_loss")] == [(5, pytest.approx(0.3))]


# --------------------------------------------------------------------------- async


class RecordingWriter:
    def __init__(self, delay=0.0, fail_on_step=None, gate=None):
        self.records = []
        self.thread_names = set()
        self.flushes = 0
        self.closed = False
        self.delay = delay
        self.fail_on_step = fail_on_step
        self.gate = gate

    def write(self, step, metrics):
        if self.gate is not None:
            self.gate.wait()
        if self.delay:
            time.sleep(self.delay)
        self.thread_names.add(threading.current_thread().name)
        if step == self.fail_on_step:
            raise OSError(f"disk full at step {step}")
        self.records.append((step, dict(metrics)))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True

    def state_dict(self):
        return {"n": len(self.records)}


class DeviceScalar:
    """Stands in for a device scalar: `float()` is the host transfer."""

    def __init__(self, value):
        self.value = value
        self.converted_in = None

    def __float__(self):
        self.converted_in = threading.current_thread().name
        return float(self.value)


def test_async_writer_keeps_order_and_converts_in_thread():
    inner = RecordingWriter()
    w = AsyncWriter(inner, max_queue=8)
    scalars = [DeviceScalar(i / 10) for i in range(100)]
    for i, s in enumerate(scalars):
        w.write(i, {"loss": s})
    w.flush()
    assert [step for step, _ in inner.records] == list(range(100))
    assert [m["loss"] for _, m in inner.records] == [i / 10 for i in range(100)]
    assert all(type(m["loss"]) is float for _, m in inner.records)
    main = threading.current_thread().name
    assert all(s.converted_in not in (None, main) for s in scalars)
    assert main not in inner.thread_names
    assert inner.flushes == 1
    assert w.state_dict() == {"n": 100}
    w.close()
    assert inner.closed


def test_async_writer_back_pressure_blocks_when_full():
    gate = threading.Event()
    inner = RecordingWriter(gate=gate)
    w = AsyncWriter(inner, max_queue=2)
    done = []

    def produce():
        for i in range(5):
            w.write(i, {"loss": float(i)})
            done.append(i)

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(0.3)
    # one record held by the blocked worker, two in the queue, the 4th put blocks
    assert done == [0, 1, 2] and t.is_alive()
    gate.set()
    t.join(timeout=5)
    assert done == [0, 1, 2, 3, 4]
    w.close()
    assert [s for s, _ in inner.records] == [0, 1, 2, 3, 4]


def test_async_writer_drains_on_close():
    inner = RecordingWriter(delay=0.002)
    w = AsyncWriter(inner, max_queue=1000)
    start = time.perf_counter()
    for i in range(50):
        w.write(i, {"loss": 1.0})
    assert time.perf_counter() - start < 0.05  # the caller did not wait for the slow writer
    w.close()
    assert len(inner.records) == 50 and inner.closed
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        w.write(51, {"loss": 1.0})


def test_async_writer_surfaces_thread_exception():
    inner = RecordingWriter(fail_on_step=3)
    w = AsyncWriter(inner)
    for i in range(5):
        w.write(i, {"loss": 1.0})
    with pytest.raises(OSError, match="disk full at step 3"):
        w.flush()
    assert [s for s, _ in inner.records] == [0, 1, 2, 4]  # later records still written
    w.write(5, {"loss": 1.0})  # raised once
    w.close()
    # an error during the last writes surfaces in close()
    inner2 = RecordingWriter(fail_on_step=0)
    w2 = AsyncWriter(inner2)
    w2.write(0, {"loss": 1.0})
    with pytest.raises(OSError):
        w2.close()
    assert inner2.closed
    # and on the next write
    inner3 = RecordingWriter(fail_on_step=0)
    w3 = AsyncWriter(inner3)
    w3.write(0, {"loss": 1.0})
    deadline = time.time() + 5
    while w3._error is None and time.time() < deadline:
        time.sleep(0.01)
    with pytest.raises(OSError):
        w3.write(1, {"loss": 1.0})
    w3.close()


def test_async_writer_errors():
    with pytest.raises(ConfigError, match="`writer` holds an object that is not a metric writer"):
        AsyncWriter(object())
    with pytest.raises(ConfigError, match="`max_queue`"):
        AsyncWriter(MemoryWriter(), max_queue=0)


# --------------------------------------------------------------------------- import hygiene


def test_subpackages_import_no_backend_and_no_heavy_optional_deps():
    code = (
        "import sys\n"
        "import pipekit_train.core.losses, pipekit_train.core.metrics\n"
        "import pipekit_train.core.callbacks, pipekit_train.core.writers\n"
        "banned = {'jax', 'jaxlib', 'torch', 'keras', 'equinox', 'lightning', 'tensorflow',\n"
        "          'optax', 'orbax', 'mlflow', 'tensorboard', 'rich', 'tqdm'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & banned))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tensorboard_writer_never_imports_tensorflow(tmp_path):
    """Even with a (fake) TensorFlow importable, the writer must not import it."""
    pytest.importorskip("tensorboard")
    fake = tmp_path / "site"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("raise RuntimeError('tensorflow imported')\n")
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(fake)!r})\n"
        "from pipekit_train.core.writers import TensorBoardWriter\n"
        f"w = TensorBoardWriter({str(tmp_path / 'tb')!r})\n"
        "w.write(1, {'loss': 1.0}); w.close()\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
