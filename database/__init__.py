"""Files the database module serves, installed as ``aisafety.data``.

``mnist_test_balanced_1000.npz``: the embedded default dataset (see docs/data.md).
``mnist_train_balanced_5000.npz``: its ``train`` split, the default profile data of the
neuron-coverage metrics (how it was made: ``aisafety/database/datasets/embedded.py``).
``zoo/``: shipped model checkpoints and their manifest.
"""
