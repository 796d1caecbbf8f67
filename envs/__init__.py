"""Environments (shipped as `seed_vl.envs`; the folder stays at the repository top level)."""
