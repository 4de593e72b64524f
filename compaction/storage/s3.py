"""The S3 backend, over boto3: any store that speaks the S3 API and enforces conditional PUT.

Endpoint, region and credentials come from the `StoreSpec` or, when unset there, from boto3's usual
resolution (environment such as `AWS_ENDPOINT_URL`, config files, instance roles). The client is made on
first use, so a store is cheap to open and every Spark executor opens its own.

Create-only writes send `If-None-Match: *` (PutObject, and CompleteMultipartUpload for files above
`spec.part_size`); S3 answers 412 if the key exists, which becomes `ObjectExistsError`. Since a store
that ignored the header would silently overwrite, each `S3Store` runs `probe_conditional_put` once,
before its first write, and refuses to write (`ConfigError`) if the store does not enforce it.

Retries are ours alone (botocore's are switched off): one layer that also covers errors while reading a
response body, and that counts every attempt in `stats`. Throttling, 5xx, timeouts and connection
errors back off per `spec.retry`; when attempts run out, `TransientStoreError`. A write retried after an
ambiguous failure that then finds the key taken checks the ETag: if the object holds exactly our bytes,
the earlier attempt landed and the write succeeded.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
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
from compaction.storage.base import (
    TEMP_PREFIX,
    MiB,
    ObjectInfo,
    ObjectStore,
    StoreSpec,
    check_key,
    check_prefix,
    check_range,
)

if TYPE_CHECKING:
    from os import PathLike

T = TypeVar("T")

_MAX_PARTS = 10_000
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
_TRANSIENT_EXCEPTIONS = (BotoConnectionError, HTTPClientError, IncompleteReadError)
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
_REFRESHING_CREDENTIAL_METHODS = frozenset({"iam-role", "container-role"})


class S3Store(ObjectStore):
    """The `s3://bucket/prefix` backend. See `compaction.storage.base` for the contract."""

    def __init__(self, spec: StoreSpec) -> None:
        if spec.scheme != "s3":
            raise ValueError(f"S3Store needs an s3:// spec, got {spec.uri!r}")
        super().__init__(spec)
        bucket, _, prefix = spec.uri[len("s3://") :].partition("/")
        self._bucket = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._lock = threading.RLock()
        self._client: Any = None
        self._bucket_checked = False
        self._conditional_put_checked = False
        self._probing = False

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket

    @property
    def client(self) -> Any:
        """The boto3 S3 client, created on first use."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = _new_client(self.spec)
        return self._client

    def put(self, key: str, data: bytes) -> None:
        self._ensure_conditional_put()
        uri, full = self.object_uri(key), self._prefix + key
        etag = f'"{_md5(data).hexdigest()}"'
        self._create(uri, full, etag, partial(self._put_object, full, data))
        self._count(bytes_written=len(data))

    def put_file(self, key: str, path: str | PathLike[str]) -> None:
        size = os.path.getsize(path)
        if size <= self.spec.part_size:
            self.put(key, Path(path).read_bytes())
            return
        self._ensure_conditional_put()
        if self.exists(key):  # refuse before uploading parts for nothing
            raise ObjectExistsError(self.object_uri(key))
        self._put_multipart(key, path, size)
        self._count(bytes_written=size)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        if end == start:
            self.size(key)  # an empty range still needs the object to exist
            return b""
        request: dict[str, Any] = {"Bucket": self._bucket, "Key": self._prefix + check_key(key)}
        if start or end is not None:
            request["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        data = self._call("GET", self.object_uri(key), partial(self._get_bytes, request))
        self._count(bytes_read=len(data))
        return data

    def get_to_file(self, key: str, path: str | PathLike[str]) -> int:
        dest = Path(path)
        tmp = dest.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            size = self._call("GET", self.object_uri(key), partial(self._download, self._prefix + key, tmp))
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        self._count(bytes_read=size)
        return size

    def size(self, key: str) -> int:
        uri = self.object_uri(key)
        try:
            return int(self._call("HEAD", uri, partial(self._head, self._prefix + key))["ContentLength"])
        except MissingObjectError:
            self._check_bucket()  # HEAD answers a bare 404 for a missing bucket too
            raise

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except MissingObjectError:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        request: dict[str, Any] = {"Bucket": self._bucket, "Prefix": self._prefix + check_prefix(prefix)}
        where = f"{self.uri}/{prefix}"
        while True:
            page = self._call("LIST", where, partial(self._list_page, dict(request)))
            for obj in page.get("Contents", ()):
                mtime_ms = int(obj["LastModified"].timestamp() * 1000)
                yield ObjectInfo(obj["Key"][len(self._prefix) :], int(obj["Size"]), mtime_ms)
            if not page.get("IsTruncated"):
                return
            request["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        full = self._prefix + check_key(key)
        self._call("DELETE", self.object_uri(key), partial(self._delete_object, full))

    def delta_uri(self, name: str) -> str:
        return f"s3://{self._bucket}/{self._prefix}{check_key(name)}"

    def delta_storage_options(self) -> dict[str, str]:
        """Region, endpoint (when not AWS's own) and static credentials, as delta-rs names them.

        Credentials that boto3 refreshes from an instance or container role are left out: delta-rs
        fetches and refreshes those itself. The result may hold secrets; do not log it.
        """
        client = self.client
        options = {"AWS_REGION": self.spec.region or client.meta.region_name or "us-east-1"}
        endpoint = self.spec.endpoint_url or client.meta.endpoint_url
        host = urlsplit(endpoint).hostname or ""
        if self.spec.endpoint_url or not host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
            options["AWS_ENDPOINT_URL"] = endpoint
            if endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        credentials = _credentials()
        if credentials is not None and credentials.method not in _REFRESHING_CREDENTIAL_METHODS:
            frozen = credentials.get_frozen_credentials()
            options["AWS_ACCESS_KEY_ID"] = frozen.access_key
            options["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key
            if frozen.token:
                options["AWS_SESSION_TOKEN"] = frozen.token
        return options

    def probe_conditional_put(self) -> None:
        with self._lock:
            self._probing = True  # the probe's own writes must not trigger the probe
            try:
                super().probe_conditional_put()
                self._conditional_put_checked = True
            finally:
                self._probing = False

    def _ensure_conditional_put(self) -> None:
        """Run the conditional-PUT probe once per store, before the first write (see module docstring)."""
        if self._conditional_put_checked:
            return
        with self._lock:
            if not (self._conditional_put_checked or self._probing):
                self.probe_conditional_put()

    def _create(self, uri: str, full: str, etag: str, attempt: Callable[[], object]) -> None:
        """Run a create-only request; a refusal after an ambiguous earlier attempt may be our own write."""
        attempts = 0

        def counted() -> object:
            nonlocal attempts
            attempts += 1
            return attempt()

        try:
            self._call("PUT", uri, counted)
        except ObjectExistsError:
            if attempts == 1 or self._etag(uri, full) != etag:
                raise

    def _put_multipart(self, key: str, path: str | PathLike[str], size: int) -> None:
        uri, full = self.object_uri(key), self._prefix + key
        part_size = max(self.spec.part_size, -(-size // _MAX_PARTS))
        upload_id = self._call("PUT", uri, partial(self._start_multipart, full))
        try:
            parts: list[dict[str, Any]] = []
            digests: list[bytes] = []
            with open(path, "rb") as src:
                while chunk := src.read(part_size):
                    number = len(parts) + 1
                    upload = partial(self._upload_part, full, upload_id, number, chunk)
                    parts.append({"PartNumber": number, "ETag": self._call("PUT", uri, upload)})
                    digests.append(_md5(chunk).digest())
            etag = f'"{_md5(b"".join(digests)).hexdigest()}-{len(parts)}"'
            self._create(uri, full, etag, partial(self._complete_multipart, full, upload_id, parts))
        except BaseException:
            self._abort_multipart(full, upload_id)
            raise

    def _call(self, op: str, uri: str, attempt: Callable[[], T]) -> T:
        """Run `attempt` under the retry policy; translate what it raises into kcompact errors."""
        policy = self.spec.retry
        for number in range(1, policy.max_attempts + 1):
            try:
                return attempt()
            except ClientError as exc:
                if not _is_transient(exc):
                    raise _translate(op, uri, exc) from exc
                last: Exception = exc
            except _TRANSIENT_EXCEPTIONS as exc:
                last = exc
            if number < policy.max_attempts:
                time.sleep(policy.delay_s(number, random.random()))
        raise TransientStoreError(
            f"{uri}: {op} still failing after {policy.max_attempts} attempts ({last}); rerun later"
        ) from last

    def _check_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            self._call("HEAD", f"s3://{self._bucket}", self._head_bucket)
        except MissingObjectError:
            raise StoreAccessError(f"store {self.uri}: bucket {self._bucket!r} does not exist") from None
        self._bucket_checked = True

    def _etag(self, uri: str, full: str) -> str | None:
        try:
            return str(self._call("HEAD", uri, partial(self._head, full))["ETag"])
        except MissingObjectError:
            return None

    # One method per request: each is a single attempt, counted, and run through `_call`.

    def _put_object(self, full: str, data: bytes) -> None:
        self._count(puts=1)
        self.client.put_object(Bucket=self._bucket, Key=full, Body=data, IfNoneMatch="*")

    def _get_bytes(self, request: dict[str, Any]) -> bytes:
        self._count(gets=1)
        try:
            response = self.client.get_object(**request)
        except ClientError as exc:
            if _status(exc) == 416:  # the range starts at or past the end: empty, like a slice
                return b""
            raise
        data = bytes(response["Body"].read())
        if "Range" in request and "ContentRange" not in response:
            # an S3 clone that ignores Range sends the whole object: cut the range out here
            first, _, last = request["Range"].removeprefix("bytes=").partition("-")
            return data[int(first) : int(last) + 1 if last else None]
        return data

    def _download(self, full: str, tmp: Path) -> int:
        self._count(gets=1)
        response = self.client.get_object(Bucket=self._bucket, Key=full)
        with open(tmp, "wb") as out:
            for chunk in response["Body"].iter_chunks(MiB):
                out.write(chunk)
            return out.tell()

    def _head(self, full: str) -> dict[str, Any]:
        self._count(gets=1)
        return dict(self.client.head_object(Bucket=self._bucket, Key=full))

    def _head_bucket(self) -> None:
        self._count(gets=1)
        self.client.head_bucket(Bucket=self._bucket)

    def _list_page(self, request: dict[str, Any]) -> dict[str, Any]:
        self._count(lists=1)
        return dict(self.client.list_objects_v2(**request))

    def _delete_object(self, full: str) -> None:
        self._count(deletes=1)
        self.client.delete_object(Bucket=self._bucket, Key=full)

    def _start_multipart(self, full: str) -> str:
        self._count(puts=1)
        return str(self.client.create_multipart_upload(Bucket=self._bucket, Key=full)["UploadId"])

    def _upload_part(self, full: str, upload_id: str, number: int, chunk: bytes) -> str:
        self._count(puts=1)
        response = self.client.upload_part(
            Bucket=self._bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=chunk
        )
        return str(response["ETag"])

    def _complete_multipart(self, full: str, upload_id: str, parts: Sequence[dict[str, Any]]) -> None:
        self._count(puts=1)
        self.client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=full,
            UploadId=upload_id,
            MultipartUpload={"Parts": [*parts]},
            IfNoneMatch="*",
        )

    def _abort_multipart(self, full: str, upload_id: str) -> None:
        """Best effort: a leftover upload only costs storage until a bucket lifecycle rule removes it."""
        try:
            self._count(deletes=1)
            self.client.abort_multipart_upload(Bucket=self._bucket, Key=full, UploadId=upload_id)
        except (ClientError, *_TRANSIENT_EXCEPTIONS):
            pass


_session_lock = threading.Lock()
_shared_session: Any = None


def _session() -> Any:
    """The boto3 session of this process, shared by its stores; call with `_session_lock` held.

    Making a session loads the service models (~0.1 s) and an executor opens a store per task.
    Sessions are not thread-safe, hence the lock; the clients made from them are.
    """
    global _shared_session
    if _shared_session is None:
        _shared_session = boto3.session.Session()
    return _shared_session


def _new_client(spec: StoreSpec) -> Any:
    with _session_lock:
        return _session().client(
            "s3",
            endpoint_url=spec.endpoint_url,
            region_name=spec.region,
            config=Config(
                retries={"mode": "standard", "total_max_attempts": 1},  # retries are ours: see module doc
                connect_timeout=10,
                read_timeout=60,
                max_pool_connections=32,
            ),
        )


def _credentials() -> Any:
    with _session_lock:
        return _session().get_credentials()


def _md5(data: bytes) -> Any:
    return hashlib.md5(data, usedforsecurity=False)


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_transient(exc: ClientError) -> bool:
    return _code(exc) in _TRANSIENT_CODES or _status(exc) in _TRANSIENT_STATUS


def _translate(op: str, uri: str, exc: ClientError) -> KcompactError:
    """The kcompact error for a permanent S3 failure of `op` on the object (or bucket) `uri`."""
    code, status = _code(exc), _status(exc)
    message = exc.response.get("Error", {}).get("Message", "")
    if code == "PreconditionFailed" or status == 412:
        return ObjectExistsError(uri)
    if code in _ACCESS_CODES or status in (301, 403):
        hint = (
            " (S3 also answers 403 for a missing key when s3:ListBucket is not granted)"
            if status == 403
            else ""
        )
        return StoreAccessError(
            f"{uri}: {op} refused: {code} (HTTP {status}) {message}{hint}; "
            "check the bucket, region, endpoint and credentials"
        )
    if code in _MISSING_CODES or status == 404:
        return MissingObjectError("object does not exist", obj=uri)
    return StoreRequestError(f"{uri}: {op} failed: {code} (HTTP {status}) {message}")
