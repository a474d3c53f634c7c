"""The package version (pyproject.toml has the same)."""
__version__ = "0.1.0"
