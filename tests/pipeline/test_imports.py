"""A run imports only what it uses: building and launching the pipeline must not load `tfx.v1`, whose namespace
imports Google Cloud's AI Platform and KFP clients (about 2 s of every run's start-up). A fresh process, because
this test process may have imported them already."""
import subprocess
import sys

UNUSED = ("tfx.v1", "google.cloud.aiplatform", "kfp")
BUILD = """
import sys
import components
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from settings.config import load_config
from pipeline.pipeline import create_pipeline

for baseline in ("previous_blessed", "latest_blessed"):
    create_pipeline(load_config(None, ["output_root={output_root}", "evaluation.baseline=" + baseline]))
print(sorted(name for name in {unused!r} if name in sys.modules))
"""


def test_building_the_pipeline_imports_no_cloud_clients(tmp_path):
    code = BUILD.format(output_root=tmp_path, unused=UNUSED)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "[]"
