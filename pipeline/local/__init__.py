"""Local orchestration: the DAG runner that starts each stage when its inputs are ready, the stage worker processes,
the ML Metadata lock they share, and the progress lines."""
