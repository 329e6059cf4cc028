# The gpufleet image: controllers, webhooks, the node agent and gpufleet server (one image, see
# charts/gpufleet).
#   docker build -t ghcr.io/gpufleet/gpufleet:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpufleet gpufleet
COPY controllers controllers
COPY agent agent
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# an unprivileged user; the chart runs the controller read-only as uid 65532
USER 65532:65532
ENTRYPOINT ["gpufleet"]
