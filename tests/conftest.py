"""Shared pytest configuration."""

import os

from hypothesis import settings

# In CI, hypothesis explores the same examples every run: a red build is reproducible, and a
# green one does not depend on luck.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
