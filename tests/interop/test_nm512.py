"""NM512/dreamerv3-torch's critic, from numbers its code wrote (`tests/data/interop/nm512/`)."""

from multicritic.interop import nm512
from tests.interop.nm512_cases import GoldenChecks


class TestNM512(GoldenChecks):
    module = nm512
    loss_after_update = "train_call_loss"  # the value loss NM512's own `ImagBehavior._train` gave
    refusal = {}, "input_layout='h_z'; NM512's critic has input_layout='z_h'"  # RLlib's input order
