"""The C extensions (pyproject.toml holds everything else): the frontend's plain streaming step
(services/frontend/generation/_plainc.c) and the dispatch pass's loop (engine_client/_dispatch.c).
Optional: where no C compiler or Python headers are, the install goes on without them and the Python code
serves every token (same bytes; tests/unit/frontend/test_plainc.py)."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("services.frontend.generation._plainc", ["services/frontend/generation/_plainc.c"], optional=True),
    Extension("services.frontend.engine_client._dispatch", ["services/frontend/engine_client/_dispatch.c"],
              optional=True),
])
