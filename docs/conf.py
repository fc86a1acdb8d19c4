"""Sphinx configuration for jaxtl's documentation (Sphinx + MyST + furo).

Build it strictly, as CI does: ``python -m sphinx -W --keep-going -b html
docs docs/_build/html``. The pages under ``reference/generated/`` and
``benchmarks.md`` are written at build time from the code and from
``launch/benchmark_results.md`` by ``_ext/generate.py``; they are not
committed, so they cannot drift.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.dirname(HERE))

project = "jaxtl"
author = "the jaxtl authors"
copyright = "2026, the jaxtl authors"  # pylint: disable=redefined-builtin

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "generate",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
nitpicky = False
autodoc_typehints = "description"
autodoc_member_order = "bysource"
suppress_warnings = []

html_theme = "furo"
html_title = "jaxtl"
html_static_path = []
