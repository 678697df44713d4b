"""Models and data: network architectures, dataset sources and the model zoo (layer 2).

The results store is ``aisafety.store``; building a zoo entry is ``aisafety.zoo_build``.
"""
