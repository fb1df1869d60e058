"""Helpers the tests share (fixtures stay in tests/conftest.py; see tests/README.md).

- `ports`: free loopback ports, polling until something is ready
- `stack`: the test stack's settings, model configuration and model repositories; spawning one component
- `events`: the file the test models append their observations to
- `openai_schema`, `streams`: OpenAI's published schemas, and reading the edge's SSE streams
"""
