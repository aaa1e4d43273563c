"""mpswrap's Slurm hook shims and their installer, shipped inside the package.

``hook`` (the one shim), ``install.sh`` and ``uninstall.sh`` are package data; ``install``
runs them (``mpswrap install-hooks``, ``python -m mpswrap.slurm install``). The guide is
slurm/README.md in the source tree.
"""
