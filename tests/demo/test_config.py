import math
import re

import numpy as np
import pytest

from multicritic import heads

from multicritic.math import bins

from multicritic.model import critic

from multicritic.model import sizes
from multicritic.math.bins import symexp
from multicritic.demo import config as demo_config
from multicritic.demo.config import MAX_ABS_VALUE, MAX_SEED, DemoConfig, check_config, demo_mdp
from multicritic.demo.run import run_demo
from tests.conftest import to_np


def test_keras_free_copies_match_the_real_lists():
    assert demo_config.MODEL_SIZES == sizes.MODEL_SIZES
    assert demo_config.BIN_SCHEMES == bins.BIN_SCHEMES
    assert demo_config.HEADS == tuple(heads.HEADS)
    assert demo_config.AGGREGATIONS == critic.AGGREGATIONS
    from multicritic.training import presets

    assert demo_config.PRESETS == presets.PRESETS
    for name in presets.PRESETS:
        assert demo_config._PRESET_BINS[name] == presets.options(name, None if name == "rllib-2023" else "1m")[
            "critic"
        ].get("bin_scheme", "uniform_symlog")


def test_presets_are_checked():
    assert DemoConfig(preset="rllib-2023").bin_scheme == "uniform_symlog"
    assert DemoConfig(preset="dreamerv3-2024").bin_scheme == "symexp"
    for bad, match in (
        ({"preset": "dreamer"}, "preset: got 'dreamer'"),
        ({"preset": "rllib-2023", "head": "mse"}, "head: got 'mse'"),
        ({"preset": "rllib-2023", "bin_scheme": "symexp"}, "bin_scheme: got 'symexp'"),
    ):
        with pytest.raises(ValueError, match=match):
            check_config(DemoConfig(**bad))


def test_value_limit_is_the_critics_default_support():
    assert MAX_ABS_VALUE == pytest.approx(float(to_np(symexp(np.float32(20.0)))), rel=1e-6)
    assert MAX_ABS_VALUE == pytest.approx(4.85165e8, rel=1e-5)


def test_scale_limit_is_where_the_exact_values_leave_the_support():
    config = DemoConfig()
    peak = float(np.max(np.abs(demo_mdp(config).values())))
    assert peak == pytest.approx(3.754, abs=1e-3)  # seed 0 (the log line's range is [-3.754, 1.311])
    limit = MAX_ABS_VALUE / peak
    check_config(DemoConfig(scales=(1.0, 1e7, limit * (1 - 1e-9))))
    with pytest.raises(ValueError, match=r"scales: got 1\.29\d*e\+08, whose exact values reach 4\.85e\+08"):
        check_config(DemoConfig(scales=(1.0, limit * (1 + 1e-6))))
    # The limit follows the seed's MDP: another seed, another peak.
    other = DemoConfig(seed=5)
    other_peak = float(np.max(np.abs(demo_mdp(other).values())))
    assert other_peak != pytest.approx(peak, rel=1e-3)
    largest = f"largest scale for this MDP and seed: {MAX_ABS_VALUE / other_peak:.3g})"
    with pytest.raises(ValueError, match=re.escape(largest)):
        check_config(DemoConfig(seed=5, scales=(2 * MAX_ABS_VALUE / other_peak,)))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"scales": (math.inf,)}, "scales: got inf, expected finite numbers > 0"),
        ({"scales": (1.0, math.nan)}, "scales: got nan"),
        ({"scales": (-1.0,)}, "scales: got -1.0"),
        ({"scales": ()}, "scales: got no reward scale"),
        ({"scales": (1e-7,)}, "scales: got 1e-07, expected scales >= 1e-06"),
        ({"scales": (1e39,)}, "scales: got 1e+39, whose exact values reach"),
        ({"seed": -1}, "seed: got -1, expected an integer in [0, 4294967295]"),
        ({"seed": 2**32}, "seed: got 4294967296"),
        ({"seed": 1.5}, "seed: got 1.5"),
        ({"steps": 0}, "steps: got 0, expected an integer >= 1"),
        ({"steps": True}, "steps: got True"),
        ({"size": "huge"}, "size: got 'huge'"),
        ({"bin_scheme": "log"}, "bin_scheme: got 'log'"),
        ({"gamma": 1.0}, "gamma: got 1.0, expected a number in [0.0, 1.0)"),
        ({"lambda_": 1.5}, "lambda_: got 1.5"),
        ({"noise": -0.1}, "noise: got -0.1"),
        ({"learning_rate": math.inf}, "learning_rate: got inf"),
        ({"num_states": 3}, "num_states: got 3, expected an integer >= 4"),
        ({"horizon": 0}, "horizon: got 0"),
        ({"head": "softmax"}, f"head: got 'softmax', expected one of {list(heads.HEADS)}"),
        ({"head": None}, "head: got None"),
        (
            {"head": "hl_gauss", "bin_scheme": "symexp"},
            "bin_scheme: got 'symexp', expected one of ['uniform_symlog'] with head hl_gauss",
        ),
        ({"ensemble": 0}, "ensemble: got 0, expected an integer in [1, 64]"),
        ({"ensemble": 65}, "ensemble: got 65, expected an integer in [1, 64]"),
        ({"ensemble": 2.0}, "ensemble: got 2.0"),
        ({"ensemble": True}, "ensemble: got True"),
        ({"aggregation": "max"}, "aggregation: got 'max', expected one of ['mean', 'min', 'min_of_random', 'members']"),
        (
            {"aggregation": "min_of_random"},
            "aggregation: got 'min_of_random' with ensemble 1, expected an ensemble of 2",
        ),
    ],
)
def test_bad_settings_are_refused(changes, message):
    with pytest.raises(ValueError) as info:
        check_config(DemoConfig(**changes))
    assert message in str(info.value)


def test_flag_names_in_messages():
    with pytest.raises(ValueError, match=r"^--seed: got -1"):
        check_config(DemoConfig(seed=-1), {"seed": "--seed"})


def test_heads_and_ensembles_that_run():
    for head in demo_config.HEADS:
        for aggregation in demo_config.AGGREGATIONS:
            check_config(DemoConfig(head=head, ensemble=2, aggregation=aggregation))
    check_config(DemoConfig(ensemble=demo_config.MAX_ENSEMBLE))
    check_config(DemoConfig(head="mse", bin_scheme="uniform_symlog"))


def test_bin_scheme_defaults_to_what_the_head_supports():
    assert DemoConfig().bin_scheme == "symexp"
    assert DemoConfig(head="mse").bin_scheme == "symexp"
    assert DemoConfig(head="hl_gauss").bin_scheme == "uniform_symlog"
    assert DemoConfig(head="two_hot", bin_scheme="uniform_symlog").bin_scheme == "uniform_symlog"


def test_new_options_name_their_flags():
    flags = {"head": "--head", "ensemble": "--ensemble", "aggregation": "--aggregation", "bin_scheme": "--bin-scheme"}
    with pytest.raises(
        ValueError, match=r"^--bin-scheme: got 'symexp', expected one of \['uniform_symlog'\] with --head hl_gauss"
    ):
        check_config(DemoConfig(head="hl_gauss", bin_scheme="symexp"), flags)
    with pytest.raises(ValueError, match=r"^--aggregation: got 'min_of_random' with --ensemble 1"):
        check_config(DemoConfig(aggregation="min_of_random"), flags)
    with pytest.raises(ValueError, match=r"^--ensemble: got 0"):
        check_config(DemoConfig(ensemble=0), flags)


def test_run_demo_refuses_before_any_work():
    logged = []
    with pytest.raises(ValueError, match="scales: got inf"):
        run_demo(
            DemoConfig(size="nano", steps=1, num_states=8, scales=(1.0, math.inf)), progress=False, log=logged.append
        )
    with pytest.raises(ValueError, match="bin_scheme: got 'symexp'"):
        run_demo(
            DemoConfig(size="nano", steps=1, num_states=8, head="hl_gauss", bin_scheme="symexp"),
            progress=False,
            log=logged.append,
        )
    assert logged == []  # not even the first scale was started


def test_largest_seed_runs():
    config = DemoConfig(size="nano", steps=1, num_states=8, seed=MAX_SEED, scales=(1.0,), eval_every=1)
    check_config(config)
    # Unpinned: pinning would set XLA's flags for the rest of this test process.
    [result] = run_demo(config, progress=False, log=lambda *_: None, pin_numerics=False)
    assert result.steps == 1 and np.isfinite(result.relative_rmse)
