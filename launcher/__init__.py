"""The `tritongate` command, above the edge and the services (docs/architecture.md, Layers).

- `launcher.cli`: the command line (`tritongate up | edge | llm | embed | rerank | triton | models | health`)
- `launcher.stack`: `tritongate up` and `LocalStack`, the whole stack as separate processes on one machine
- `launcher.workers`: several edge workers on one port and service replicas (`--workers`)
- `launcher.supervisor`: restarts a process that exits, with backoff, while the others serve
- `launcher.healthcheck`: the probe behind `tritongate health` and the stack's readiness checks
- `launcher.chat`: `tritongate chat`, the console client

Every part of it reads the services from `tritongate.registry`; a service added there needs no change here.
The base package `tritongate` never imports this one.
"""
