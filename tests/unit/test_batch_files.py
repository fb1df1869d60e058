"""The Batch API's files: their bytes in a local folder and in a real S3-compatible server (moto's), their
records in the state store, each key seeing only its own; and the state store's listing of a space."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.batches.files import FileBytes, Files, LocalFiles, S3Files, open_file_bytes
from edge.errors import OpenAIError
from edge.state import Limits, open_store
from tests.support.s3_server import CREDENTIALS, s3_server
from tritongate.settings import Settings


@pytest.fixture(params=["local", "s3"])
def data(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FileBytes]:
    if request.param == "local":
        yield LocalFiles(tmp_path / "files")
        return
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with s3_server() as server:
        yield open_file_bytes(Settings(batch_files_url=f"s3://{server.bucket}/some/prefix",
                                       batch_s3_endpoint_url=server.endpoint_url))


def test_bytes_are_written_read_and_removed(data: FileBytes) -> None:
    assert data.write("file-1", io.BytesIO(b"line one\nline two\n")) == 18
    assert data.read("file-1") == b"line one\nline two\n"
    data.remove("file-1")
    with pytest.raises(FileNotFoundError):
        data.read("file-1")
    data.remove("file-1")  # again: nothing to do


def test_an_s3_url_needs_a_bucket() -> None:
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        open_file_bytes(Settings(batch_files_url="s3:///prefix"))
    assert isinstance(open_file_bytes(Settings()), LocalFiles) and S3Files is not None


async def test_a_key_sees_only_its_own_files(tmp_path: Path) -> None:
    store = open_store("memory://")
    files = Files(LocalFiles(tmp_path), store.space("files", Limits(100, 3600)))
    mine = await files.create("team-a", "a.jsonl", "batch", io.BytesIO(b"{}\n"))
    theirs = await files.create("team-b", "b.jsonl", "batch", io.BytesIO(b"{}\n{}\n"))
    assert await files.content("team-a", mine["id"]) == b"{}\n"
    assert [f["id"] for f in await files.listed("team-a", None)] == [mine["id"]]
    assert await files.listed("team-a", "batch_output") == []
    for call in (files.get("team-a", theirs["id"]), files.content(None, mine["id"]),
                 files.delete("team-a", theirs["id"])):
        with pytest.raises(OpenAIError) as raised:
            await call
        assert (raised.value.status, raised.value.param) == (404, "file_id")
    await files.delete("team-b", theirs["id"])
    assert not (tmp_path / theirs["id"]).exists()


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis"])
async def test_a_space_lists_its_values_by_key_prefix(backend: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    urls = {"memory": "memory://", "sqlite": f"sqlite://{tmp_path / 's.sqlite3'}"}
    store = open_store(urls.get(backend) or request.getfixturevalue("redis_server").url)
    space = store.space(f"answers-{uuid.uuid4().hex}", Limits(100, 3600))  # its own on the shared Redis
    for key in ("b:2", "a_1", "b:1", "a%1"):
        await space.put(key, key.encode())
    await store.space(f"other-{uuid.uuid4().hex}", Limits(100, 3600)).put("b:3", b"x")
    assert await space.items("b:") == [("b:1", b"b:1"), ("b:2", b"b:2")]
    assert [key for key, _ in await space.items("a_")] == ["a_1"]  # no wildcards
    assert len(await space.items()) == 4
    await store.close()
