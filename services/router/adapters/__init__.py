"""Router-side translations of the OpenAI Responses and Anthropic Messages APIs to upstream chat."""
from __future__ import annotations


class AdapterError(ValueError):
    """A request the translation cannot carry faithfully; `param` names the field, as the APIs' 400s do."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = message
