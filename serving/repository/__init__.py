"""The model repository: TF Serving's model folders and models.config, on a local folder or on gs://."""
