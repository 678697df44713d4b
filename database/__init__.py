"""Files the database module serves, installed as ``aisafety.data``.

``mnist_test_balanced_1000.npz``: the embedded default dataset (see docs/data.md).
``zoo/``: shipped model checkpoints and their manifest.
"""
