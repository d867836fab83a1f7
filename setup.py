"""The one C extension (pyproject.toml holds everything else): the frontend's plain streaming step,
services/frontend/generation/_plainc.c. Optional: where no C compiler or Python headers are, the install
goes on without it and the Python step serves every token (same bytes; tests/unit/frontend/test_plainc.py)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("services.frontend.generation._plainc", ["services/frontend/generation/_plainc.c"],
                             optional=True)])
