"""A real S3-compatible server for the Batch API's files in a bucket: moto's server (a test dependency),
on a free loopback port in a thread of the test process, with a bucket made for the test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.ports import free_port

# moto takes any credentials; boto3 needs some, in the edge's environment as in the test's.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str


@contextmanager
def s3_server(bucket: str = "batches") -> Iterator[S3Server]:
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        yield S3Server(endpoint, bucket)
    finally:
        server.stop()
