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

The retry loop and error mapping live in `s3_retry.py`, the multipart requests in `s3_multipart.py`,
the shared boto3 session and client settings in `s3_client.py`; this module is the store itself.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from compaction.errors import KcompactError, MissingObjectError, ObjectExistsError, StoreAccessError
from compaction.storage.base import (
    DELETE_BATCH,
    TEMP_PREFIX,
    MiB,
    ObjectInfo,
    ObjectStore,
    StoreSpec,
    check_key,
    check_prefix,
    check_range,
    run_at_once,
)
from compaction.storage.s3_client import S3_PUT_THREADS, credentials, md5, new_client
from compaction.storage.s3_multipart import MultipartUpload, part_size_for
from compaction.storage.s3_retry import call_with_retry, is_transient, status, translate

if TYPE_CHECKING:
    from os import PathLike

T = TypeVar("T")

_REFRESHING_CREDENTIAL_METHODS = frozenset({"iam-role", "container-role"})


@dataclass
class _Probe:
    """Whether the conditional-PUT probe ran (or is running) for a store and its forks: the first write of any of
    them runs it, in its own requests, and the others wait for it."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    checked: bool = False
    probing: bool = False


class _KeyRefused(Exception):
    """DeleteObjects refused `key` for good (not retried); carries S3's error for it."""

    def __init__(self, key: str, error: ClientError) -> None:
        super().__init__(key)
        self.key, self.error = key, error


class S3Store(ObjectStore):
    """The `s3://bucket/prefix` backend. See `compaction.storage.base` for the contract."""

    put_threads = S3_PUT_THREADS

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
        self._probe = _Probe()  # shared with this store's forks

    def fork(self) -> S3Store:
        forked = S3Store(self.spec)
        forked._client, forked._bucket_checked, forked._probe = self.client, self._bucket_checked, self._probe
        return forked

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
                    self._client = new_client(self.spec)
        return self._client

    def put(self, key: str, data: bytes) -> None:
        self._ensure_conditional_put()
        uri, full = self.object_uri(key), self._prefix + key
        etag = f'"{md5(data).hexdigest()}"'
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

    def put_pieces(self, key: str, pieces: Iterable[bytes | memoryview]) -> int:
        """One PUT when the pieces come to at most `part_size` bytes; else a multipart upload whose parts of
        `part_size` bytes are sent as the pieces fill them, and which is aborted if taking a piece raises."""
        buffer = bytearray()
        upload: MultipartUpload | None = None
        uri, full = self.object_uri(key), self._prefix + key
        size = 0
        try:
            for piece in pieces:
                buffer += piece
                size += len(piece)
                while len(buffer) > self.spec.part_size:  # the last part may be short; every other one is full
                    if upload is None:
                        self._ensure_conditional_put()
                        if self.exists(key):  # refuse before uploading parts for nothing
                            raise ObjectExistsError(self.object_uri(key))
                        upload = MultipartUpload(self.client, self._bucket, full, self._count)
                        self._call("PUT", uri, upload.start)
                    part = bytes(buffer[: self.spec.part_size])
                    del buffer[: self.spec.part_size]
                    self._call("PUT", uri, partial(upload.upload_part, part))
            if upload is None:
                self.put(key, bytes(buffer))
                return size
            self._call("PUT", uri, partial(upload.upload_part, bytes(buffer)))
            self._create(uri, full, upload.etag, upload.complete)
        except BaseException:
            if upload is not None and upload.upload_id:
                upload.abort()
            raise
        self._count(bytes_written=size)
        return size

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

    def delete_many(self, keys: Iterable[str]) -> int:
        """DeleteObjects, `DELETE_BATCH` keys a request (batches in flight at once); a key S3 refuses is named in the
        error, and a batch where S3 failed some keys transiently is sent again whole (deleting is idempotent)."""
        todo = [self._prefix + check_key(k) for k in dict.fromkeys(keys)]
        batches = [todo[i : i + DELETE_BATCH] for i in range(0, len(todo), DELETE_BATCH)]
        run_at_once([partial(self._delete_batch, batch) for batch in batches], self.put_threads)
        return len(todo)

    def _delete_batch(self, full: Sequence[str]) -> None:
        if len(full) == 1:
            self._call("DELETE", self.object_uri(full[0][len(self._prefix) :]), partial(self._delete_object, full[0]))
            return
        try:
            self._call("DELETE", f"{self.object_uri(full[0][len(self._prefix) :])} and {len(full) - 1} more keys",
                       partial(self._delete_objects, full))
        except _KeyRefused as refused:
            raise translate("DELETE", self.object_uri(refused.key[len(self._prefix) :]), refused.error) from None

    def _delete_objects(self, full: Sequence[str]) -> None:
        self._count(deletes=1)
        answer = self.client.delete_objects(
            Bucket=self._bucket, Delete={"Objects": [{"Key": k} for k in full], "Quiet": True}
        )
        errors = []
        for e in answer.get("Errors", ()):
            error = {"Code": e.get("Code", ""), "Message": e.get("Message", "")}
            errors.append((str(e.get("Key", "")), ClientError({"Error": error}, "DeleteObjects")))
        for _key, error in errors:
            if is_transient(error):
                raise error  # the batch again, under the retry policy
        if errors:
            raise _KeyRefused(*errors[0])

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
        found = credentials()
        if found is not None and found.method not in _REFRESHING_CREDENTIAL_METHODS:
            frozen = found.get_frozen_credentials()
            options["AWS_ACCESS_KEY_ID"] = frozen.access_key
            options["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key
            if frozen.token:
                options["AWS_SESSION_TOKEN"] = frozen.token
        return options

    def probe_conditional_put(self) -> None:
        with self._probe.lock:
            self._probe.probing = True  # the probe's own writes must not trigger the probe
            try:
                super().probe_conditional_put()
                self._probe.checked = True
            finally:
                self._probe.probing = False

    def _ensure_conditional_put(self) -> None:
        """Run the conditional-PUT probe once per store and its forks, before the first write (see module
        docstring)."""
        if self._probe.checked:
            return
        with self._probe.lock:  # a fork's write waits for the probe another fork runs, then skips it
            if not (self._probe.checked or self._probe.probing):
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
        part_size = part_size_for(size, self.spec.part_size)
        upload = MultipartUpload(self.client, self._bucket, full, self._count)
        self._call("PUT", uri, upload.start)
        try:
            with open(path, "rb") as src:
                while chunk := src.read(part_size):
                    self._call("PUT", uri, partial(upload.upload_part, chunk))
            self._create(uri, full, upload.etag, upload.complete)
        except BaseException:
            upload.abort()
            raise

    def _call(self, op: str, uri: str, attempt: Callable[[], T]) -> T:
        """Run `attempt` under the store's retry policy; translate what it raises into kcompact errors."""
        return call_with_retry(op, uri, self.spec.retry, attempt)

    def diagnose(self) -> KcompactError | None:
        """A missing bucket, refused or absent credentials, a wrong region, or an endpoint whose host does not
        resolve, found by resolving the endpoint's host and one HeadBucket (no retries). A refused connection or
        a timeout says nothing permanent: None."""
        endpoint = self.client.meta.endpoint_url
        where = f"store {self.uri} (endpoint {endpoint})"
        parts = urlsplit(endpoint)
        try:
            socket.getaddrinfo(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        except socket.gaierror as e:
            if e.errno == socket.EAI_AGAIN:  # the resolver did not answer: may pass
                return None
            return StoreAccessError(f"{where}: the endpoint's host {parts.hostname!r} does not resolve ({e.strerror}); "
                                    "fix --endpoint-url or AWS_ENDPOINT_URL")
        if credentials() is None:
            return StoreAccessError(f"{where}: no AWS credentials found (environment, config files or an instance "
                                    "role); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        try:
            self._head_bucket()
        except ClientError as e:
            code = status(e)
            if code == 404:
                return StoreAccessError(f"{where}: bucket {self._bucket!r} does not exist; create it, or fix --store")
            if code == 403:
                return StoreAccessError(f"{where}: access to bucket {self._bucket!r} refused (HTTP 403); check the "
                                        "credentials and that they are granted s3:ListBucket on it")
            if code == 301:
                return StoreAccessError(f"{where}: bucket {self._bucket!r} is in another region; set AWS_REGION "
                                        "(or AWS_DEFAULT_REGION) to it")
            return None
        except Exception:  # connection refused, timeouts: nothing a configuration change is known to fix
            return None
        return None

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
            if status(exc) == 416:  # the range starts at or past the end: empty, like a slice
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
