"""Fixtures for the storage contract: one store per backend (S3 on the moto server of `tests/moto_s3.py`)."""

from __future__ import annotations

import uuid

import pytest

from compaction.storage import ObjectStore, StoreSpec
from tests.moto_s3 import BUCKET, FAST_RETRY, REGION, TEST_PART_SIZE


@pytest.fixture
def s3_spec(moto_endpoint: str, fake_aws_env: None) -> StoreSpec:
    """A spec for a fresh prefix of the test bucket, with fast retries and 5 MiB multipart parts."""
    return StoreSpec.parse(
        f"s3://{BUCKET}/run-{uuid.uuid4().hex[:12]}/store",
        endpoint_url=moto_endpoint,
        region=REGION,
        retry=FAST_RETRY,
        part_size=TEST_PART_SIZE,
    )


@pytest.fixture
def s3_store(s3_spec: StoreSpec) -> ObjectStore:
    """An S3 store on moto, in its own prefix."""
    return s3_spec.open()


@pytest.fixture
def local_store(tmp_path_factory: pytest.TempPathFactory) -> ObjectStore:
    """A local store in a fresh directory that does not exist yet (created on the first write)."""
    spec = StoreSpec.parse(str(tmp_path_factory.mktemp("local") / "store"), part_size=TEST_PART_SIZE)
    return spec.open()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """Each backend in turn: the contract tests run once per backend."""
    fixture: ObjectStore = request.getfixturevalue(f"{request.param}_store")
    return fixture
