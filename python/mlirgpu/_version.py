"""The version of mlirgpu (one place: the package and its build read it)."""
__version__ = "0.1.0"
