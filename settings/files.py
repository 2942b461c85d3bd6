"""The names of the files one package writes and another reads: spelled here once."""

# The Exporter's report beside every format, which the Publisher copies into each published version.
EXPORT_REPORT_JSON = "export_report.json"
EXPORT_REPORT_HTML = "export_report.html"
# SchemaGen's and ImportSchemaGen's schema at its artifact's root.
SCHEMA_FILE = "schema.pbtxt"
# A version's training data contract and statistics, relative to its folder (monitoring/ reads them).
TRAINING_SCHEMA_FILE = "assets.extra/training/schema.pbtxt"
TRAINING_STATISTICS_FILE = "assets.extra/training/statistics.pb"
# In each run's folder outputs/runs/<run>/, and the index of runs in outputs/runs/.
RUN_SUMMARY_JSON = "summary.json"
RUN_REPORT_HTML = "summary.html"
RUNS_INDEX_HTML = "index.html"
