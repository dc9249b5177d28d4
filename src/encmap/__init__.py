"""encmap: a map of sentence encoders from PIP matrices and quantum relative entropy."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("encmap")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"
