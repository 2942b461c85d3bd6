"""Distribution for the TFX MLOps pipeline: `pip install -e .` gives the `mlops` command."""
from setuptools import find_packages, setup

# Bottom to top, as tests/test_layering.py orders them.
PACKAGES = ("settings", "reports", "serving", "components", "pipeline", "monitoring", "rollout")

setup(
    name="tfx-mlops",
    version="0.1.0",
    description="A TFX pipeline from raw CSV to versioned TensorFlow Serving deployments on Kubernetes.",
    packages=find_packages(include=[name for package in PACKAGES for name in (package, f"{package}.*")]),
    package_data={"pipeline": ["configs/*.yaml", "configs/*.pbtxt"]},
    python_requires=">=3.10,<3.11",
    # Exact versions live in requirements.lock; these are the direct needs for a plain pip install.
    install_requires=[
        "tfx==1.16.0",
        "tensorflow==2.16.2",
        "tf-keras==2.16.0",
        "tensorflow-serving-api==2.16.1",
        "keras-tuner",
        "pyyaml",
    ],
    entry_points={"console_scripts": ["mlops=pipeline.cli:console_main"]},
)
