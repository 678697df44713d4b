"""Scale-out: a plan's units as Ray tasks (docs/scale-out.md). Needs the ``distributed``
extra (``pip install "aisafety[distributed]"``); nothing here is imported by a local run."""
