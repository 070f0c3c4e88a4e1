# The image the Helm chart runs (ghcr.io/prism-netdiag/prism): `prism daemon`
# and `prism collect`. Not built in CI: these machines have no Docker engine.
# The base image by digest (python:3.11-slim). The digest could not be checked against
# the registry from the project machine (no Docker access); refresh it with
#   docker buildx imagetools inspect python:3.11-slim --format '{{json .Manifest.Digest}}'
ARG BASE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${BASE}
WORKDIR /src
# runtime dependencies only, each file checked against the lock's hashes (no test or demo extras: no broker binary)
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY prism prism
COPY synthetic synthetic
COPY collectors collectors
RUN pip install --no-cache-dir --no-deps . && rm -rf /src
WORKDIR /
# the chart runs it as nobody with a read-only root filesystem
USER 65534:65534
# numba caches compiled decoders beside the code; the image's code is read-only at run time. The chart
# mounts a volume at /cache/numba for it (numbaCache); compiled kernels are not baked in here: numba
# keys them by the build host's CPU, and a node with another CPU model would compile them again anyway
ENV NUMBA_CACHE_DIR=/tmp/numba MPLCONFIGDIR=/tmp
ENTRYPOINT ["prism"]
CMD ["--help"]
