"""Uploaded files and a batch's result files: their bytes in a local folder (TRITONGATE_BATCH_FILES_DIR) or
an S3-compatible bucket (TRITONGATE_BATCH_FILES_URL=s3://bucket/prefix), their records (OpenAI's `File`
object and who created it) in the shared state store. A key sees only its own files; another's, or one
that does not exist, is a 404 alike."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import orjson

from edge.batches.records import newest_first
from edge.errors import OpenAIError
from edge.state import Space
from tritongate.settings import Settings

PURPOSES = ("batch", "batch_output")  # what can be uploaded: batch; what a batch writes: batch_output


class FileBytes(ABC):
    """Where the files' bytes are kept, by file id. Blocking clients run on a thread."""

    name: str

    @abstractmethod
    def write(self, file_id: str, source: IO[bytes]) -> int:
        """Store what `source` holds; returns its size."""

    @abstractmethod
    def read(self, file_id: str) -> bytes: ...

    @abstractmethod
    def remove(self, file_id: str) -> None: ...


class LocalFiles(FileBytes):
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.name = str(folder)

    def write(self, file_id: str, source: IO[bytes]) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.folder, prefix=".upload-", delete=False) as out:
            shutil.copyfileobj(source, out)
            size = out.tell()
        os.replace(out.name, self.folder / file_id)  # whole or not at all
        return size

    def read(self, file_id: str) -> bytes:
        return (self.folder / file_id).read_bytes()

    def remove(self, file_id: str) -> None:
        (self.folder / file_id).unlink(missing_ok=True)


class S3Files(FileBytes):
    """Any S3-compatible store, through boto3 (the `s3` extra)."""

    def __init__(self, url: str, endpoint_url: str | None) -> None:
        import boto3  # only where configured

        parts = urlsplit(url)
        self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
        self.name = url
        self.client = boto3.client("s3", endpoint_url=endpoint_url)

    def _key(self, file_id: str) -> str:
        return f"{self.prefix}/{file_id}" if self.prefix else file_id

    def write(self, file_id: str, source: IO[bytes]) -> int:
        start = source.tell()
        size = source.seek(0, os.SEEK_END) - start
        source.seek(start)
        self.client.upload_fileobj(source, self.bucket, self._key(file_id))  # closes `source`
        return size

    def read(self, file_id: str) -> bytes:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self._key(file_id))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(file_id) from None
        return body

    def remove(self, file_id: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(file_id))


def open_file_bytes(settings: Settings) -> FileBytes:
    if settings.batch_files_url:
        if urlsplit(settings.batch_files_url).scheme != "s3" or not urlsplit(settings.batch_files_url).netloc:
            raise ValueError(f"TRITONGATE_BATCH_FILES_URL {settings.batch_files_url!r}: expected s3://bucket/prefix")
        return S3Files(settings.batch_files_url, settings.batch_s3_endpoint_url)
    return LocalFiles(settings.batch_files_dir)


def not_found(file_id: str, param: str = "file_id") -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file_id}", param, "file_not_found")


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A file's record as its API shows it (OpenAI's `File`): without its owner."""
    return {key: value for key, value in record.items() if not key.startswith("_")}


class Files:
    def __init__(self, data: FileBytes, records: Space) -> None:
        self.data = data
        self.records = records

    async def create(self, owner: str | None, filename: str, purpose: str, source: IO[bytes],
                     file_id: str | None = None) -> dict[str, Any]:
        """A new file (or, with `file_id`, that one replaced): its bytes stored first, then its record."""
        file_id = file_id or f"file-{uuid.uuid4().hex}"
        size = await asyncio.to_thread(self.data.write, file_id, source)
        record = {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()),
                  "filename": filename, "purpose": purpose, "status": "processed", "_owner": owner,
                  "_created_ns": time.time_ns()}
        await self.records.put(file_id, orjson.dumps(record))
        return record

    async def get(self, owner: str | None, file_id: str, param: str = "file_id") -> dict[str, Any]:
        """The owner's file (a 404 naming `param` when it has none of that id)."""
        value = await self.records.get(file_id)
        record: dict[str, Any] | None = None if value is None else orjson.loads(value)
        if record is None or record["_owner"] != owner:
            raise not_found(file_id, param)
        return record

    async def content(self, owner: str | None, file_id: str) -> bytes:
        await self.get(owner, file_id)
        try:
            return await asyncio.to_thread(self.data.read, file_id)
        except FileNotFoundError:
            raise not_found(file_id) from None

    async def delete(self, owner: str | None, file_id: str) -> None:
        await self.get(owner, file_id)
        await self.records.delete(file_id)
        await asyncio.to_thread(self.data.remove, file_id)

    async def listed(self, owner: str | None, purpose: str | None) -> list[dict[str, Any]]:
        """The owner's files (of `purpose`), newest first."""
        records = [orjson.loads(value) for _, value in await self.records.items()]
        mine = [r for r in records if r["_owner"] == owner and purpose in (None, r["purpose"])]
        return newest_first(mine)
