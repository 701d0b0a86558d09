"""A user module for test_adversarial_2026_12_07.py: its globals are added and removed between calls."""
from __future__ import annotations

LEVEL = 1.0
