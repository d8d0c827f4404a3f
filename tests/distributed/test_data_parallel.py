"""Data-parallel training on existing engines equals the single-device step (SPEC: beyond one device)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(name, env):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "distributed", name)],
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_jax_data_parallel_equals_single_device():
    # Four virtual CPU devices, set before JAX starts (a fresh process).
    out = run_script("jax_data_parallel.py", {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert out["devices"] == 4 and out["replicated"]
    assert out["max_weight_diff"] < 1e-6
    assert out["max_loss_diff"] < 1e-5 and out["max_grad_norm_rel"] < 1e-5


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_jax_data_parallel_in_this_process():
    import jax
    import keras

    from multicritic import CriticNetwork, CriticTrainer
    from tests.distributed.common import batches, initial_weights

    if jax.device_count() < 2:
        pytest.skip("one JAX device here (the jax-multidevice nox session runs this with four)")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
    try:
        critic = CriticNetwork(model_size="nano")
        critic.set_weights(initial_weights(critic))
        trainer = CriticTrainer(critic)
        metrics = trainer.train_step(*batches("direct")[0])
        assert np.isfinite(float(metrics["total"]))
        with pytest.raises(ValueError, match="expected a multiple of the"):
            trainer.train_step(*(x[:-1] for x in batches("direct")[0]))
    finally:
        keras.distribution.set_distribution(None)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute")
def test_tensorflow_mirrored_strategy_equals_single_device():
    out = run_script("tf_mirrored.py", {"KERAS_BACKEND": "tensorflow"})
    assert out["variable"] == "MirroredVariable"
    assert out["max_weight_diff"] < 1e-6
    assert out["max_loss_diff"] < 1e-5 and out["max_grad_norm_rel"] < 1e-5
    # Every metric, including the non-finite target count summed over replicas.
    assert out["metric_keys_equal"] and out["max_metric_diff"] < 1e-5
    assert out["nonfinite_targets"] == 2.0


@pytest.mark.skipif(BACKEND != "torch", reason="torch.distributed")
def test_torch_ddp_two_processes_equal_one(tmp_path):
    from tests.distributed.torch_ddp import launch

    launch(1, str(tmp_path))
    launch(2, str(tmp_path))
    single = np.load(tmp_path / "rank0_of1.npz")
    ranks = [np.load(tmp_path / f"rank{r}_of2.npz") for r in (0, 1)]
    np.testing.assert_allclose(ranks[0]["losses"], single["losses"], rtol=1e-5)
    weight_keys = [k for k in single.files if k.startswith("w")]
    assert len(weight_keys) == 10  # fast and EMA
    for key in weight_keys:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key])  # EMA identical on every rank
        np.testing.assert_allclose(ranks[0][key], single[key], atol=1e-6)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.distributed")
def test_torch_worker_failure_surfaces_in_the_launcher(tmp_path):
    import time

    import torch.multiprocessing as mp

    from tests.distributed.torch_ddp import launch

    start = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException, match="injected failure on rank 1"):
        launch(2, str(tmp_path), fail_rank=1)
    assert time.monotonic() - start < 120  # an error, not a hang
