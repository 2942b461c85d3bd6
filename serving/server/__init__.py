"""The local model server: TF Serving's REST and gRPC APIs over the model repository, and the request-logging proxy."""
