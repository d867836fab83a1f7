"""The one error the prompting library raises for a request it cannot make a prompt of."""
from __future__ import annotations


class PromptError(ValueError):
    """A request field whose value cannot be made into a prompt. `param` names the field (a JSON path such
    as `messages[2].tool_calls[0].function.arguments`), and the message names it too. A frontend answers
    it as a 400 naming the field; the router's precise_prefix policy routes such a body by load."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


def refuse(field: str, problem: str) -> PromptError:
    """`field: problem`, the usual shape."""
    return PromptError(f"{field}: {problem}", param=field)
