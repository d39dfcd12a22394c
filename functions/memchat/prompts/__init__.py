"""What memchat asks the chat model besides a turn's answer, one module per prompt."""

from __future__ import annotations

import json


def answer_json(content: str) -> object:
    """The JSON an answer to one of these prompts holds: its outermost object
    (the model may wrap it in a code fence or words), else the whole answer
    as JSON; None when neither is JSON."""
    text = content.strip()
    try:
        return json.loads(text[text.find("{") : text.rfind("}") + 1] if "{" in text else text)
    except ValueError:
        return None
