"""The Exporter: SavedModel, TFLite, ONNX and TF.js artifacts, each verified in its own runtime."""
