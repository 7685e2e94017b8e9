"""Sphinx configuration of the mlirgpu guide: Markdown pages (MyST) and an API
reference generated from the docstrings (autodoc). Build it with

    python3 -m sphinx -W -b html docs build/docs
"""
import importlib.util
import os
import re
import sys

# The installed mlirgpu where there is one (what the reader has), else the checkout's, built in place.
if importlib.util.find_spec("mlirgpu") is None:
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
autodoc_default_options = {}
autodoc_member_order = "bysource"
# The environment has no GPU when the guide is built: kernels are traced on the CPU backend.
os.environ.setdefault("MLIRGPU_BACKEND", "cpu")


_CODE = re.compile(r"(``?)(.+?)\1")


def _inline(text):
    """One line of a docstring written with Markdown's habits, as reStructuredText:
    `code` becomes a literal; *, | and a trailing _ outside literals are escaped."""
    out, position = [], 0
    for match in _CODE.finditer(text):
        out.append(_escape(text[position:match.start()]))
        out.append("``" + match.group(2) + "``")
        position = match.end()
    out.append(_escape(text[position:]))
    return "".join(out)


def _escape(text):
    text = text.replace("\\", "\\\\").replace("*", "\\*").replace("|", "\\|")
    return re.sub(r"(\w)_(?=\W|$)", r"\1\\_", text)


def markdown_docstring(app, what, name, obj, options, lines):
    """The package's docstrings read as plain text with `code` spans and
    indented examples; make each indented block a literal block."""
    converted, in_block = [], False
    for line in lines:
        indented = line.startswith((" ", "\t")) and line.strip()
        if indented and not in_block:
            previous = next((i for i in range(len(converted) - 1, -1, -1) if converted[i].strip()), None)
            if previous is not None and not converted[previous].rstrip().endswith("::"):
                converted[previous] = converted[previous].rstrip() + " ::"
            if converted and converted[-1].strip():
                converted.append("")
            in_block = True
        elif line.strip() and not indented:
            if in_block and converted and converted[-1].strip():
                converted.append("")
            in_block = False
        converted.append(line if in_block or not line.strip() else _inline(line))
    lines[:] = converted


def setup(app):
    app.connect("autodoc-process-docstring", markdown_docstring)
