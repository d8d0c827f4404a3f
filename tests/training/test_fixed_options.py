"""The options the compiled steps read are read-only once built, on every backend (an assignment taken by the
eager PyTorch step and ignored by the compiled and the JAX / TensorFlow steps changed a script's behaviour at its
1001st step): assigning one raises `FixedOptionError`, a `ValueError` and an `AttributeError`, and changes
nothing."""

import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.registry import KERAS_KEYS
from multicritic.training.step import FIXED_OPTIONS as STEP_OPTIONS
from multicritic.validation import FixedOptionError

# The critic's options: its constructor's, every key of its config but Keras's (the parts' the same way:
# tests/test_registry.py).
CRITIC_OPTIONS = [k for k in CriticNetwork(model_size="nano").get_config() if k not in KERAS_KEYS]


@pytest.mark.parametrize("name", STEP_OPTIONS)
def test_trainer_options_are_read_only(name):
    trainer = CriticTrainer(CriticNetwork(model_size="nano"))
    before = getattr(trainer, name)
    with pytest.raises(FixedOptionError, match=f"^{name}: got an assignment"):
        setattr(trainer, name, 0.5)
    assert getattr(trainer, name) is before
    with pytest.raises(ValueError):
        setattr(trainer, name, 0.5)
    with pytest.raises(AttributeError):
        setattr(trainer, name, 0.5)
    trainer.check_finite = False  # read outside the compiled step, by every path: may change
    assert trainer.check_finite is False


def test_the_critics_options_are_its_constructors():
    import inspect

    constructor = set(inspect.signature(CriticNetwork.__init__).parameters) - {"self", "kwargs"}
    assert set(CRITIC_OPTIONS) <= constructor and "ema_decay" in CRITIC_OPTIONS and "head" in CRITIC_OPTIONS
    # hl_gauss_sigma: 0.1.0's spelling of the HL-Gauss head's sigma, kept in the head's options.
    assert constructor - set(CRITIC_OPTIONS) <= {"hl_gauss_sigma", "name", "dtype"}


@pytest.mark.parametrize("name", CRITIC_OPTIONS)
def test_critic_options_are_read_only(name):
    critic = CriticNetwork(model_size="nano")
    before = getattr(critic, name)
    with pytest.raises(FixedOptionError, match=f"^{name}: got an assignment"):
        setattr(critic, name, 0.5)
    assert getattr(critic, name) == before


def test_the_ema_decay_error_says_how_to_use_another_decay():
    critic = CriticNetwork(model_size="nano")
    with pytest.raises(FixedOptionError, match="pass decay= to update_ema"):
        critic.ema_decay = 0.5


def test_sizes_left_to_the_first_call_are_still_set_by_it():
    import numpy as np

    critic = CriticNetwork(model_size=None, num_dense_layers=1, dense_hidden_units=8)
    critic(np.zeros((2, 5), "float32"), np.zeros((2, 3, 4), "float32"))
    assert (critic.gru_units, critic.num_z_categoricals, critic.num_z_classes) == (5, 3, 4)
    with pytest.raises(FixedOptionError):
        critic.gru_units = 6
