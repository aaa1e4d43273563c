"""CPU stand-in for benchmarks/workers/nbody.py (tests only): the MLP stand-in's protocol."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("mlp.py")), run_name="__main__")
