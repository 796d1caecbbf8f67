"""The toy: what stands in for pretraining so that SEED can be tried on a CPU, NOT part of the method.

A real run starts from a pretrained Qwen-VL / Qwen instruct model. None can be downloaded here, so this
package builds a tiny randomly initialised Qwen-architecture model (`tiny_model`), plays solver and random
demonstrations (`demonstrations`), warm-starts the tiny model on them (`warmstart`), measures whether a
policy reads a skill (`skill_probe`), and runs the CPU demo (`demo`) and the toy reproduction of the
paper's comparison (`reproduce`). It builds on the core package; nothing in the core imports it.
"""
