"""Fingerprints of the default (``float32: exact``) verdicts and margins, to compare two
checkouts bit for bit (session 21: ``float32: rigorous`` left the default untouched).

    PYTHONPATH=/path/to/checkout OMP_NUM_THREADS=1 python3 bench/float32_default_identity.py \
        /path/to/checkout > one.txt      # then diff two checkouts' files

Per undefended fuzz case (testkit/attack_fuzz.py's seeds below) and verifier that takes its
graph (ibp, crown, fast-lin, crown-ibp, deeppoly, alpha-crown, bab, complete; testkit's fast
settings, 20 s per sample): the verdicts, the margins and a SHA-1 of their float64 bytes.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
sys.path.insert(0, str(root / "testkit"))
from attack_fuzz import random_case  # noqa: E402
from verifier_fuzz import FAST  # noqa: E402

from aisafety.plugins import default_registry  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

REGISTRY = default_registry()
VERIFIERS = ("ibp", "crown", "fast-lin", "crown-ibp", "deeppoly", "alpha-crown", "bab", "complete")
SEEDS = (13, 15, 17, 57, 61, 119, 189, 234, 616, 5, 6, 7, 8)


def main() -> None:
    for seed in SEEDS:
        case = random_case(seed, REGISTRY)
        if case.defended:
            continue
        try:
            graph = build_graph(case.predictor.network, case.predictor.input_shape, case.what)
        except Exception:  # noqa: BLE001 - a graph this build refuses has no fingerprint
            continue
        prop = robustness_property(case.x, case.y, case.eps, case.predictor.num_classes)
        for name in VERIFIERS:
            fields = REGISTRY.get("verifier", name).Config.model_fields
            config = {k: v for k, v in {**FAST, "timeout": 20.0}.items() if k in fields}
            verifier = REGISTRY.create("verifier", name, config)
            try:
                verifier.check(graph)
            except Exception:  # noqa: BLE001 - not this verifier's graph
                continue
            result = verifier.verify(graph, prop, case.predictor.network)
            digest = hashlib.sha1(result.margins.double().numpy().tobytes()).hexdigest()[:12]
            verdicts = [str(v) for v in result.verdicts]
            print(f"{seed} {name} {verdicts} {result.margins.tolist()} {digest}", flush=True)


if __name__ == "__main__":
    main()
