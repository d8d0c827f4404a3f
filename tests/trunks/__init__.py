"""The trunks' tests, and the check they share: a bad option refused, naming it."""

import pytest

from multicritic import CriticNetwork
from multicritic.trunks import TRUNKS


def assert_refused(trunk, options, message):
    """`options` refused with a `ValueError` matching `message` by the trunk registered as `trunk`, alone and
    through the critic (a shared option as the critic's, an own one in the trunk's spec), before it builds."""
    with pytest.raises(ValueError, match=message):
        TRUNKS[trunk](model_size="nano", **options)
    shared = {k: v for k, v in options.items() if k in TRUNKS.shared}
    own = {k: v for k, v in options.items() if k not in shared}
    with pytest.raises(ValueError, match=message):
        CriticNetwork(model_size="nano", trunk={"class_name": trunk, "config": own}, **shared)
