# The image the Helm chart runs (ghcr.io/prism-netdiag/prism): `prism daemon`
# and `prism collect`. Not built in CI: these machines have no Docker engine.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY prism prism
COPY synthetic synthetic
COPY collectors collectors
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
# the chart runs it as nobody with a read-only root filesystem
USER 65534:65534
# numba caches compiled decoders beside the code; the image's code is read-only at run time
ENV NUMBA_CACHE_DIR=/tmp/numba MPLCONFIGDIR=/tmp
ENTRYPOINT ["prism"]
CMD ["--help"]
