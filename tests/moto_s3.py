"""The moto S3 server the S3 tests share, as a pytest plugin (`tests/conftest.py` loads it) plus its constants.

Fixtures: `moto_endpoint` (one server for the whole session, on a free port of 127.0.0.1, with the test
bucket) and `fake_aws_env` (fake credentials and no AWS config files, so nothing can reach a real account).
Test modules import the constants, `make_bucket` and `fresh_s3_store` from here, never from a conftest.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer

from compaction.storage import ObjectStore, RetryPolicy, StoreSpec
from compaction.storage.base import MiB

BUCKET = "kcompact-test"
REGION = "us-east-1"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/kcompact-test/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/kcompact-test/aws-credentials",
}
UNSET_AWS_ENV = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_ms=1, max_delay_ms=4)
TEST_PART_SIZE = 5 * MiB


_WRITES = threading.Lock()


def _one_at_a_time(handler: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _WRITES:
            return handler(*args, **kwargs)

    locked.__kcompact_atomic__ = True  # type: ignore[attr-defined]
    return locked


def atomic_conditional_writes() -> None:
    """Make the moto server's object writes (PUT; POST, which completes a multipart upload) one at a time, as S3's
    are atomic: moto checks `If-None-Match: *` and then stores the object, and two create-only writes of one key
    from threads of its server could both pass the check under load, each told it created the key. The metadata
    table's commits (a Delta log entry per version) rely on exactly that refusal, as they do on S3."""
    for name in ("_key_response_put", "_key_response_post"):
        handler = getattr(S3Response, name)
        if not getattr(handler, "__kcompact_atomic__", False):
            setattr(S3Response, name, _one_at_a_time(handler))


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server for the whole session, on a free port of 127.0.0.1, with the test bucket; its conditional
    writes are atomic (`atomic_conditional_writes`)."""
    atomic_conditional_writes()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        make_bucket(endpoint, BUCKET)
        yield endpoint
    finally:
        server.stop()


def moto_client(endpoint: str):  # type: ignore[no-untyped-def]
    """A boto3 S3 client of the moto server at `endpoint`, with the fake credentials."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    )


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create `bucket` on the moto server at `endpoint`."""
    client = moto_client(endpoint)
    client.create_bucket(Bucket=bucket)


@pytest.fixture
def fake_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and no AWS config files, so nothing can reach a real account."""
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    for name in UNSET_AWS_ENV:
        monkeypatch.delenv(name, raising=False)


def fresh_s3_store(endpoint: str, name: str = "e2e") -> ObjectStore:
    """A store in a fresh prefix of the test bucket, with fast retries and 5 MiB multipart parts."""
    return StoreSpec.parse(f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint, region=REGION,
                           retry=FAST_RETRY, part_size=TEST_PART_SIZE).open()
