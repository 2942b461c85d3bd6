# The pipeline's image: the same locked environment as `make setup`, for Kubeflow Pipelines and TFJobs.
# Build: docker build -t tfx-mlops:latest .
# checkov:skip=CKV_DOCKER_2: the image runs batch commands (pipeline steps, TFJob workers), no server a health check could ask; Kubernetes watches the process itself.
FROM python:3.10-slim-bookworm

WORKDIR /app
# Node.js runs the exported TF.js model when the Exporter verifies it.
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "uv==0.13.9"
COPY requirements.lock ./
RUN uv pip sync --system --compile-bytecode requirements.lock
COPY components/exporter/node/package.json components/exporter/node/package-lock.json ./components/exporter/node/
RUN cd components/exporter/node && npm ci --no-audit --no-fund --ignore-scripts
COPY setup.py README.md ./
COPY pipeline ./pipeline
COPY components ./components
COPY serving ./serving
RUN uv pip install --system --no-deps -e .
# Not root: the pipeline root volume must be writable for UID 10001 (k8s/training/README.md).
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin mlops
USER 10001

ENTRYPOINT ["mlops"]
CMD ["--help"]
