"""The model side: the `LLM` interface and its clients (`base`), what a prompt holds (`prompt`,
`others`), media turned into model input (`media`, `heavy`, `transcribe`), and the tools a
provider refuses (`tool_refusals`). It knows the store and the tools, never the core.
"""

__all__ = ["base", "heavy", "media", "others", "prompt", "tool_refusals", "transcribe"]
