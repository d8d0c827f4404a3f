"""sheeprl's own DreamerV3 training with a multicritic critic and target critic.

Runs sheeprl 0.8.4's DreamerV3 (its dummy environment, CPU, small sizes)
twice from the same seed: as sheeprl ships it, then with its critic and
target critic swapped for one multicritic `CriticNetwork` through the
one-line adapters (`multicritic.interop.sheeprl.sheeprl_critic`, then
`sheeprl_modules`: views in sheeprl's own state-dict layout, so its
checkpoints keep sheeprl's keys and `checkpoint.resume_from` works with or
without the swap), starting from sheeprl's own initial critic weights.
sheeprl's optimizer, gradient clipping, target update (`tau`, hard copy at
step 0) and `critic_loss` run unchanged on the views.
Prints both runs' critic losses and fails unless they agree to 1e-5
(relative), and unless the critic's and target critic's weight changes over
the run agree to 1e-4 (relative to the largest change).

    pip install torch==2.13.0 sheeprl==0.8.4 multicritic
    KERAS_BACKEND=torch python examples/sheeprl_critic.py [hydra overrides ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

OVERRIDES = [
    "exp=dreamer_v3",
    "env=dummy",
    "algo=dreamer_v3_XS",
    "fabric.accelerator=cpu",
    "fabric.devices=1",
    "env.num_envs=1",
    "env.capture_video=False",
    "env.sync_env=True",
    "algo.cnn_keys.encoder=[]",
    "algo.cnn_keys.decoder=[]",
    "algo.mlp_keys.encoder=[state]",
    "algo.mlp_keys.decoder=[state]",
    "algo.dense_units=32",
    "algo.mlp_layers=2",
    "algo.world_model.recurrent_model.recurrent_state_size=24",
    "algo.world_model.stochastic_size=4",
    "algo.world_model.discrete_size=5",
    "algo.world_model.transition_model.hidden_size=32",
    "algo.world_model.representation_model.hidden_size=32",
    "algo.total_steps=64",
    "algo.learning_starts=16",
    "algo.per_rank_batch_size=2",
    "algo.per_rank_sequence_length=8",
    "algo.horizon=5",
    "algo.replay_ratio=0.25",
    "algo.run_test=False",
    "buffer.size=256",
    "buffer.memmap=False",
    "buffer.checkpoint=False",
    "metric.log_level=0",
    "checkpoint.every=100000",
    "checkpoint.save_last=False",
    "model_manager.disabled=True",
]


def _numpy(state):
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


def run(use_multicritic: bool, overrides=()):
    """sheeprl's DreamerV3 `main`; returns the critic loss of every gradient step and the critic's and
    target critic's weights (sheeprl's layout) before and after."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from sheeprl.cli import check_configs, run_algorithm
    from sheeprl.utils.fabric import setup_module
    from sheeprl.utils.utils import dotdict

    import sheeprl.algos.dreamer_v3.dreamer_v3 as dreamer_v3
    from multicritic.interop.sheeprl import export_sheeprl, sheeprl_critic, sheeprl_modules

    losses, weights = [], {}
    build_agent, critic_loss = dreamer_v3.build_agent, dreamer_v3.critic_loss

    def build_agent_recorded(fabric, actions_dim, is_continuous, cfg, *args, **kwargs):
        world_model, actor, critic, target_critic, player = build_agent(
            fabric, actions_dim, is_continuous, cfg, *args, **kwargs
        )
        weights["before"] = (_numpy(critic.module.state_dict()), _numpy(target_critic.state_dict()))
        if not use_multicritic:
            weights["after"] = lambda: (_numpy(critic.module.state_dict()), _numpy(target_critic.state_dict()))
            return world_model, actor, critic, target_critic, player
        wm = cfg.algo.world_model
        # The swap: sheeprl's weights in, then the two views in place of its critic and target critic.
        ours = sheeprl_critic(
            critic.module.state_dict(),
            target_critic.state_dict(),
            gru_units=wm.recurrent_model.recurrent_state_size,
            num_z_categoricals=wm.stochastic_size,
            num_z_classes=wm.discrete_size,
        )
        critic_module, target_module = sheeprl_modules(ours)
        critic, target_critic = setup_module(fabric, critic_module), setup_module(fabric, target_module)
        weights["after"] = lambda: export_sheeprl(ours)
        return world_model, actor, critic, target_critic, player

    def recorded_critic_loss(*args, **kwargs):
        loss = critic_loss(*args, **kwargs)
        losses.append(float(loss.detach()))
        return loss

    dreamer_v3.critic_loss, dreamer_v3.build_agent = recorded_critic_loss, build_agent_recorded
    try:
        with tempfile.TemporaryDirectory() as logs:
            with initialize_config_module(version_base="1.3", config_module="sheeprl.configs"):
                cfg = compose(config_name="config", overrides=[*OVERRIDES, f"log_root={logs}", *overrides])
            cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
            check_configs(cfg)
            run_algorithm(cfg)
    finally:
        dreamer_v3.build_agent, dreamer_v3.critic_loss = build_agent, critic_loss
    return losses, weights["before"], weights["after"]()


def weight_change_error(theirs, ours):
    """Largest difference of the two runs' weight changes (critic and target critic), relative to the largest
    change."""
    (b0, a0), (b1, a1) = theirs, ours
    worst, scale = 0.0, 0.0
    for before0, after0, before1, after1 in zip(b0, a0, b1, a1):
        for key in before0:
            delta0, delta1 = after0[key] - before0[key], after1[key] - before1[key]
            worst = max(worst, float(np.abs(delta0 - delta1).max()))
            scale = max(scale, float(np.abs(delta0).max()))
    return worst / scale


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="hydra overrides for sheeprl's config")
    args = parser.parse_args(argv)
    theirs, *their_weights = run(False, args.overrides)
    ours, *our_weights = run(True, args.overrides)
    print(f"{'step':>4} {'sheeprl':>12} {'multicritic':>12} {'rel. diff':>10}")
    for i, (a, b) in enumerate(zip(theirs, ours)):
        print(f"{i:4d} {a:12.6f} {b:12.6f} {abs(a - b) / max(abs(a), 1e-12):10.2e}")
    if len(theirs) != len(ours) or not theirs:
        sys.exit(f"different numbers of critic updates: sheeprl {len(theirs)}, multicritic {len(ours)}")
    worst = float(np.max(np.abs(np.subtract(theirs, ours)) / np.maximum(np.abs(theirs), 1e-12)))
    drift = weight_change_error(their_weights, our_weights)
    print(
        f"{len(ours)} critic updates: losses agree to {worst:.2e} (relative), weight changes to {drift:.2e} "
        "(relative to the largest)"
    )
    if worst > 1e-5:
        sys.exit("the critic losses differ by more than 1e-5 (relative)")
    if drift > 1e-4:
        sys.exit("the critic's weight changes differ by more than 1e-4 (relative)")
    return theirs, ours, drift


if __name__ == "__main__":
    main()
