"""Sphinx configuration of the mlirgpu guide: Markdown pages (MyST) and an API
reference generated from the docstrings (autodoc). Build it with

    python3 -m sphinx -W -b html docs build/docs
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import mlirgpu  # noqa: E402

project = "mlirgpu"
author = "the mlirgpu authors"
release = mlirgpu.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_member_order = "bysource"
# The environment has no GPU when the guide is built: kernels are traced on the CPU backend.
os.environ.setdefault("MLIRGPU_BACKEND", "cpu")
