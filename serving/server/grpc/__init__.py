"""The local server's gRPC API: tensor proto codec, the PredictionService and ModelService servicers and server."""
