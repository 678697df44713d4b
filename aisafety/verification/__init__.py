"""Deterministic certification: bound propagation (IBP, CROWN, Fast-Lin, CROWN-IBP,
alpha-CROWN) and a complete MILP verifier on a model's traced graph, VNN-LIB properties.

``graph.py`` traces a network into ops (``ops.py``) with activation relaxations
(``relaxations.py``); ``bounds.py`` propagates bounds; ``incomplete.py`` and ``complete.py``
are the verifiers (registered through the ``aisafety_verifiers`` hook), the latter on the
MILP of ``milp.py`` with bounds tightened by ``refine.py``; ``vnnlib.py``
reads VNN-COMP properties. ``smoothing/`` (randomized smoothing) lives beside them.
"""
