"""`mlops init`: a project from a folder of CSV files (schema, starter config, statistics page) and the datasets
the project bundles."""
