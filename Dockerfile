# The project's one image: Kubeflow Pipelines components, TFJob training workers and `mlops` itself, built from the
# same requirements.lock that `make setup` installs (tests/test_image.py checks both stay one).
#   docker build -t registry.example/tfx-mlops:1.0 .
#   docker run --rm registry.example/tfx-mlops:1.0 run --set training.train_steps=200
# checkov:skip=CKV_DOCKER_2: the image runs batch commands (pipeline steps, TFJob workers), no server a health check could ask; Kubernetes watches the process itself.

# Node.js: npm installs the TF.js runtime here; only the node binary reaches the final image.
FROM node:20-bookworm-slim AS javascript
WORKDIR /build
COPY components/exporter/node/package.json components/exporter/node/package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts --loglevel=error

# Python: the locked environment in /opt/venv, made with the uv version the Makefile pins.
FROM python:3.10-slim-bookworm AS python
ARG UV_VERSION=0.13.9
RUN pip install --no-cache-dir "uv==${UV_VERSION}" && python -m venv /opt/venv
# pyfarmhash (tensorflow-data-validation's) is published as source only: g++ compiles it here, never in the image.
RUN apt-get update && apt-get install -y --no-install-recommends g++=4:12.2.0-3 && rm -rf /var/lib/apt/lists/*
COPY requirements.lock /tmp/requirements.lock
RUN uv pip sync --no-cache --compile-bytecode --python /opt/venv/bin/python /tmp/requirements.lock

# The image: no compiler, npm or package cache; dependencies first, the code last, a non-root user.
FROM python:3.10-slim-bookworm
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    TF_USE_LEGACY_KERAS=1 \
    TF_CPP_MIN_LOG_LEVEL=2
RUN useradd --no-log-init --create-home --uid 10001 --user-group mlops
COPY --from=javascript /usr/local/bin/node /usr/local/bin/node
COPY --from=python /opt/venv /opt/venv
WORKDIR /app
COPY --from=javascript /build/node_modules components/exporter/node/node_modules
COPY setup.py README.md ./
COPY settings settings
COPY reports reports
COPY pipeline pipeline
COPY components components
COPY serving serving
COPY monitoring monitoring
COPY rollout rollout
RUN mkdir outputs && chown 10001:10001 outputs
# Numeric, so that Kubernetes can verify runAsNonRoot.
USER 10001
ENTRYPOINT ["python", "-m", "pipeline.cli"]
CMD ["--help"]
