"""TF Serving's model repository layout, clients and the local serving tools."""

# TF Serving's own defaults, shared by the server and the command line without importing TensorFlow.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_REST_PORT = 8501
DEFAULT_GRPC_PORT = 8500
DEFAULT_MAX_BATCH_SIZE = 1024
