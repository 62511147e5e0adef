"""Message content for `chat` spans, when the operator opts in
(`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`): the request's messages and the
answer in the GenAI conventions' shape (`gen_ai.input.messages`, `gen_ai.output.messages`,
JSON). Images are named, never copied: a span is no place for a photo."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str) and content:
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for item in content:
            if item.get("type") == "text":
                parts.append({"type": "text", "content": item.get("text", "")})
            else:
                parts.append({"type": "uri", "modality": "image", "uri": "(not captured)"})
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    if message.get("role") == "tool":
        parts = [
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content}
        ]
    return parts


def input_messages(messages: Sequence[dict[str, Any]]) -> str:
    """`gen_ai.input.messages` of a Chat Completions request's messages."""
    return json.dumps([{"role": m.get("role"), "parts": _parts(m)} for m in messages])


def output_messages(text: str, calls: Sequence[dict[str, Any]], finish_reason: str) -> str:
    """`gen_ai.output.messages` of the model's answer."""
    message = {"role": "assistant", "content": text, "tool_calls": list(calls)}
    return json.dumps(
        [{"role": "assistant", "parts": _parts(message), "finish_reason": finish_reason}]
    )
