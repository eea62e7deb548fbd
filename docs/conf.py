"""Sphinx configuration of the documentation site: MyST markdown, the furo theme, and the generated
reference pages (docs/_ext/probepo_reference.py). `bash scripts/docs` builds and serves it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "ProbePO suite"
author = "ProbePO suite authors"
copyright = "ProbePO suite authors, Apache-2.0"
extensions = ["myst_parser", "probepo_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# reference/tables/ holds the benchmark tables that docs/BENCHMARKS.md includes: fragments, not pages
exclude_patterns = ["_build", "reference/tables"]
myst_enable_extensions = ["deflist"]
myst_heading_anchors = 3
# texts are shown as written: docstrings and --help quote with straight quotes and write `--` options
smartquotes = False
html_theme = "furo"
html_title = "ProbePO suite"
