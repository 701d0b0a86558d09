"""A second module for corpus_effects.py: globals written from the compiled code live in this module's dict."""
from __future__ import annotations

LEVEL = 1.0


def set_level(value):
    global LEVEL
    LEVEL = value


def scaled(t):
    return t * LEVEL
