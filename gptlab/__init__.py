"""gptlab: compose GPT training runs from Hydra config groups and compare them fairly."""

__version__ = "0.1.0"
