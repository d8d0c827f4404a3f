"""The critic update as each peer ships it, timed side by side with multicritic's `CriticTrainer` step.

For each peer (sheeprl, RLlib, TorchRL) and each batch size N, builds the peer's own critic with its
own code at multicritic's `--size` architecture (h = gru_units, z = num_z_categoricals x num_z_classes,
num_dense_layers x dense_hidden_units, 255 bins), and a multicritic `CriticTrainer(CriticNetwork(
model_size=None, <the same sizes>, **multicritic.interop.<peer>.CRITIC_OPTIONS))` with that peer's
training settings; both get the same N latents (h ~ tanh N(0, 1), one-hot z, real-space targets
N(0, 100), weights U(0.5, 1)). Each is warmed up, then timed in blocks that alternate (peer, ours, ours,
peer, ...; the same number of steps per block, about `--block-seconds` for the slower one), so that noise
hits both; the table gives medians over `--repeats` blocks and ratio = peer time / multicritic time
(> 1: multicritic is faster). PyTorch on CPU only (the environment of tests/interop: torch 2.13.0,
ray[rllib] 2.60.0, sheeprl 0.8.4, torchrl 0.14.1, KERAS_BACKEND=torch); multicritic is also timed with
`jit_compile=True` (torch.compile of the whole step, which `"auto"` switches to on an accelerator after a step
kind's first 1000 calls; about 15 s to compile once per row; `--no-jit` leaves it out).

    KERAS_BACKEND=torch python benchmarks/peers/peers.py --size XS --batch 256 4096 15360 --json peers.json

Peers' trajectories are time-major, [T, B] with T * B = N. T is the divisor of N nearest the default
imagination horizon 15 (a tie: the larger; N = 256 and 4096: 16 x N/16; 15360: 15 x 1024); sheeprl and
RLlib also carry the horizon's last row (t = H, [T + 1, B]), which their losses drop; the table shows T x B.

What one timed step is, per row (paths under site-packages/; the line numbers are those of the pinned
versions; nothing outside the critic update, e.g. imagination or lambda-returns, is timed on either side):

* sheeprl 0.8.4 (algos/dreamer_v3/): critic and target critic from ``build_agent`` (agent.py:1030;
  the critic MLP :1252-1271, target = deepcopy :1326, both ``setup_module``-wrapped, :1323/:1329) with
  hydra ``exp=dreamer_v3 algo=dreamer_v3_XS`` + dense_units/mlp_layers/recurrent_state_size/
  stochastic_size/discrete_size = the size; optimizer as ``main`` makes it (dreamer_v3.py:646, hydra
  ``cfg.algo.critic.optimizer``: torch Adam lr 3e-5, eps 1e-5, fused=True; ``fabric.setup_optimizers``
  :651); Fabric cpu, 32-true. Step = the target update of ``main`` at a step != 0 (dreamer_v3.py:871-877,
  tau = cfg.algo.critic.tau = 0.02, every step) + the critic lines of ``behaviour_learning``
  (dreamer_v3.py:468-474): ``critic_loss`` (:389-400; fast and target forward on the T rows of the
  [T + 1, B, D] trajectory, two-hot NLL of the targets + of the target critic's mean) under
  ``autocast_cache_scope`` and sheeprl's ``update`` (utils/fabric.py:114-150: zero_grad, fabric.backward,
  all-reduce (a no-op), fabric.clip_gradients(100), optimizer.step). ``algo.compile`` stays off (its default);
  ``sheeprl_compiled`` sets it (``algo.compile.enabled=True``: ``critic_loss`` through ``torch.compile``, its
  mode ``reduce-overhead``, utils/compile.py; the update stays eager).
  multicritic: sheeprl.CRITIC_OPTIONS (2023 architecture, input z|h), Adam lr 3e-5 eps 1e-5, clip 100,
  EMA decay 0.98 (= 1 - tau).
* RLlib 2.60.0 (ray/rllib/algorithms/dreamerv3/): ``CriticNetwork(input_size=h + z, model_size=size)``
  (torch/models/critic_network.py:16; RLlib's size table is multicritic's: XS = 1 x 256, S = 2 x 512;
  a size whose dims RLlib's table lacks gets RLlib's own ``MLP`` with num_dense_layers/dense_hidden_units
  overrides, as tests/interop/upstream.py does, stated in the row) + ``init_ema()``; optimizer
  torch Adam(eps 1e-5) at config.critic_lr 3e-5 (torch/dreamerv3_torch_learner.py:84, dreamerv3.py:105).
  Step = fast forward with logits (as torch/models/dreamer_model.py:298-303) and EMA forward under no_grad
  (:325-331), both on all T + 1 rows; ``DreamerV3TorchLearner._compute_critic_loss``
  (torch/dreamerv3_torch_learner.py:647-781, called unbound on a stub whose metrics logging is a no-op,
  as tests/interop/upstream.py does); ``optim.zero_grad(set_to_none=True)`` + backward (:166-169);
  ``clip_gradients(grads, grad_clip=100, grad_clip_by="global_norm")`` (:120, utils/torch_utils.py:97);
  the non-finite check of ``TorchLearner.apply_gradients`` (core/learner/torch/torch_learner.py:204-223)
  and ``optim.step()``; ``CriticNetwork.update_ema()`` (critic_network.py:153-168, called by
  dreamerv3_learner.py:26-31). multicritic: rllib.CRITIC_OPTIONS (our defaults), Adam lr 3e-5 eps 1e-5,
  clip 100, EMA decay 0.98.
* TorchRL 0.14.1: value model from sota-implementations/dreamer_v3/dreamer_v3_agent.py:737-759
  ``build_value`` (networks: value_layers, hidden_dim, rnn_hidden_dim, num_categoricals, num_classes =
  the size; 255 bins, norm_eps 1e-4), ``DreamerV3ValueLoss(value_model, value_loss="two_hot",
  num_value_bins=255, slow_critic_regularization=1.0)`` (torchrl/objectives/dreamer_v3.py:1059; as
  sota train.py:440-446, without its ``actor_loss`` argument, which only shares gamma), ``SoftUpdate(loss,
  tau=0.02)`` (objectives/utils.py:536, train.py:447) and the optimizer TorchRL ships:
  ``DreamerV3Optimizer(list(value_loss.parameters()))`` with its defaults (AGC 0.3, LaProp-style RMS then
  momentum, lr 4e-5, eps 1e-20, 1000 warm-up steps; torchrl/trainers/algorithms/dreamer_v3.py:25-190,
  train.py:454-460, whose cfg.optimization values come from a config.yaml the wheel does not ship: the class
  defaults are used, which are the official code's; no global-norm clip). Step = what
  ``DreamerV3OptimizationStepper`` does for this loss (trainers/algorithms/dreamer_v3.py:363-378 eager, :464-466):
  ``value_loss(td)`` (objectives/dreamer_v3.py:
  1317-1398: fast forward, slow forward under no_grad, two-hot CE of the targets and of the decoded slow
  value, weighted mean) on a TensorDict {belief, state, lambda_target, discount_weight} of batch [T, B];
  ``optimizer.zero_grad(set_to_none=False)``, backward, ``optimizer.step()``, ``SoftUpdate.step()``.
  multicritic: torchrl.CRITIC_OPTIONS (2024 architecture), ``multicritic.training.optimizers.official_optimizer()``
  (the same AGC/LaProp/warm-up), grad_clip=None, EMA decay 0.98.

multicritic's step on every row: ``CriticTrainer.train_step(h, z, targets, weights)``
(multicritic/training/trainer.py: fast + EMA forward, loss with the EMA regulariser, backward, clip,
optimizer, EMA update), PyTorch eager (`jit_compile=False`: what `"auto"` runs on a CPU) and compiled
(`jit_compile=True`: what `"auto"` switches to on an accelerator; `--no-jit` leaves it out).

The official DreamerV3 (JAX) runs in its own environment: see benchmarks/peers/peers_official.py. It pairs its
times with multicritic's JAX step itself, through this script's ``--serve dreamerv3`` mode (a child
process in an environment with multicritic and JAX, e.g. ``--pair-python /work/venv/bin/python``),
interleaved block by block as here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PEERS = ("sheeprl", "sheeprl_compiled", "rllib", "torchrl")
PEER_MODULES = {
    "sheeprl": "sheeprl",
    "sheeprl_compiled": "sheeprl",
    "rllib": "ray.rllib.algorithms.dreamerv3.torch",
    "torchrl": "torchrl",
}
HORIZON = 15  # the default imagination horizon of all peers (sheeprl algo.horizon, RLlib horizon_H, official)
BINS = 255
TAU = 0.02  # every peer's slow-critic rate (multicritic: ema_decay = 1 - TAU)


# --------------------------------------------------------------------------- shared (stdlib only at import)
def horizon_split(n):
    """(T, B) with T * B = n: T the divisor of n nearest HORIZON (a tie: the larger)."""
    divisors = [t for t in range(1, n + 1) if n % t == 0]
    t = min(divisors, key=lambda d: (abs(d - HORIZON), -d))
    return t, n // t


def latents(n, gru, cats, classes, seed):
    """numpy h [n, gru], z [n, cats, classes] (one-hot), targets [n] (real space), weights [n]; as
    benchmarks/ours/train_step.py draws them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h = np.tanh(rng.normal(size=(n, gru))).astype(np.float32)
    z = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=(n, cats))]
    targets = (rng.normal(size=n) * 100).astype(np.float32)
    weights = rng.uniform(0.5, 1.0, size=n).astype(np.float32)
    return h, z, targets, weights


def interleave(blocks, repeats, block_seconds):
    """`{name: run_block(count) -> seconds per step}` timed in alternating order (A B .., .. B A).

    Each is warmed up first (two blocks of 2 steps; the second estimates the step time); every timed block
    runs the same number of steps, sized so that the slowest one's block lasts about `block_seconds`.
    Returns `({name: [seconds per step, ...]}, steps per block)`.
    """
    per_step = {}
    for name, run_block in blocks.items():
        run_block(2)
        per_step[name] = run_block(2)
    count = max(1, int(block_seconds / max(per_step.values())))
    times = {name: [] for name in blocks}
    for r in range(repeats):
        for name in list(blocks) if r % 2 == 0 else list(blocks)[::-1]:
            times[name].append(blocks[name](count))
    return times, count


def torch_block(step):
    """run_block(count) for a zero-argument PyTorch step returning a scalar tensor (or a metrics dict)."""

    def run_block(count):
        start = time.perf_counter()
        for _ in range(count):
            out = step()
        (out["total"] if isinstance(out, dict) else out).item()
        return (time.perf_counter() - start) / count

    return run_block


# --------------------------------------------------------------------------- multicritic
def multicritic_settings(peer):
    """(critic options, trainer kwargs) reproducing `peer`'s critic and its update settings."""
    import keras

    if peer == "dreamerv3":
        from multicritic.interop.dreamerv3 import CRITIC_OPTIONS
    else:
        # A peer's variant (sheeprl_compiled) has the peer's critic.
        CRITIC_OPTIONS = importlib.import_module(f"multicritic.interop.{peer.removesuffix('_compiled')}").CRITIC_OPTIONS
    critic = dict(CRITIC_OPTIONS, num_buckets=BINS, ema_decay=1.0 - TAU)
    if peer in ("torchrl", "dreamerv3"):  # AGC + LaProp with warm-up, no global clip
        from multicritic.training.optimizers import official_optimizer

        trainer = dict(optimizer=official_optimizer(), grad_clip=None)
    else:  # Adam 3e-5 (eps 1e-5), global-norm clip 100: RLlib's and sheeprl's configs
        trainer = dict(learning_rate=3e-5, epsilon=1e-5, grad_clip=100.0)
    keras.utils.set_random_seed(0)
    return critic, trainer


def make_multicritic(peer, dims, arrays, jit_compile=False):
    """A zero-argument step: one `CriticTrainer.train_step` on the arrays (backend tensors)."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer

    options, trainer_kwargs = multicritic_settings(peer)
    critic = CriticNetwork(model_size=None, **dims, **options)
    trainer = CriticTrainer(critic, jit_compile=jit_compile, **trainer_kwargs)
    data = tuple(keras.ops.convert_to_tensor(x) for x in arrays)
    return lambda: trainer.train_step(*data)


# --------------------------------------------------------------------------- sheeprl
def make_sheeprl(dims, arrays, compile_loss=False):
    import gymnasium as gym
    import numpy as np
    import torch
    from hydra import compose, initialize_config_module
    from lightning.fabric import Fabric
    from omegaconf import OmegaConf

    import hydra
    import sheeprl.algos.dreamer_v3.dreamer_v3 as dv3
    from sheeprl.algos.dreamer_v3.agent import build_agent
    from sheeprl.utils.compile import compiled
    from sheeprl.utils.fabric import autocast_cache_scope, update
    from sheeprl.utils.utils import dotdict

    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    cats, classes = dims["num_z_categoricals"], dims["num_z_classes"]
    overrides = [
        "exp=dreamer_v3",
        "env=dummy",
        "algo=dreamer_v3_XS",
        "fabric.accelerator=cpu",
        "fabric.devices=1",
        "env.num_envs=1",
        "env.capture_video=False",
        "algo.cnn_keys.encoder=[]",
        "algo.cnn_keys.decoder=[]",
        "algo.mlp_keys.encoder=[state]",
        "algo.mlp_keys.decoder=[state]",
        f"algo.dense_units={units}",
        f"algo.mlp_layers={layers}",
        f"algo.world_model.recurrent_model.recurrent_state_size={gru}",
        f"algo.world_model.stochastic_size={cats}",
        f"algo.world_model.discrete_size={classes}",
        f"algo.compile.enabled={compile_loss}",
    ]
    with initialize_config_module(version_base="1.3", config_module="sheeprl.configs"):
        cfg = compose(config_name="config", overrides=overrides)
    cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
    fabric = Fabric(accelerator="cpu", devices=1, precision=cfg.fabric.precision)
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-20, 20, (10,), np.float32)})
    torch.manual_seed(0)
    _, _, critic, target_critic, _ = build_agent(fabric, (2,), False, cfg, obs_space)
    critic_optimizer = hydra.utils.instantiate(
        cfg.algo.critic.optimizer, params=critic.parameters(), _convert_="all"
    )  # dreamer_v3.py:646
    critic_optimizer = fabric.setup_optimizers(critic_optimizer)  # dreamer_v3.py:651

    h, z, targets, weights = arrays
    n = h.shape[0]
    t, b = horizon_split(n)
    latent = np.concatenate([z.reshape(n, -1), h], -1).reshape(t, b, -1)  # cat(z_flat, h): dreamer_v3.py:164
    traj = torch.as_tensor(np.concatenate([latent, latent[:1]], 0))  # + the horizon's last row, dropped
    lambda_values = torch.as_tensor(targets.reshape(t, b, 1))
    discount = torch.as_tensor(np.concatenate([weights.reshape(t, b), np.ones((1, b), np.float32)], 0)[..., None])
    tau = cfg.algo.critic.tau
    assert tau == TAU and cfg.algo.critic.per_rank_target_network_update_freq == 1

    def step():
        for cp, tcp in zip(critic.module.parameters(), target_critic.parameters()):  # dreamer_v3.py:876-877
            tcp.data.copy_(tau * cp.data + (1 - tau) * tcp.data)
        with autocast_cache_scope(fabric):  # dreamer_v3.py:468-474
            value_loss = compiled(dv3.critic_loss, fabric, cfg)(critic, target_critic, traj, lambda_values, discount)
        update(fabric, value_loss, critic_optimizer, cfg.algo.critic.clip_gradients, error_if_nonfinite=False)
        return value_loss.detach()

    opt = cfg.algo.critic.optimizer
    note = (
        f"build_agent critic + target (MLP {layers}x{units}, in z|h {cats * classes}+{gru}); "
        f"{opt['_target_'].split('.')[-1]} lr {opt['lr']} eps {opt['eps']} fused={opt.get('fused')}; "
        f"clip {cfg.algo.critic.clip_gradients}; tau {tau}"
        + (f"; algo.compile (torch.compile of critic_loss, mode {cfg.algo.compile.mode})" if compile_loss else "")
    )
    return step, (t + 1, b), note


# --------------------------------------------------------------------------- RLlib
def make_rllib(dims, arrays, size):
    import types

    import numpy as np
    import torch
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config
    from ray.rllib.algorithms.dreamerv3.torch.dreamerv3_torch_learner import DreamerV3TorchLearner
    from ray.rllib.algorithms.dreamerv3.torch.models.components.mlp import MLP
    from ray.rllib.algorithms.dreamerv3.torch.models.critic_network import CriticNetwork
    from ray.rllib.algorithms.dreamerv3.utils import get_dense_hidden_units, get_num_dense_layers
    from ray.rllib.utils.torch_utils import clip_gradients

    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    cats, classes = dims["num_z_categoricals"], dims["num_z_classes"]
    config = DreamerV3Config()
    in_size = gru + cats * classes
    torch.manual_seed(0)
    try:
        exact = (get_dense_hidden_units(size), get_num_dense_layers(size)) == (units, layers)
    except KeyError:
        exact = False
    if exact:
        critic = CriticNetwork(input_size=in_size, model_size=size)
        note = f'CriticNetwork(input_size={in_size}, model_size="{size}") ({layers}x{units})'
    else:  # RLlib's own MLP with its overrides (mlp.py:59-62), as tests/interop/upstream.py does
        base = next(
            s for s in ("nano", "micro", "mini", "XXS", "XS", "S", "M", "L", "XL") if get_dense_hidden_units(s) == units
        )
        critic = CriticNetwork(input_size=in_size, model_size=base)
        critic.mlp = MLP(input_size=in_size, model_size=base, num_dense_layers=layers, dense_hidden_units=units)
        critic.mlp_ema = MLP(input_size=in_size, model_size=base, num_dense_layers=layers, dense_hidden_units=units)
        note = f'CriticNetwork(model_size="{base}") + MLP(num_dense_layers={layers}, dense_hidden_units={units})'
    critic.init_ema()  # dreamerv3_rl_module.py:80
    optim = torch.optim.Adam(critic.parameters(), eps=1e-5)  # dreamerv3_torch_learner.py:84
    for group in optim.param_groups:
        group["lr"] = config.critic_lr  # register_optimizer(lr_or_lr_schedule=config.critic_lr)
    fast = [p for p in critic.parameters() if p.requires_grad]

    h, z, targets, weights = arrays
    n = h.shape[0]
    t, b = horizon_split(n)

    def with_last_row(x):  # [T*B, ...] -> [(T+1)*B, ...]: the horizon's last row (the loss drops it)
        return np.concatenate([x, x[:b]], 0)

    h_t, z_t = torch.as_tensor(with_last_row(h)), torch.as_tensor(with_last_row(z))
    rewards = torch.zeros(t + 1, b)
    loss_weights = torch.as_tensor(np.concatenate([weights.reshape(t, b), np.ones((1, b), np.float32)], 0))
    value_targets = torch.as_tensor(targets.reshape(t, b))
    stub = types.SimpleNamespace(
        _device=torch.device("cpu"), metrics=types.SimpleNamespace(log_dict=lambda *a, **k: None)
    )

    def step():
        _, logits = critic(h=h_t, z=z_t, use_ema=False, return_logits=True)  # dreamer_model.py:298-303
        with torch.no_grad():  # dreamer_model.py:325-331
            v_ema = critic(h=h_t, z=z_t, return_logits=False, use_ema=True)
        dream_data = {
            "rewards_dreamed_t0_to_H_BxT": rewards,
            "values_symlog_dreamed_logits_t0_to_HxBxT_wm_detached": logits,
            "v_symlog_dreamed_ema_t0_to_H_BxT": v_ema.reshape(t + 1, b),
            "dream_loss_weights_t0_to_H_BxT": loss_weights,
        }
        loss = DreamerV3TorchLearner._compute_critic_loss(
            stub,
            module_id="default_policy",
            config=config,
            dream_data=dream_data,
            value_targets_t0_to_Hm1_BxT=value_targets,
        )
        optim.zero_grad(set_to_none=True)  # dreamerv3_torch_learner.py:166-169
        loss.backward()
        grads = {i: p.grad for i, p in enumerate(fast)}
        clip_gradients(grads, grad_clip=config.critic_grad_clip_by_global_norm, grad_clip_by="global_norm")
        for i, grad in grads.items():  # torch_learner.py:204-223
            if not torch.isfinite(grad).all():
                grad = torch.nan_to_num(grad)
            fast[i].grad = grad
        optim.step()
        critic.update_ema()  # dreamerv3_learner.py:31
        return loss.detach()

    note += (
        f"; Adam lr {config.critic_lr} eps 1e-5; clip {config.critic_grad_clip_by_global_norm}; "
        f"ema decay {critic.ema_decay}"
    )
    return step, (t + 1, b), note


# --------------------------------------------------------------------------- TorchRL
def make_torchrl(dims, arrays):
    import pathlib

    import torch
    import torchrl
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from torchrl.objectives import DreamerV3ValueLoss
    from torchrl.objectives.utils import SoftUpdate
    from torchrl.trainers.algorithms import DreamerV3Optimizer

    sota = pathlib.Path(torchrl.__file__).parent.parent / "sota-implementations" / "dreamer_v3"
    if str(sota) not in sys.path:
        sys.path.insert(0, str(sota))
    import dreamer_v3_agent  # noqa: E402  (TorchRL's own sota script)

    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    cats, classes = dims["num_z_categoricals"], dims["num_z_classes"]
    cfg = OmegaConf.create(
        {
            "networks": {
                "num_categoricals": cats,
                "num_classes": classes,
                "rnn_hidden_dim": gru,
                "num_value_bins": BINS,
                "value_layers": layers,
                "hidden_dim": units,
                "norm_eps": 1e-4,
            }
        }
    )
    torch.manual_seed(0)
    value_model = dreamer_v3_agent.build_value(cfg=cfg)
    value_loss = DreamerV3ValueLoss(
        value_model, value_loss="two_hot", num_value_bins=BINS, slow_critic_regularization=1.0
    )
    updater = SoftUpdate(value_loss, tau=TAU)
    optimizer = DreamerV3Optimizer(list(value_loss.parameters()))

    h, z, targets, weights = arrays
    n = h.shape[0]
    t, b = horizon_split(n)
    data = TensorDict(
        {
            "belief": torch.as_tensor(h.reshape(t, b, gru)),
            "state": torch.as_tensor(z.reshape(t, b, cats * classes)),
            "lambda_target": torch.as_tensor(targets.reshape(t, b, 1)),
            "discount_weight": torch.as_tensor(weights.reshape(t, b, 1)),
        },
        batch_size=[t, b],
    )

    def step():
        losses, _ = value_loss(data)  # trainers/algorithms/dreamer_v3.py:363-378
        total = sum(v for k, v in losses.items() if isinstance(k, str) and k.startswith("loss_"))
        optimizer.zero_grad(set_to_none=False)
        total.backward()
        optimizer.step()  # :464
        updater.step()  # :466
        return total.detach()

    group = optimizer.param_groups[0]
    note = (
        f"build_value (DreamerV3MLP {layers}x{units}, in h|z {gru}+{cats * classes}); DreamerV3Optimizer "
        f"lr {group['lr']} agc {group['agc']} eps {group['eps']} warmup {group['warmup_steps']}; "
        f"SoftUpdate tau {TAU}"
    )
    return step, (t, b), note


# --------------------------------------------------------------------------- the benchmark
def missing(peer):
    """Why `peer` cannot run here (None when it can)."""
    try:
        if importlib.util.find_spec(PEER_MODULES[peer].split(".")[0]) is None:
            return f"{PEER_MODULES[peer]} is not installed"
        importlib.import_module(PEER_MODULES[peer])
    except ImportError as err:
        return f"{PEER_MODULES[peer]}: {err}"
    return None


def make_peer(peer, dims, arrays, size):
    if peer in ("sheeprl", "sheeprl_compiled"):
        return make_sheeprl(dims, arrays, compile_loss=peer == "sheeprl_compiled")
    if peer == "rllib":
        return make_rllib(dims, arrays, size)
    return make_torchrl(dims, arrays)


def _threads():
    import torch

    return torch.get_num_threads()


def run(size, batches, repeats, block_seconds, jit, peers):
    from multicritic import get_model_dims

    dims = dict(get_model_dims(size))
    records = []
    for peer in peers:
        reason = missing(peer)
        if reason:
            print(f"skipping {peer}: {reason}", file=sys.stderr)
            records.append({"peer": peer, "size": size, "skipped": reason})
            continue
        for batch in batches:
            arrays = latents(batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=batch)
            theirs, layout, note = make_peer(peer, dims, arrays, size)
            blocks = {peer: torch_block(theirs), "multicritic": torch_block(make_multicritic(peer, dims, arrays))}
            if jit:
                blocks["multicritic_jit"] = torch_block(make_multicritic(peer, dims, arrays, jit_compile=True))
            times, count = interleave(blocks, repeats, block_seconds)
            ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
            record = {
                "peer": peer,
                "backend": "torch",
                "size": size,
                "dims": dims,
                "batch": batch,
                "layout": list(layout),
                "constructor": note,
                "peer_ms": ms[peer],
                "multicritic_ms": ms["multicritic"],
                "ratio": ms[peer] / ms["multicritic"],
                "peer_samples": [v * 1e3 for v in times[peer]],
                "multicritic_samples": [v * 1e3 for v in times["multicritic"]],
                "repeats": repeats,
                "steps_per_block": count,
                "threads": _threads(),
            }
            if jit:
                record.update(multicritic_jit_ms=ms["multicritic_jit"], ratio_jit=ms[peer] / ms["multicritic_jit"])
            records.append(record)
            print(f"{peer} N={batch}: peer {ms[peer]:.3f} ms, multicritic {ms['multicritic']:.3f} ms", file=sys.stderr)
    return records


def table(records):
    rows = [r for r in records if "skipped" not in r]
    jit = any("multicritic_jit_ms" in r for r in rows)
    head = "| peer | batch N | rows (T x B) | peer ms | multicritic ms | ratio (peer/ours) |"
    rule = "|---|---:|---:|---:|---:|---:|"
    if jit:
        head += " multicritic jit ms | ratio (peer/ours jit) |"
        rule += "---:|---:|"
    lines = [head, rule]
    for r in rows:
        line = (
            f"| {r['peer']} | {r['batch']} | {r['layout'][0]} x {r['layout'][1]} | {r['peer_ms']:.3f} | "
            f"{r['multicritic_ms']:.3f} | {r['ratio']:.2f} |"
        )
        if jit:
            line += f" {r['multicritic_jit_ms']:.3f} | {r['ratio_jit']:.2f} |" if "ratio_jit" in r else " | |"
        lines.append(line)
    notes = {}
    for r in rows:
        notes.setdefault(r["peer"], r["constructor"])
    lines.append("")
    lines += [f"- {peer}: {note}" for peer, note in notes.items()]
    lines += [f"- {r['peer']}: skipped ({r['skipped']})" for r in records if "skipped" in r]
    if rows:
        d = rows[0]["dims"]
        lines.append(
            f"- size {rows[0]['size']}: h {d['gru_units']}, z {d['num_z_categoricals']}x"
            f"{d['num_z_classes']}, {d['num_dense_layers']} x {d['dense_hidden_units']} units, {BINS} bins; "
            f"medians of {rows[0]['repeats']} interleaved blocks"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- pairing server (official JAX)
def serve(peer, size):
    """Times multicritic's step for another process (benchmarks/peers/peers_official.py), one JSON line per request.

    Requests on stdin: {"batch": N, "count": c}; the step for N (with `peer`'s options, on the running Keras
    backend, inputs from `latents(N, ..., seed=N)`) is built on first use. Each reply is one stdout line
    "PEERS {"seconds": <per step>}"; other output of the libraries goes to stderr.
    """
    import keras

    from multicritic import get_model_dims

    dims = get_model_dims(size)
    backend = keras.backend.backend()
    steps = {}
    reply = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        n = request["batch"]
        if n not in steps:
            arrays = latents(n, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=n)
            steps[n] = make_multicritic(peer, dims, arrays)
        step = steps[n]
        start = time.perf_counter()
        for _ in range(request["count"]):
            metrics = step()
        total = metrics["total"]
        if backend == "jax":
            total.block_until_ready()
        elif backend == "tensorflow":
            total.numpy()
        else:
            total.item()
        seconds = (time.perf_counter() - start) / request["count"]
        reply.write("PEERS " + json.dumps({"seconds": seconds, "backend": backend}) + "\n")
        reply.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="XS", help="multicritic model size (nano ... XL)")
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096, 15360])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=1.0, help="length of one timed block")
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    parser.add_argument(
        "--jit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time multicritic with jit_compile=True (--no-jit: eager only)",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's); 1 on a shared machine")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--serve", metavar="PEER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.size)
        return
    if os.environ.get("KERAS_BACKEND", "torch") != "torch":
        raise SystemExit("the peers are PyTorch code: run with KERAS_BACKEND=torch")
    os.environ["KERAS_BACKEND"] = "torch"
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    records = run(args.size, args.batch, args.repeats, args.block_seconds, args.jit, args.peers)
    print(table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
