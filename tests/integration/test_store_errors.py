"""Errors an orchestrator can act on: a store that a rerun can never reach is exit 2 naming what to fix, in plain
text; one that may come back is exit 4. The CLI runs in process (`compaction.cli.main`), against the moto server,
the flaky proxy in front of it (a 403 on every request plays refused credentials), a host that does not resolve
and a port where nothing listens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compaction.cli import main
from compaction.errors import ExitCode, StoreAccessError, TransientStoreError, plain_text
from compaction.metadata import table_in_store
from compaction.storage import open_store
from tests.kafka_runtime import free_port
from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, UNSET_AWS_ENV
from tests.s3_proxy import FlakyProxy, running_proxy

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def refusing_proxy(moto_endpoint: str) -> Iterator[FlakyProxy]:
    """Every request answered 403 AccessDenied, as S3 does for credentials it refuses."""
    for proxy in running_proxy(moto_endpoint):
        proxy.fault = lambda method, path, seen: (403, "AccessDenied")
        yield proxy


def segments(store: str, endpoint: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["segments", "--store", store, "--endpoint-url", endpoint, "--topic", "t", "--partition", "0"])
    return code, capsys.readouterr().err


def assert_plain(err: str) -> None:
    assert "\x1b" not in err, f"ANSI escapes in {err!r}"
    assert len(err.strip().splitlines()) == 1, f"not one line: {err!r}"


def test_a_missing_bucket_is_exit_2_naming_it(moto_endpoint: str, fake_aws_env: None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):  # a rerun gives the same answer: nothing transient about it
        code, err = segments("s3://no-such-bucket/y", moto_endpoint, capsys)
        assert code == ExitCode.CONFIG, err
        assert "bucket 'no-such-bucket' does not exist" in err and moto_endpoint in err
        assert_plain(err)


def test_the_api_raises_the_same_configuration_error(moto_endpoint: str, fake_aws_env: None) -> None:
    store = open_store("s3://no-such-bucket/y", endpoint_url=moto_endpoint)
    with pytest.raises(StoreAccessError, match="bucket 'no-such-bucket' does not exist"):
        table_in_store(store)


def test_refused_credentials_are_exit_2(refusing_proxy: FlakyProxy, fake_aws_env: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = segments(f"s3://{BUCKET}/refused", refusing_proxy.endpoint, capsys)
    assert code == ExitCode.CONFIG, err
    assert "refused (HTTP 403)" in err and "credentials" in err
    assert_plain(err)


def test_an_endpoint_whose_host_does_not_resolve_is_exit_2(fake_aws_env: None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, err = segments(f"s3://{BUCKET}/y", "http://no-such-host.invalid:9000", capsys)
    assert code == ExitCode.CONFIG, err
    assert "'no-such-host.invalid' does not resolve" in err and "--endpoint-url" in err
    assert_plain(err)


def test_nothing_listening_may_pass_later_so_it_is_exit_4_in_plain_text(fake_aws_env: None,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = segments(f"s3://{BUCKET}/y", f"http://127.0.0.1:{free_port()}", capsys)
    assert code == ExitCode.RETRYABLE, err
    assert "TransientStoreError" in err and "Connection refused" in err
    assert_plain(err)


def test_no_credentials_is_exit_2(moto_endpoint: str) -> None:
    """In a fresh process: boto3 caches the credentials it found in a process's shared session."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET_AWS_ENV and not k.startswith("AWS_")}
    env.update({k: v for k, v in FAKE_AWS_ENV.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    done = subprocess.run([sys.executable, "-m", "compaction.cli", "segments", "--store", "s3://no-creds/y",
                           "--endpoint-url", moto_endpoint, "--topic", "t", "--partition", "0"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == ExitCode.CONFIG, done.stderr
    assert "no AWS credentials found" in done.stderr
    assert_plain(done.stderr)


def test_plain_text_flattens_a_delta_rs_error_chain() -> None:
    chain = ("Kernel error -> Generic S3 error\n          \x1b[31m↳\x1b[0m Error performing list request\n"
             "           \x1b[31m↳\x1b[0m 404 Not Found")
    flat = "Kernel error -> Generic S3 error: Error performing list request: 404 Not Found"
    assert plain_text(TransientStoreError(chain)) == flat
    assert plain_text(ValueError("x" * 50), limit=10) == "x" * 9 + "…"
