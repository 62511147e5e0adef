"""The model side: the `LLM` interface and the failure policy (`base`), the clients (`openai`
over `wire` and `transport`, and the offline `echo`) made by `factory`, what a prompt holds
(`prompt`, `others`), media turned into model input (`media`, `heavy`, `transcribe`), and the
tools a provider refuses (`tool_refusals`). It knows the store and the tools, never the core.
"""

__all__ = [
    "base",
    "echo",
    "factory",
    "heavy",
    "media",
    "openai",
    "others",
    "prompt",
    "tool_refusals",
    "transcribe",
    "transport",
    "wire",
]
