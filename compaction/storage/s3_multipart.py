"""The requests of one create-only S3 multipart upload, and the ETag its completed object will carry.

A file is sent in parts of at least `spec.part_size` bytes, at most 10,000 parts. Completion sends
`If-None-Match: *`, like a single PUT. The completed object's ETag is the MD5 of the parts' MD5s followed by
`-<part count>`, which lets a completion retried after an ambiguous failure recognise its own earlier
success. Each method is one attempt, counted in the store's stats; the store runs it under its retry loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from compaction.storage.s3_client import md5
from compaction.storage.s3_retry import TRANSIENT_EXCEPTIONS

MAX_PARTS = 10_000


def part_size_for(size: int, min_part_size: int) -> int:
    """The part size for a file of `size` bytes: `min_part_size`, raised so that at most MAX_PARTS are needed."""
    return max(min_part_size, -(-size // MAX_PARTS))


class MultipartUpload:
    """One upload of `full_key` to `bucket`: start, upload parts in order, complete, or abort."""

    def __init__(self, client: Any, bucket: str, full_key: str, count: Callable[..., None]) -> None:
        self._client = client
        self._bucket = bucket
        self._key = full_key
        self._count = count
        self.upload_id = ""
        self.parts: list[dict[str, Any]] = []
        self._digests: list[bytes] = []

    @property
    def etag(self) -> str:
        """The ETag S3 gives the object completed from the parts uploaded so far."""
        return f'"{md5(b"".join(self._digests)).hexdigest()}-{len(self.parts)}"'

    def start(self) -> str:
        """Open the upload; returns (and keeps) its upload id."""
        self._count(puts=1)
        response = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._key)
        self.upload_id = str(response["UploadId"])
        return self.upload_id

    def upload_part(self, chunk: bytes) -> str:
        """Send the next part; returns its ETag and records it for `complete` only once it was accepted."""
        self._count(puts=1)
        number = len(self.parts) + 1
        response = self._client.upload_part(
            Bucket=self._bucket, Key=self._key, UploadId=self.upload_id, PartNumber=number, Body=chunk
        )
        etag = str(response["ETag"])
        self.parts.append({"PartNumber": number, "ETag": etag})
        self._digests.append(md5(chunk).digest())
        return etag

    def complete(self) -> None:
        """Assemble the parts into the object, only if the key does not exist yet (412 otherwise)."""
        self._count(puts=1)
        self._client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self.upload_id,
            MultipartUpload={"Parts": [*self.parts]},
            IfNoneMatch="*",
        )

    def abort(self) -> None:
        """Best effort: a leftover upload only costs storage until a bucket lifecycle rule removes it."""
        try:
            self._count(deletes=1)
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self.upload_id)
        except (ClientError, *TRANSIENT_EXCEPTIONS):
            pass
