"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from loom.core.spec_decode import SpecDecoder


@pytest.fixture
def verified(monkeypatch):
    """[steps, drafts, accepted] over every verified step of the test."""
    totals = [0, 0, 0]
    original = SpecDecoder.on_output

    def on_output(self, request, drafted, sampled):
        totals[0] += 1
        totals[1] += drafted
        totals[2] += len(sampled) - 1
        return original(self, request, drafted, sampled)
    monkeypatch.setattr(SpecDecoder, "on_output", on_output)
    return totals
