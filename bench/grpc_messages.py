"""What streamed deltas cost in gRPC messages between two Python processes, and what carrying many
generations' deltas in one stream would save: the question behind one Generate stream per edge process.

    python bench/grpc_messages.py [--seconds 4] > result.json

A grpc.aio server (its own process, on uvloop, as the llm service runs) sends 4-character deltas as the
llm service's `GenerateResponse` messages to a grpc.aio client (this process, as the edge), at a total
rate of `rate` deltas a second spread over `generations`, in two ways:
- `per_generation`: one server-streaming call per generation, a message per delta (the Generate RPC
  today, where no two deltas of a generation meet within its join window);
- `multiplexed`: one call for all of them, a message per millisecond carrying that millisecond's
  deltas (a repeated `GenerateResponse`, each with its generation's index).
Each side's CPU per delta comes from /proc (all threads).

Then what starting a generation costs while 64 generations stream (2,500 deltas a second, a call each):
generations start in bursts of `BURST` every `BURST_EVERY_S`, and each start's time to its first message
is measured in two ways, alternated: `new_call`, a new server-streaming call per generation (the Generate
RPC today), and `on_stream`, a message on one bidirectional stream opened beforehand (one Generate stream
per edge process). Twice: with a server that only sends, and with one that also spends 150 µs of CPU per
delta (about what the llm service spends per token), whose event loop is as busy as the service's.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_main, free_port, percentile_ms, process_cpu, start_script

POINTS = [(16, 2500), (64, 2500), (64, 10000)]  # (generations, deltas a second in all)
TICK_S = 0.001  # the multiplexed stream's message interval
PER_GENERATION = "/bench.Deltas/PerGeneration"
MULTIPLEXED = "/bench.Deltas/Multiplexed"
START, STARTS = "/bench.Deltas/Start", "/bench.Deltas/Starts"
BURST, BURST_EVERY_S = 8, 0.2  # generations started together, and how often (40 a second, as at 64 streams)
START_LOAD = (64, 2500)  # the generations streaming meanwhile, and their deltas a second in all
START_WORK_US = (0, 150)  # the server's CPU per streamed delta: none, and about the llm service's own

# Shared by the server process and this one: the llm service's message, and a batch of them.
MESSAGES = """
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tritongate.llm.v1 import llm_pb2

_FILE = descriptor_pb2.FileDescriptorProto(name="bench/deltas.proto", package="bench", syntax="proto3",
                                           dependency=[llm_pb2.DESCRIPTOR.name])
_FILE.message_type.add(name="Batch").field.add(
    name="items", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
    label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, type_name=".tritongate.llm.v1.GenerateResponse")
descriptor_pool.Default().Add(_FILE)
Batch = message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName("bench.Batch"))
Response = llm_pb2.GenerateResponse
Delta = llm_pb2.Delta
"""

SERVER = MESSAGES + f"TICK_S = {TICK_S!r}\n" + """
import asyncio, sys, time, grpc, uvloop

def plan(request):  # "deltas,interval_s[,generations[,work_us]]"
    fields = request.decode().split(",")
    return int(fields[0]), float(fields[1]), int(fields[2]) if len(fields) > 2 else 1

def work(request):  # CPU spent per delta, as the llm service's Python spends per token
    fields = request.decode().split(",")
    return float(fields[3]) / 1e6 if len(fields) > 3 else 0.0

async def per_generation(request, context):
    count, interval, _ = plan(request)
    busy = work(request)
    start = time.perf_counter()
    for i in range(count):  # on a schedule, as a model produces them
        await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
        until = time.perf_counter() + busy
        while time.perf_counter() < until:
            pass
        yield Response(delta=Delta(index=0, text=" fox"))

async def multiplexed(request, context):
    count, interval, generations = plan(request)  # interval: between one generation's deltas
    start, sent, tick = time.perf_counter(), 0, 0
    rate = generations / interval
    while sent < count:
        tick += 1
        await asyncio.sleep(max(0.0, start + tick * TICK_S - time.perf_counter()))
        due = min(count, int(tick * TICK_S * rate))
        if due > sent:
            yield Batch(items=[Response(delta=Delta(index=i % generations, text=" fox")) for i in range(sent, due)])
            sent = due

async def start(request, context):  # a generation's first delta at once
    yield Response(delta=Delta(index=0, text=" fox"))

async def starts(requests, context):  # the same for each start message on one stream, by its index
    async for request in requests:
        yield Response(delta=Delta(index=int(request), text=" fox"))

async def main():
    server = grpc.aio.server()
    identity = lambda raw: raw
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Deltas", {
        "PerGeneration": grpc.unary_stream_rpc_method_handler(per_generation, identity, Response.SerializeToString),
        "Multiplexed": grpc.unary_stream_rpc_method_handler(multiplexed, identity, Batch.SerializeToString),
        "Start": grpc.unary_stream_rpc_method_handler(start, identity, Response.SerializeToString),
        "Starts": grpc.stream_stream_rpc_method_handler(starts, identity, Response.SerializeToString)})])
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    await server.start()
    await server.wait_for_termination()

uvloop.run(main())
"""

EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
namespace: dict[str, Any] = {}
exec(MESSAGES, namespace)  # the same message classes as the server's
Batch, Response = namespace["Batch"], namespace["Response"]


async def point(channel: grpc.aio.Channel, server: int, generations: int, rate: int, seconds: float,
                multiplexed: bool) -> dict[str, Any]:
    interval = generations / rate  # between one generation's deltas
    per_generation_count = max(1, int(seconds / interval))
    total = per_generation_count * generations
    received = 0
    before = process_cpu(server), process_cpu(os.getpid())
    start = time.perf_counter()
    if multiplexed:
        call = channel.unary_stream(MULTIPLEXED, request_serializer=None, response_deserializer=Batch.FromString)
        async for batch in call(f"{total},{interval},{generations}".encode()):
            received += sum(1 for item in batch.items if item.delta.text)
    else:
        call = channel.unary_stream(PER_GENERATION, request_serializer=None, response_deserializer=Response.FromString)

        async def one() -> int:
            return sum([1 async for message in call(f"{per_generation_count},{interval}".encode())
                        if message.delta.text])
        received = sum(await asyncio.gather(*(one() for _ in range(generations))))
    elapsed = time.perf_counter() - start
    server_s, client_s = process_cpu(server) - before[0], process_cpu(os.getpid()) - before[1]
    row = {"generations": generations, "rate": rate, "way": "multiplexed" if multiplexed else "per_generation",
           "deltas": received, "deltas_per_s": round(received / elapsed),
           "sender_cpu_us_per_delta": round(server_s / received * 1e6, 1),
           "receiver_cpu_us_per_delta": round(client_s / received * 1e6, 1),
           "together_us_per_delta": round((server_s + client_s) / received * 1e6, 1)}
    print(row, file=sys.stderr, flush=True)
    return row


async def starts_point(channel: grpc.aio.Channel, seconds: float, on_stream: bool, work_us: float
                       ) -> dict[str, Any]:
    """Bursts of starts while `START_LOAD` streams: each start's time to its first message."""
    generations, rate = START_LOAD
    interval = generations / rate
    streaming = channel.unary_stream(PER_GENERATION, request_serializer=None, response_deserializer=Response.FromString)
    plan = f"{int(seconds / interval) + 50},{interval},1,{work_us}".encode()  # longer than the point
    load = asyncio.gather(*(_drain(streaming(plan)) for _ in range(generations)))
    waits: dict[int, asyncio.Future[None]] = {}
    stream = channel.stream_stream(STARTS, request_serializer=None,
                                   response_deserializer=Response.FromString)(None) if on_stream else None

    async def replies() -> None:  # the stream's answers, to their starts
        assert stream is not None
        async for message in stream:
            waits.pop(message.delta.index).set_result(None)

    writing = asyncio.Lock()  # one write at a time on the stream

    async def one(index: int) -> float:
        begin = time.perf_counter()
        if stream is not None:
            waits[index] = answered = asyncio.get_running_loop().create_future()
            async with writing:
                await stream.write(str(index).encode())
            await answered
            return time.perf_counter() - begin
        call = channel.unary_stream(START, request_serializer=None, response_deserializer=Response.FromString)(b"")
        await call.read()
        took = time.perf_counter() - begin
        await _drain(call)  # the call's end
        return took

    reader = asyncio.create_task(replies()) if stream is not None else None
    await asyncio.sleep(0.5)  # the load running
    latencies = await bursts(one, seconds)
    if stream is not None:
        await stream.done_writing()
    if reader is not None:
        await reader
    load.cancel()
    await asyncio.gather(load, return_exceptions=True)
    row = {"way": "on_stream" if on_stream else "new_call", "server_work_us_per_delta": work_us,
           "starts": len(latencies),
           **{f"first_message_p{q}_ms": percentile_ms(latencies, q / 100) for q in (50, 90, 99)}}
    print(row, file=sys.stderr, flush=True)
    return row


async def bursts(start: Callable[[int], Awaitable[float]], seconds: float) -> list[float]:
    """`BURST` starts at once every `BURST_EVERY_S`, for `seconds`: each start's time (`start(index)`),
    sorted."""
    latencies: list[float] = []
    deadline, index = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline:
        burst_start = time.perf_counter()
        latencies += await asyncio.gather(*(start(index + i) for i in range(BURST)))
        index += BURST
        await asyncio.sleep(max(0.0, burst_start + BURST_EVERY_S - time.perf_counter()))
    return sorted(latencies)


async def _drain(call: Any) -> None:
    """Read a call to its end (with `read()`, which a call already read from must keep using)."""
    while await call.read() is not EOF:
        pass


async def run(seconds: float) -> dict[str, Any]:
    port = free_port()
    server = start_script(SERVER, port)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        await channel.channel_ready()
        rows = []
        for generations, rate in POINTS:
            await point(channel, server.pid, generations, rate, 1, False)  # warm up
            for multiplexed in (False, True, False, True):  # alternated
                rows.append(await point(channel, server.pid, generations, rate, seconds, multiplexed))
        start_rows = [await starts_point(channel, seconds, on_stream, work_us)
                      for work_us in START_WORK_US for on_stream in (False, True, False, True)]
        return {"benchmark": "grpc_messages", "tick_s": TICK_S, "results": rows,
                "starts": {"burst": BURST, "burst_every_s": BURST_EVERY_S, "streaming": dict(zip(
                    ("generations", "deltas_per_s"), START_LOAD, strict=True)), "results": start_rows}}
    finally:
        await channel.close(grace=None)
        server.kill()
        server.wait()


if __name__ == "__main__":
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as the edge runs
    bench_main(__doc__, run)
