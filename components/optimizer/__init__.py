"""Optimizer: distils, prunes and calibrates the trained Keras model before evaluation and export."""
