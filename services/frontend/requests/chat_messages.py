"""Chat messages as the schema decoded them, made into the chat template's input by the shared prompting
library (prompting/chat_messages.py, which follows vLLM's chat_utils); its refusals become 400s naming the
field. Runs in each API server process, from `preparer.py`."""
from __future__ import annotations

from typing import Any

import msgspec

from prompting.chat_messages import template_messages as _template_messages
from prompting.errors import PromptError
from services.frontend.errors import refused_prompt
from services.frontend.requests.openai_schema import ChatMessage


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation for `ChatTemplate.render`; a 400 naming the field for a shape it cannot take."""
    try:
        return _template_messages(msgspec.to_builtins(messages))
    except PromptError as exc:
        raise refused_prompt(exc) from None
