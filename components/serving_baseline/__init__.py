"""ServingBaseline: the Evaluator's baseline read from the model repository the pipeline publishes to."""
