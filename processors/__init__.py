"""Prompt templates, observation -> chat messages, action parsing, image preprocessing (`seed_vl.processors`)."""
