"""Publisher: the one path from a blessed, verified model to a numbered version of the model repository."""
