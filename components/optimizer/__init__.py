"""Optimizer: distils and prunes the trained Keras model before evaluation and export."""
