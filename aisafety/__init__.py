"""AISafety: evaluate how robust an image classifier really is."""

from aisafety.version import __version__

__all__ = ["__version__"]
