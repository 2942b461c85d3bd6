"""CsvExampleGen with `data.missing_values`: TFX's CSV ingestion, with missing-value markers read as empty cells."""
