"""The tests NM512's two codebases' goldens share (`test_nm512.py`, `test_r2dreamer.py`), written once.

Both generators record the same keys (`value/`, `slow_value/`, `slow_after/`,
`feat`, `logits`, ...) from the same kind of inputs, and both modules name
their functions alike (`load_<host>`, `export_<host>`, `<host>_critic`), so a
test file subclasses `GoldenChecks` with what differs and adds its own tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from multicritic import CriticNetwork, critic_loss
from tests.conftest import to_np
from tests.interop.cases import check_all_or_nothing, check_forward, check_loss, check_round_trip, load_npz, prefixed

# The generators' latent sizes (deter 24; 4 categoricals of 5 classes).
SIZES = dict(gru_units=24, num_z_categoricals=4, num_z_classes=5)


class GoldenChecks:
    """The shared tests; a subclass (`TestNM512`, ...) sets:

    `module`: the host's module (`multicritic.interop.nm512`), its goldens in
    `tests/data/interop/<host>/<host>_goldens.npz`; `loss_after_update`: the
    golden key of the loss the codebase computed after its own slow update;
    `refusal`: `(options, message)` of another codebase's critic, which the
    loader refuses with `message`.
    """

    module = None
    loss_after_update = None
    refusal = None

    @property
    def host(self):
        return self.module.__name__.rsplit(".", 1)[-1]

    def load(self, *args):
        return getattr(self.module, f"load_{self.host}")(*args)

    def export(self, critic):
        return getattr(self.module, f"export_{self.host}")(critic)

    def make(self, golden):
        build = getattr(self.module, f"{self.host}_critic")
        return build(prefixed(golden, "value/"), prefixed(golden, "slow_value/"), **SIZES)

    @pytest.fixture(scope="class")
    def golden(self):
        return load_npz(self.host, f"{self.host}_goldens.npz")

    def test_forward_is_upstreams(self, golden):
        """The fast and slow logits and values on the recorded feature, and the logits from `(deter, stoch)`."""
        critic = self.make(golden)
        assert critic.input_layout == "z_h"
        check_forward(
            critic, golden["feat"], golden["logits"], golden["slow_logits"], golden["value"], golden["slow_value"]
        )
        _, logits = to_np(critic(golden["deter"], golden["stoch"]))
        np.testing.assert_allclose(logits, golden["logits"], rtol=1e-5, atol=1e-5)

    def test_loss_and_gradient_are_upstreams(self, golden):
        check_loss(
            self.make(golden),
            golden["logits"],
            golden["slow_logits"],
            golden["target"][..., None],
            golden["weights"][..., None],
            golden["loss"],
            golden["grad_logits"],
        )

    def test_slow_update_then_loss_is_upstreams_update(self, golden):
        """Both codebases mix the slow critic before each update's loss, from the first one on: one
        `update_ema(tau=0.02)` gives the slow state their own update wrote, and the loss they computed on it."""
        critic = self.make(golden)
        critic.update_ema(tau=0.02)
        _, slow = self.export(critic)
        for key, want in prefixed(golden, "slow_after/").items():
            np.testing.assert_allclose(slow[key], want, rtol=1e-6, atol=1e-7, err_msg=key)
        _, slow_logits = critic.on_latent(golden["feat"], use_ema=True)
        options = critic.loss_options()
        total = critic_loss(
            golden["logits"], golden["target"], None, golden["weights"], ema_logits=slow_logits, **options
        )
        np.testing.assert_allclose(to_np(total["total"]), golden[self.loss_after_update], rtol=1e-5)

    def test_round_trips_bit_identical(self, golden):
        """Export gives back the recorded states bit for bit, and so does a fresh critic loaded with them (the
        fast state's keys as a torch.compile'd module has them)."""
        critic = self.make(golden)
        fast, slow = self.export(critic)
        check_round_trip(fast, prefixed(golden, "value/"))
        check_round_trip(slow, prefixed(golden, "slow_value/"))
        again = CriticNetwork.from_config(critic.get_config())
        self.load(again, {"_orig_mod." + k: v for k, v in fast.items()}, slow)
        for a, b in zip(self.export(again), (fast, slow)):
            check_round_trip(a, b)

    def test_bad_states_change_nothing(self, golden):
        """A bad fast or slow state is refused by name, and another codebase's critic by its first different
        option; nothing changes."""
        critic = self.make(golden)
        key = self.module.ADAPTER.key
        state = prefixed(golden, "value/")
        check_all_or_nothing(critic, lambda s: self.load(critic, s), state, key("scale", 1))
        head = key("head_kernel", critic.num_dense_layers)
        check_all_or_nothing(critic, lambda s: self.load(critic, state, s), prefixed(golden, "slow_value/"), head)
        options, message = self.refusal
        other = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=32, **SIZES, **options)
        with pytest.raises(ValueError, match=message):
            self.load(other, state)
