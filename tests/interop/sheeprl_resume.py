"""sheeprl's DreamerV3 run through its CLI entry with and without the critic swap, checkpointed and resumed.

`python -m tests.interop.sheeprl_resume OUT` (a process of its own: TorchRL's Hydra configs break sheeprl's)
runs sheeprl 0.8.4's DreamerV3 (the settings of `examples/sheeprl_critic.py`: dummy environment, CPU, tiny
sizes), `STEPS` policy steps with checkpoints (replay buffer included) at `STEPS // 2` and at the end:

- `stock`, `swap`: uninterrupted, without and with multicritic as critic and target critic
  (`sheeprl_critic` + `sheeprl_modules`);
- `swap->swap`, `swap->stock`: resumed (`checkpoint.resume_from=`) from `swap`'s midway checkpoint, with
  and without the swap;
- `stock->swap`, `stock->stock`: resumed from `stock`'s midway checkpoint, with and without the swap.

For each run it records the checkpoints sheeprl wrote (critic, target critic, critic optimizer state, gradient
step count), the critic and target critic right after `build_agent` (and the swap), and the critic and its
optimizer's state at the first `train()` call (before any update of the critic), all in sheeprl's layout, and
`torch.save`s them to OUT (`{run: {...}}`). `tests/interop/test_sheeprl_resume.py` checks them.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import copy  # noqa: E402
import glob  # noqa: E402
import importlib.util  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 64
# The example's settings, less its checkpoint ones (replaced below).
_spec = importlib.util.spec_from_file_location(
    "sheeprl_critic_example", os.path.join(ROOT, "examples", "sheeprl_critic.py")
)
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
OVERRIDES = [o for o in _example.OVERRIDES if not o.startswith(("checkpoint.", "buffer.checkpoint", "algo.total_"))]
OVERRIDES += [
    f"algo.total_steps={STEPS}",
    f"checkpoint.every={STEPS // 2}",
    "checkpoint.save_last=True",
    "buffer.checkpoint=True",
]
CHECKPOINT_KEYS = ("critic", "target_critic", "critic_optimizer", "per_rank_gradient_steps", "iter_num")


def _numpy_state(state):
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def run(swap: bool, logs: str, resume_from: str = None):
    """One sheeprl DreamerV3 run; returns what it recorded (see the module docstring)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from sheeprl.cli import check_configs, run_algorithm
    from sheeprl.utils.fabric import setup_module
    from sheeprl.utils.utils import dotdict

    import sheeprl.algos.dreamer_v3.dreamer_v3 as dreamer_v3
    from multicritic.interop.sheeprl import sheeprl_critic, sheeprl_modules

    record = {}
    build_agent, train = dreamer_v3.build_agent, dreamer_v3.train

    def build_agent_swapped(fabric, actions_dim, is_continuous, cfg, *args, **kwargs):
        world_model, actor, critic, target_critic, player = build_agent(
            fabric, actions_dim, is_continuous, cfg, *args, **kwargs
        )
        if swap:  # the swap, as in the example
            wm = cfg.algo.world_model
            ours = sheeprl_critic(
                critic.module.state_dict(),
                target_critic.state_dict(),
                gru_units=wm.recurrent_model.recurrent_state_size,
                num_z_categoricals=wm.stochastic_size,
                num_z_classes=wm.discrete_size,
            )
            critic_module, target_module = sheeprl_modules(ours)
            critic, target_critic = setup_module(fabric, critic_module), setup_module(fabric, target_module)
        record["loaded"] = {
            "critic": _numpy_state(critic.state_dict()),
            "target_critic": _numpy_state(target_critic.state_dict()),
        }
        return world_model, actor, critic, target_critic, player

    def train_recorded(
        fabric,
        world_model,
        actor,
        critic,
        target_critic,
        world_optimizer,
        actor_optimizer,
        critic_optimizer,
        *args,
        **kwargs,
    ):
        if "first_train" not in record:
            record["first_train"] = {
                "critic": _numpy_state(critic.state_dict()),
                "critic_optimizer": copy.deepcopy(critic_optimizer.state_dict()),
            }
        return train(
            fabric,
            world_model,
            actor,
            critic,
            target_critic,
            world_optimizer,
            actor_optimizer,
            critic_optimizer,
            *args,
            **kwargs,
        )

    overrides = [*OVERRIDES, f"log_root={logs}"]
    if resume_from:
        overrides.append(f"checkpoint.resume_from={resume_from}")
    dreamer_v3.build_agent, dreamer_v3.train = build_agent_swapped, train_recorded
    try:
        with initialize_config_module(version_base="1.3", config_module="sheeprl.configs"):
            cfg = compose(config_name="config", overrides=overrides)
        cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
        check_configs(cfg)
        run_algorithm(cfg)
    finally:
        dreamer_v3.build_agent, dreamer_v3.train = build_agent, train
    record["checkpoints"] = {}
    for path in glob.glob(os.path.join(logs, "**", "*.ckpt"), recursive=True):
        step = int(re.search(r"ckpt_(\d+)_\d+\.ckpt$", path).group(1))
        state = torch.load(path, map_location="cpu", weights_only=False)
        record["checkpoints"][step] = {k: state[k] for k in CHECKPOINT_KEYS}
        record.setdefault("paths", {})[step] = path
    return record


def main(out: str):
    runs = {}
    with tempfile.TemporaryDirectory() as logs:
        for name, swap, resume in (
            ("stock", False, None),
            ("swap", True, None),
            ("swap->swap", True, "swap"),
            ("swap->stock", False, "swap"),
            ("stock->swap", True, "stock"),
            ("stock->stock", False, "stock"),
        ):
            resume_from = runs[resume]["paths"][STEPS // 2] if resume else None
            runs[name] = run(swap, os.path.join(logs, name.replace(">", "")), resume_from)
    torch.save(runs, out)


if __name__ == "__main__":
    main(sys.argv[1])
