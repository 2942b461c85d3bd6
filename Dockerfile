# The pipeline's image: the same locked environment as `make setup`, for Kubeflow Pipelines and TFJobs.
# Build: docker build -t tfx-mlops:latest .
FROM python:3.10-slim-bookworm

WORKDIR /app
RUN pip install --no-cache-dir "uv==0.13.9"
COPY requirements.lock ./
RUN uv pip sync --system --compile-bytecode requirements.lock
COPY setup.py README.md ./
COPY pipeline ./pipeline
COPY components ./components
COPY serving ./serving
RUN uv pip install --system --no-deps -e .

ENTRYPOINT ["mlops"]
CMD ["--help"]
