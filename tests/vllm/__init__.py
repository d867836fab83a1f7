"""The tests that run vLLM: a package, so that tests/vllm/conftest.py's shared engines are package-scoped."""
