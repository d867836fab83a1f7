"""truncate_prompt_tokens as vLLM applies it to a prompt's token ids."""
from __future__ import annotations

from collections.abc import MutableSequence
from typing import TypeVar

from prompting.errors import PromptError, refuse

Ids = TypeVar("Ids", bound=MutableSequence[int])
FIELD = "truncate_prompt_tokens"


def truncated(ids: Ids, keep: int | None, side: str | None, max_model_len: int | None) -> Ids:
    """Keep the last `keep` tokens ("left", vLLM's side for generation models) or the first ("right");
    -1 keeps as many as leave room for one generated token. `max_model_len` None: not known yet, which
    only -1 needs."""
    if keep is None:
        return ids
    if type(keep) is not int or keep < -1:
        raise refuse(FIELD, "must be -1 (as many as the context holds) or >= 1")
    if keep == 0:
        raise PromptError(f"{FIELD}=0 would leave no prompt: it must be -1 or >= 1", param=FIELD)
    if max_model_len is not None and keep > max_model_len:  # vLLM's check and its numbers
        raise PromptError(f"{FIELD}={keep} cannot be greater than max_model_len = {max_model_len}. "
                          "Please request a smaller truncation size.", param=FIELD)
    if keep < 0:
        if max_model_len is None:
            raise PromptError(f"{FIELD}=-1 needs the engines' max_model_len, not known yet", param=FIELD)
        keep = max_model_len - 1
    if len(ids) <= keep:
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep:]  # type: ignore[return-value]
