# One image for every tritongate component; the command picks it:
#   docker run tritongate edge | llm | embed | rerank | health TARGET | models list
#
#   docker build -t tritongate .                                  # the runtime image (default target)
#   docker build --target models -t tritongate-models .           # + torch (CPU) for `tritongate models fetch`
#
# The generated gRPC code is committed, so no protoc runs here. The edge and the services never import
# torch; only the `models` target has it (converting the demo LLM needs it, once).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a virtualenv with tritongate and its dependencies (wheels only) ---------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ONLY_BINARY=:all:
RUN python -m venv /opt/tritongate
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tritongate ./tritongate
COPY services ./services
COPY edge ./edge
COPY launcher ./launcher
# setuptools builds tritongate itself (pure Python); every dependency comes as a wheel.
RUN /opt/tritongate/bin/pip install --no-binary=tritongate .

# --- base: the virtualenv on a clean slim Python, as a non-root user ---------------------------
FROM ${PYTHON_IMAGE} AS base
# uid and gid 10001, as the Kubernetes manifests' runAsUser and runAsGroup.
RUN groupadd --system --gid 10001 tritongate \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/tritongate tritongate \
    && mkdir -p /models /etc/tritongate \
    && chown tritongate:tritongate /models
COPY --from=build /opt/tritongate /opt/tritongate
ENV PATH=/opt/tritongate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITONGATE_CONFIG_FILE=/etc/tritongate/model_config.json \
    TRITONGATE_MODELS_DIR=/models \
    TRITONGATE_SERVICE_HOST=0.0.0.0 \
    TRITONGATE_EDGE_HOST=0.0.0.0
WORKDIR /home/tritongate
ENTRYPOINT ["tritongate"]
CMD ["--help"]

# --- models: fetches (and for the LLM, converts) the demo models into /models ----------------
FROM base AS models
ARG TORCH_VERSION=2.13.0
# Same transformers as the Triton image (deploy/triton/Dockerfile), which loads what is written here.
ARG TRANSFORMERS_VERSION=5.20.2
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
    && pip install --no-cache-dir "transformers==${TRANSFORMERS_VERSION}" "gguf>=0.10" "accelerate>=0.30" \
       "safetensors>=0.4"
USER tritongate
CMD ["models", "fetch"]

# --- runtime (default): edge, llm, embed, rerank ------------------------------------------------
FROM base AS runtime
USER tritongate
EXPOSE 5100 50051 50052 50053 9090
