"""What the run-integrity checks cost (docs/reliability.md): one plan run with the content
fingerprints after every plugin call, and with them switched off, interleaved in pairs;
prints each pair's time ratio (on / off) and their median.

    python bench/integrity_overhead.py [pairs]    # default 4 pairs, MNIST, 200 images
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from aisafety.evaluation import integrity  # noqa: E402
from aisafety.interfaces import EvaluationPlan  # noqa: E402
from aisafety.runner import Runner  # noqa: E402
from aisafety.store.results import ResultStore  # noqa: E402

PLAN = EvaluationPlan.model_validate(
    {"dataset": {"limit": 200}, "device": "cpu",
     "attacks": [{"name": "fgsm", "eps": [0.1, 0.2, 0.3]},
                 {"name": "pgd-linf", "config": {"steps": 10}, "eps": [0.1, 0.3]}],
     "metrics": ["ca", "aaw", "ald", "acac", "robust-accuracy"]}
)  # fmt: skip
CHECK = integrity.RunIntegrity.check


def timed(checks: bool) -> float:
    integrity.RunIntegrity.check = CHECK if checks else (lambda self, who: None)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        Runner(PLAN, ResultStore(f"sqlite:///{folder}/r.db"), quiet=True).run()
        return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    timed(True)  # warm-up: imports, the zoo model, the data
    ratios = []
    for i in range(pairs):  # alternate which runs first, so drift cancels
        if i % 2:
            on, off = timed(True), timed(False)
        else:
            off, on = timed(False), timed(True)
        ratios.append(on / off)
        print(f"pair {i}: checks off {off:.2f} s, on {on:.2f} s, ratio {on / off:.3f}")
    print(f"median ratio (on / off): {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
