"""An S3 API server on loopback (moto) for tests of cloud checkpoints and the registry.

```python
with loopback_s3("pipekit-ckpt") as s3:
    Checkpoint("s3://pipekit-ckpt/run", storage_options=s3.storage_options)
```

Needs the development dependencies `moto[server]`, `boto3` and `s3fs`. While the server
runs, the process environment holds dummy AWS credentials and no proxy settings (both
restored afterwards), so nothing can reach a real AWS account.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoopbackS3", "loopback_s3"]

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_UNSET = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
)


@dataclass
class LoopbackS3:
    """A running loopback S3 server.

    Attributes:
        endpoint: `http://127.0.0.1:<port>`.
        buckets: the buckets created so far.
    """

    endpoint: str
    buckets: list[str] = field(default_factory=list)

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs options that reach this server (`Checkpoint(storage_options=...)`)."""
        return {
            "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }

    def create_bucket(self, name: str) -> str:
        """Create a bucket (S3 names: 3-63 lower-case letters, digits, dots, hyphens)."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(
            Bucket=name
        )
        self.buckets.append(name)
        return name


@contextmanager
def loopback_s3(*buckets: str) -> Iterator[LoopbackS3]:
    """Run a moto S3 server on 127.0.0.1 (a free port) with `buckets` created."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in (*CREDENTIALS, *_UNSET, "NO_PROXY")}
    os.environ.update(CREDENTIALS)
    for k in _UNSET:
        os.environ.pop(k, None)
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = LoopbackS3(endpoint=f"http://{host}:{port}")
        for name in buckets:
            s3.create_bucket(name)
        yield s3
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
