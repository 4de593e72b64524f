"""How S3 failures are classified and retried: the one retry loop of the S3 backend.

botocore's own retries are switched off (see `s3_client.py`), so this loop is the only one. It also covers
errors raised while reading a response body, since each attempt is a whole request including its read.
Throttling, 5xx, timeouts and connection errors back off per the store's `RetryPolicy`; when attempts run
out, `TransientStoreError` (a rerun later may pass). Any other `ClientError` is permanent and is translated
at once: 412 → `ObjectExistsError`, access problems → `StoreAccessError`, 404 → `MissingObjectError`, the
rest → `StoreRequestError`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError

from compaction.errors import (
    KcompactError,
    MissingObjectError,
    ObjectExistsError,
    StoreAccessError,
    StoreRequestError,
    TransientStoreError,
)
from compaction.storage.base import RetryPolicy

T = TypeVar("T")

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
        "ConditionalRequestConflict",
    }
)
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
TRANSIENT_EXCEPTIONS = (BotoConnectionError, HTTPClientError, IncompleteReadError)
"""Failures below the HTTP answer (connection, truncated body): always worth another attempt."""
_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AuthorizationHeaderMalformed",
        "PermanentRedirect",
        "NoSuchBucket",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def call_with_retry(op: str, uri: str, policy: RetryPolicy, attempt: Callable[[], T]) -> T:
    """Run `attempt` under `policy`; translate what it raises into kcompact errors.

    `op` (GET, PUT, ...) and `uri` name the request in the error. Raises `TransientStoreError` when every
    attempt failed transiently, or the translated error of the first permanent failure.
    """
    for number in range(1, policy.max_attempts + 1):
        try:
            return attempt()
        except ClientError as exc:
            if not is_transient(exc):
                raise translate(op, uri, exc) from exc
            last: Exception = exc
        except TRANSIENT_EXCEPTIONS as exc:
            last = exc
        if number < policy.max_attempts:
            time.sleep(policy.delay_s(number, random.random()))
    raise TransientStoreError(
        f"{uri}: {op} still failing after {policy.max_attempts} attempts ({last}); rerun later"
    ) from last


def status(exc: ClientError) -> int:
    """The HTTP status of a failed request (0 when botocore did not record one)."""
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_transient(exc: ClientError) -> bool:
    """Whether S3 answered with throttling or a server-side failure that another attempt may pass."""
    return _code(exc) in _TRANSIENT_CODES or status(exc) in _TRANSIENT_STATUS


def translate(op: str, uri: str, exc: ClientError) -> KcompactError:
    """The kcompact error for a permanent S3 failure of `op` on the object (or bucket) `uri`."""
    code, http = _code(exc), status(exc)
    message = exc.response.get("Error", {}).get("Message", "")
    if code == "PreconditionFailed" or http == 412:
        return ObjectExistsError(uri)
    if code in _ACCESS_CODES or http in (301, 403):
        hint = " (S3 also answers 403 for a missing key when s3:ListBucket is not granted)" if http == 403 else ""
        return StoreAccessError(
            f"{uri}: {op} refused: {code} (HTTP {http}) {message}{hint}; "
            "check the bucket, region, endpoint and credentials"
        )
    if code in _MISSING_CODES or http == 404:
        return MissingObjectError("object does not exist", obj=uri)
    return StoreRequestError(f"{uri}: {op} failed: {code} (HTTP {http}) {message}")
