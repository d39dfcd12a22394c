"""The language model, reached through the `openai` SDK (one place)."""
