"""Tests of kiln/frontend: bytecode round trip, the program corpus, guards, models."""
