"""seed-vl: SEED (self-evolving on-policy distillation) for vision-language and text agents."""

__version__ = "0.1.0"
