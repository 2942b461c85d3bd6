"""The typed settings every package reads: the config dataclasses with their validation, YAML and `--set` loading,
the task kinds with their metrics, and the artifact file names. Imports no other package of this project."""
