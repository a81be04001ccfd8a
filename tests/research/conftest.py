"""The research tests share the engine tests' tokenizer and tiny-model fixtures."""

from tests.gpu_worker.conftest import *  # noqa: F403
