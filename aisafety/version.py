"""The platform version, stored with every result row."""

from importlib import metadata

try:
    __version__ = metadata.version("aisafety")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
