"""OpenAI-compatible HTTP frontend over headless engines, with data-parallel placement."""
