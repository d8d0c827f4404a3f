"""The REAL torch DreamerV3 critics of RLlib, sheeprl and TorchRL, built small on CPU.

Each ``make_*_case()`` builds one upstream critic with upstream's own code (``torch.manual_seed(0)``
before it, so upstream's own initialisers run), perturbs it deterministically so that a mapping error
(a transposed kernel, a swapped norm scale/offset, a permuted input, a dropped bias) changes the numbers,
feeds it seeded inputs, and returns a dict of numpy arrays (float32 unless said):

* ``fast/<key>`` and ``slow/<key>``: the fast critic and its slow (EMA / target) copy, keys and layout
  exactly as upstream's ``state_dict()`` (torch ``Linear.weight`` is ``[out, in]``; nothing transposed);
* ``h`` ``[T, B, deter]``, ``z`` ``[T, B, cats, classes]``, ``latent`` ``[T, B, deter + cats*classes]``:
  the inputs and the critic's input as the upstream code combines them (captured from upstream's own
  forward where upstream concatenates inside it);
* ``logits`` / ``slow_logits`` ``[T, B, bins]``, ``value`` / ``slow_value`` ``[T, B]`` as upstream decodes
  them (``meta`` says symlog or real space), ``bins`` the support upstream decodes with;
* ``target`` ``[T, B]`` (real-space lambda-returns, |x| <= 50), ``weights`` ``[T, B]``;
* ``loss``: upstream's critic loss incl. its slow-critic regulariser, computed by upstream's loss code;
  ``grad_logits``: d loss / d logits ``[T, B, bins]``;
* ``slow_after/<key>``: the slow copy after one upstream slow-critic update (upstream's own function
  where one exists);
* ``meta``: a string (numpy unicode scalar) saying what each entry means for that upstream.

Given a dict ``modules``, each function also leaves in it ``load(fast_state, slow_state)`` (upstream's own
``load_state_dict``, strict, of numpy state dicts in upstream's layout) and ``logits(slow)`` (upstream's
forward on ``h``/``z`` -> ``[T, B, bins]`` numpy), so that exported weights can be run by the real code.

Recipe (the same for all three): h = deter 24, z = 4 categoricals x 5 classes, critic MLP 2 hidden
layers x 32 units, 255 bins, T=3, B=4. After upstream's init, with one ``np.random.default_rng(0)``
stream, over the fast parameters in ``state_dict`` order: head weight and bias ~ N(0, 0.05); norm
scales 1 + N(0, 0.1), norm offsets N(0, 0.1); hidden Linear biases (TorchRL only; the others have none)
N(0, 0.05); hidden Linear weights keep upstream's init. Then, from the same stream and in the same key
order, slow = fast + N(0, 0.01). Inputs from ``np.random.default_rng(2)``: h ~ N(0, 1), z = softmax(4 *
N(0, 1)) over the classes (one-hot-ish probabilities). ``np.random.default_rng(1)``: target ~ U(-50, 50),
then weights ~ U(0.1, 1).

The packages are imported inside the functions; they live in /work/venv-interop (see
tests/data/interop/generate_torch_goldens.py for the pinned versions).
"""

from __future__ import annotations

import numpy as np

T, B = 3, 4
DETER, CATS, CLASSES = 24, 4, 5
UNITS, LAYERS, BINS = 32, 2, 255
STOCH = CATS * CLASSES


# --------------------------------------------------------------------------- shared helpers
def inputs():
    """h [T,B,24], z [T,B,4,5] (probabilities), target [T,B] (real space), weights [T,B]."""
    rng = np.random.default_rng(2)
    h = rng.normal(size=(T, B, DETER)).astype(np.float32)
    zl = 4.0 * rng.normal(size=(T, B, CATS, CLASSES))
    z = np.exp(zl - zl.max(-1, keepdims=True))
    z = (z / z.sum(-1, keepdims=True)).astype(np.float32)
    rng1 = np.random.default_rng(1)
    target = rng1.uniform(-50.0, 50.0, size=(T, B)).astype(np.float32)
    weights = rng1.uniform(0.1, 1.0, size=(T, B)).astype(np.float32)
    return h, z, target, weights


def _kinds(mlp_root, has_head=True):
    """{param name (relative to mlp_root): kind} with kinds hidden_w/hidden_b/norm_w/norm_b/head_w/head_b;
    the last Linear is the head when has_head."""
    import torch

    linears = [n for n, m in mlp_root.named_modules() if isinstance(m, torch.nn.Linear)]
    head = linears[-1] if has_head else None
    kinds = {}
    for name, mod in mlp_root.named_modules():
        if name == "":
            continue
        for pname, _ in mod.named_parameters(recurse=False):
            full = f"{name}.{pname}"
            if isinstance(mod, torch.nn.Linear):
                tag = "head" if name == head else "hidden"
                kinds[full] = f"{tag}_{'w' if pname == 'weight' else 'b'}"
            elif "norm" in type(mod).__name__.lower():
                kinds[full] = "norm_w" if pname == "weight" else "norm_b"
            else:
                raise AssertionError(f"unexpected parameter {full} in {type(mod).__name__}")
    return kinds


def _draw(rng, kind, value):
    shape = value.shape
    if kind == "hidden_w":
        return value
    if kind in ("head_w", "head_b", "hidden_b"):
        return rng.normal(0.0, 0.05, size=shape)
    if kind == "norm_w":
        return 1.0 + rng.normal(0.0, 0.1, size=shape)
    if kind == "norm_b":
        return rng.normal(0.0, 0.1, size=shape)
    raise AssertionError(kind)


def perturb(fast_params, slow_params, kinds):
    """Set fast (list of (key, tensor)) per kind, then slow = fast + N(0, 0.01); one rng(0) stream."""
    import torch

    rng = np.random.default_rng(0)
    with torch.no_grad():
        for key, p in fast_params:
            new = _draw(rng, kinds[key], p.detach().cpu().numpy())
            p.copy_(torch.as_tensor(np.asarray(new, np.float32)))
        for (_, p), (_, s) in zip(fast_params, slow_params):
            s.copy_(p + torch.as_tensor(rng.normal(0.0, 0.01, size=tuple(p.shape)).astype(np.float32)))


def _np(t):
    return t.detach().cpu().numpy().astype(np.float32)


def _state(prefix, named):
    return {f"{prefix}/{k}": _np(v) for k, v in named}


class _GradCapture:
    """Forward hook: keeps the module output of the calls made with grad enabled, with retain_grad()."""

    def __init__(self, module):
        self.outputs = []
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        if out.requires_grad:
            out.retain_grad()
            self.outputs.append(out)

    def remove(self):
        self.handle.remove()


def _input_capture(module):
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    return seen, handle


# --------------------------------------------------------------------------- RLlib (ray 2.60.0, torch)
def make_rllib_torch_case(modules=None):
    """RLlib's torch DreamerV3 critic (ray 2.60.0), 2 x 32 hidden, deter 24, z 4x5.

    Upstream code used (paths under site-packages/ray/rllib/algorithms/dreamerv3/):
    * torch/models/critic_network.py:16 ``CriticNetwork``: built with ``input_size=44, model_size="micro"``
      (the smallest size with 32 units; all debug sizes and XS have ONE hidden layer, utils/__init__.py:138-150).
      For 2 x 32 its ``mlp`` and ``mlp_ema`` are replaced by upstream's own
      torch/models/components/mlp.py:24 ``MLP(input_size=44, model_size="micro", num_dense_layers=2,
      dense_hidden_units=32)`` (the MLP takes these overrides, mlp.py:59-62; CriticNetwork does not);
      head: components/reward_predictor_layer.py RewardPredictorLayer (zero-init, :67-68); then
      ``CriticNetwork.init_ema()`` (critic_network.py:133, as dreamerv3_rl_module.py:80 does).
    * forward: ``CriticNetwork.forward(h, z, return_logits=True, use_ema=...)`` (critic_network.py:105):
      cat([h, z.view(B, -1)]) (:122) -> MLP -> logits; value = sum(softmax * linspace(-20, 20, 255)),
      a SYMLOG-space expectation (reward_predictor_layer.py:94-101). ``latent`` is the MLP's input, captured.
    * loss: ``DreamerV3TorchLearner._compute_critic_loss`` (torch/dreamerv3_torch_learner.py:647-781), called
      unbound on a stub (``_device``, ``metrics.log_dict``) with a ``dream_data`` dict laid out as
      ``DreamerModel.dream_trajectory`` returns it (torch/models/dreamer_model.py:298-350): H = T + 1 rows,
      the last row a dummy that the loss drops (``[:-1]``, :703, :717, :745). Formula:
      mean_{T,B}( w * ( -sum(log_softmax(logits) * two_hot(symlog(target)))
                        -sum(log_softmax(logits) * two_hot(v_symlog_ema)) ) ).
    * slow update: ``CriticNetwork.update_ema()`` (critic_network.py:153-168), ema = 0.98 ema + 0.02 fast;
      called by ``DreamerV3Learner.after_gradient_based_update`` (dreamerv3_learner.py:26-31) after each update.
    """
    import types

    import torch
    from ray.rllib.algorithms.dreamerv3.torch.dreamerv3_torch_learner import DreamerV3TorchLearner
    from ray.rllib.algorithms.dreamerv3.torch.models.components.mlp import MLP
    from ray.rllib.algorithms.dreamerv3.torch.models.critic_network import CriticNetwork

    h, z, target, weights = inputs()
    torch.manual_seed(0)
    critic = CriticNetwork(input_size=DETER + STOCH, model_size="micro")
    critic.mlp = MLP(input_size=DETER + STOCH, model_size="micro", num_dense_layers=LAYERS, dense_hidden_units=UNITS)
    critic.mlp_ema = MLP(
        input_size=DETER + STOCH, model_size="micro", num_dense_layers=LAYERS, dense_hidden_units=UNITS
    )
    critic.init_ema()

    sd_keys = list(critic.state_dict().keys())
    fast_named = [(k, v) for k, v in critic.named_parameters() if not k.startswith(("mlp_ema.", "return_layer_ema."))]
    ema_params = list(critic.mlp_ema.parameters()) + list(critic.return_layer_ema.parameters())
    ema_named = [(k, v) for k, v in zip([k for k in sd_keys if "_ema." in k], ema_params)]
    assert [k.replace("_ema.", ".") for k, _ in ema_named] == [k for k, _ in fast_named]
    kinds = {f"mlp.{k}": v for k, v in _kinds(critic.mlp, has_head=False).items()}
    kinds.update(
        {
            f"return_layer.{k}": "head_w" if k.endswith("weight") else "head_b"
            for k, _ in critic.return_layer.named_parameters()
        }
    )
    perturb(fast_named, ema_named, kinds)

    h_t = torch.as_tensor(h).reshape(T * B, DETER)
    z_t = torch.as_tensor(z).reshape(T * B, CATS, CLASSES)
    seen, handle = _input_capture(critic.mlp)
    value, logits = critic(h_t, z_t, return_logits=True, use_ema=False)
    handle.remove()
    with torch.no_grad():
        slow_value, slow_logits = critic(h_t, z_t, return_logits=True, use_ema=True)
    logits.retain_grad()

    def with_dummy_row(x):  # [T*B, ...] -> [(T+1)*B, ...]; the loss drops row H-1
        return torch.cat([x, torch.zeros_like(x[:B])], 0)

    dream_data = {
        "rewards_dreamed_t0_to_H_BxT": torch.zeros(T + 1, B),
        "values_symlog_dreamed_logits_t0_to_HxBxT_wm_detached": with_dummy_row(logits),
        "v_symlog_dreamed_ema_t0_to_H_BxT": with_dummy_row(slow_value).reshape(T + 1, B),
        "dream_loss_weights_t0_to_H_BxT": with_dummy_row(torch.as_tensor(weights).reshape(T * B)).reshape(T + 1, B),
    }
    stub = types.SimpleNamespace(
        _device=torch.device("cpu"), metrics=types.SimpleNamespace(log_dict=lambda *a, **k: None)
    )
    config = types.SimpleNamespace(report_individual_batch_item_stats=False)
    loss = DreamerV3TorchLearner._compute_critic_loss(
        stub,
        module_id="default_policy",
        config=config,
        dream_data=dream_data,
        value_targets_t0_to_Hm1_BxT=torch.as_tensor(target),
    )
    loss.backward()

    out = {
        "h": h,
        "z": z,
        "target": target,
        "weights": weights,
        "latent": _np(seen[0]).reshape(T, B, DETER + STOCH),
        "logits": _np(logits).reshape(T, B, BINS),
        "slow_logits": _np(slow_logits).reshape(T, B, BINS),
        "value": _np(value).reshape(T, B),
        "slow_value": _np(slow_value).reshape(T, B),
        "bins": np.linspace(-20.0, 20.0, BINS).astype(np.float32),
        "loss": np.float32(loss.item()),
        "grad_logits": _np(logits.grad).reshape(T, B, BINS),
    }
    out.update(_state("fast", fast_named))
    out.update(_state("slow", ema_named))
    critic.update_ema()
    out.update(_state("slow_after", ema_named))
    if modules is not None:
        modules["load"] = lambda fast, slow: critic.load_state_dict(
            {k: torch.as_tensor(v) for k, v in {**fast, **slow}.items()}
        )
        modules["logits"] = lambda slow: _np(critic(h_t, z_t, return_logits=True, use_ema=slow)[1]).reshape(T, B, BINS)
    out["meta"] = np.str_(
        "rllib torch CriticNetwork (ray 2.60.0), micro + 2x32 upstream MLP; latent = cat(h, z_flat); "
        "value/slow_value in SYMLOG space (expectation over bins=linspace(-20,20,255)); target in REAL space "
        "(learner symlogs it); loss = DreamerV3TorchLearner._compute_critic_loss (EMA regulariser weight 1, "
        "two-hot of the EMA net's symlog value); slow_after = CriticNetwork.update_ema() (decay 0.98); "
        "slow keys are the mlp_ema./return_layer_ema. state_dict keys of the same module"
    )
    return out


# --------------------------------------------------------------------------- sheeprl 0.8.4
SHEEPRL_OVERRIDES = [
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
    f"algo.dense_units={UNITS}",
    f"algo.mlp_layers={LAYERS}",
    f"algo.world_model.recurrent_model.recurrent_state_size={DETER}",
    f"algo.world_model.stochastic_size={CATS}",
    f"algo.world_model.discrete_size={CLASSES}",
    f"algo.world_model.transition_model.hidden_size={UNITS}",
    f"algo.world_model.representation_model.hidden_size={UNITS}",
]


def make_sheeprl_case(modules=None):
    """sheeprl 0.8.4's DreamerV3 critic and target critic, as its own build_agent makes them.

    Upstream code used (paths under site-packages/sheeprl/):
    * config: hydra compose of sheeprl.configs with ``SHEEPRL_OVERRIDES`` (exp=dreamer_v3 env=dummy
      algo=dreamer_v3_XS + dense_units 32, mlp_layers 2, recurrent 24, stochastic 4 x discrete 5);
    * ``build_agent`` (algos/dreamer_v3/agent.py:1030): critic = ``models.models.MLP`` (:1252-1265):
      Linear(bias = norm is Identity, so False) -> ``models.models.LayerNorm``(eps 1e-3) -> SiLU, head
      Linear(255, bias); ``init_weights`` (algos/dreamer_v3/utils.py:144) then ``uniform_init_weights(0.0)``
      on the head (agent.py:1271); target_critic = deepcopy(critic.module) (agent.py:1326), both wrapped by
      ``sheeprl.utils.fabric.setup_module`` (agent.py:1323, :1329). Called on CPU with lightning Fabric.
    * latent: ``torch.cat((posteriors.view(*posteriors.shape[:-2], -1), recurrent_states), -1)``, i.e.
      cat(z_flat, h), as algos/dreamer_v3/dreamer_v3.py:164 (world_model_loss) and :290/:313 (imagine) do.
    * values: ``TwoHotEncodingDistribution(critic(x), dims=1).mean`` (dreamer_v3.py:321; utils/distribution.py:270-297):
      symexp of the expectation over linspace(-20, 20, 255): REAL space.
    * loss: ``critic_loss(critic, target_critic, imagined_trajectories, lambda_values, discount)``
      (dreamer_v3.py:389-400) called directly, with T+1 latent rows (the last a dummy: it slices ``[:-1]``),
      lambda_values = target[..., None], discount = cat(weights, dummy)[..., None]. Formula:
      mean_{T,B}( w * ( -log_prob(target) - log_prob(target_critic.mean) ) ), log_prob = two-hot of symlog(x)
      against log_softmax(logits) (distribution.py:299-322).
    * slow update: the inline loop of ``main`` (dreamer_v3.py:871-877):
      tau = 1 if step == 0 else cfg.algo.critic.tau (0.02); tcp = tau * cp + (1 - tau) * tcp; run BEFORE each
      train step, every per_rank_target_network_update_freq (1) steps. Reproduced with step != 0 (tau 0.02).
    """
    import gymnasium as gym
    import torch
    from hydra import compose, initialize_config_module
    from lightning.fabric import Fabric
    from omegaconf import OmegaConf

    import sheeprl.algos.dreamer_v3.dreamer_v3 as dv3
    from sheeprl.algos.dreamer_v3.agent import build_agent
    from sheeprl.utils.distribution import TwoHotEncodingDistribution
    from sheeprl.utils.utils import dotdict

    h, z, target, weights = inputs()
    with initialize_config_module(version_base="1.3", config_module="sheeprl.configs"):
        cfg = compose(config_name="config", overrides=SHEEPRL_OVERRIDES)
    cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
    fabric = Fabric(accelerator="cpu", devices=1)
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-20, 20, (10,), np.float32)})
    torch.manual_seed(0)
    _, _, critic, target_critic, _ = build_agent(fabric, (2,), False, cfg, obs_space)
    fast_mod, slow_mod = critic.module, target_critic.module

    fast_named = list(fast_mod.named_parameters())
    slow_named = list(slow_mod.named_parameters())
    assert [k for k, _ in fast_named] == list(fast_mod.state_dict().keys())
    perturb(fast_named, slow_named, _kinds(fast_mod))

    posteriors = torch.as_tensor(z)
    recurrent_states = torch.as_tensor(h)
    latent = torch.cat((posteriors.view(*posteriors.shape[:-2], -1), recurrent_states), -1)  # dreamer_v3.py:164
    traj = torch.cat([latent, torch.zeros_like(latent[:1])], 0)  # + dummy row H (dropped by critic_loss)
    lambda_values = torch.as_tensor(target)[..., None]
    discount = torch.cat([torch.as_tensor(weights), torch.zeros(1, B)], 0)[..., None]

    cap = _GradCapture(fast_mod)
    loss = dv3.critic_loss(critic, target_critic, traj, lambda_values, discount)
    cap.remove()
    logits = cap.outputs[0]
    loss.backward()
    with torch.no_grad():
        value = TwoHotEncodingDistribution(critic(latent), dims=1).mean
        slow_logits = target_critic(latent)
        slow_value = TwoHotEncodingDistribution(slow_logits, dims=1).mean
        bins = TwoHotEncodingDistribution(slow_logits, dims=1).bins

    out = {
        "h": h,
        "z": z,
        "target": target,
        "weights": weights,
        "latent": _np(latent),
        "logits": _np(logits),
        "slow_logits": _np(slow_logits),
        "value": _np(value)[..., 0],
        "slow_value": _np(slow_value)[..., 0],
        "bins": _np(bins),
        "loss": np.float32(loss.item()),
        "grad_logits": _np(logits.grad),
    }
    out.update(_state("fast", fast_named))
    out.update(_state("slow", slow_named))
    # dreamer_v3.py:875-877, at a step != 0
    tau = cfg.algo.critic.tau
    for cp, tcp in zip(critic.module.parameters(), target_critic.parameters()):
        tcp.data.copy_(tau * cp.data + (1 - tau) * tcp.data)
    out.update(_state("slow_after", list(slow_mod.named_parameters())))
    if modules is not None:

        def load(fast, slow):
            fast_mod.load_state_dict({k: torch.as_tensor(v) for k, v in fast.items()})
            slow_mod.load_state_dict({k: torch.as_tensor(v) for k, v in slow.items()})

        modules["load"] = load
        modules["logits"] = lambda slow: _np((target_critic if slow else critic)(latent))
    out["meta"] = np.str_(
        "sheeprl 0.8.4 build_agent critic MLP + target_critic (deepcopy), 2x32; latent = cat(z_flat, h); "
        "value/slow_value in REAL space (TwoHotEncodingDistribution.mean = symexp of the expectation over "
        "bins=linspace(-20,20,255) in symlog space); target in REAL space (log_prob symlogs it); "
        "loss = dreamer_v3.critic_loss (target-critic regulariser weight 1: -log_prob(target_critic.mean)); "
        f"slow_after = tau*fast + (1-tau)*slow with tau = cfg.algo.critic.tau = {tau} (dreamer_v3.py:875-877); "
        "slow keys are target_critic's state_dict keys"
    )
    return out


# --------------------------------------------------------------------------- TorchRL 0.14.1
def make_torchrl_case(modules=None):
    """TorchRL 0.14.1's DreamerV3 value model + DreamerV3ValueLoss + SoftUpdate.

    Upstream code used (paths under site-packages/):
    * value model: sota-implementations/dreamer_v3/dreamer_v3_agent.py:737-759 ``build_value(cfg=...)``
      (imported from the installed sota-implementations folder) with cfg.networks = {num_categoricals 4,
      num_classes 5, rnn_hidden_dim 24, num_value_bins 255, value_layers 2, hidden_dim 32, norm_eps 1e-4}:
      TensorDictModule(``DreamerV3MLP`` (torchrl/modules/models/model_based.py:1125-1184), in_keys
      ["belief", "state"]) -> float cast -> TensorDictModule(``SymExpTwoHot`` (model_based.py:1587-1629)).
      DreamerV3MLP: Linear(bias=True) -> RMSNorm (scale only, eps 1e-4, model_based.py:57-66, 138-146) -> SiLU;
      init trunc-normal std 1.1368/sqrt(fan_in) (model_based.py:48-54), head weight * outscale 0.0.
    * latent: DreamerV3MLP.forward cat(inputs, -1) (model_based.py:1182-1184), i.e. cat(belief=h, state=z_flat);
      captured from the Sequential's input.
    * values: SymExpTwoHot.decode (two_hot_decode, model_based.py:1500-1547) over bins = symexp of a
      linspace(-20, 20) grid (``_default_bins``, model_based.py:1420-1446): REAL-space bins and values.
    * loss: ``DreamerV3ValueLoss(value_model, value_loss="two_hot", num_value_bins=255,
      slow_critic_regularization=1.0)`` (torchrl/objectives/dreamer_v3.py:1059-1398; sota train.py:440-446
      passes cfg.optimization.slow_critic_regularization; the class default is 0.0), forward on a TensorDict
      {belief, state, lambda_target [T,B,1], discount_weight [T,B,1]}: mean( w * (CE(logits,
      two_hot_raw(target)) + 1.0 * CE(logits, two_hot_raw(decode(slow_logits)))) ) (:1317-1398), two-hot
      interpolated in RAW space between symexp bins (two_hot_encode, model_based.py:1459-1497).
    * slow update: ``SoftUpdate(loss, tau=0.02)`` (torchrl/objectives/utils.py:536-592; sota train.py:447 with
      cfg.optimization.slow_critic_tau); ``.step()``: target.lerp_(source, tau). Its constructor hard-copies
      fast -> slow (``init_``), so the slow perturbation is applied after it.
    """
    import pathlib
    import sys

    import torch
    import torchrl
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from torchrl.objectives import DreamerV3ValueLoss
    from torchrl.objectives.utils import SoftUpdate

    sota = pathlib.Path(torchrl.__file__).parent.parent / "sota-implementations" / "dreamer_v3"
    if str(sota) not in sys.path:
        sys.path.insert(0, str(sota))
    import dreamer_v3_agent  # noqa: E402  (torchrl's own sota script)

    h, z, target, weights = inputs()
    cfg = OmegaConf.create(
        {
            "networks": {
                "num_categoricals": CATS,
                "num_classes": CLASSES,
                "rnn_hidden_dim": DETER,
                "num_value_bins": BINS,
                "value_layers": LAYERS,
                "hidden_dim": UNITS,
                "norm_eps": 1e-4,
            }
        }
    )
    torch.manual_seed(0)
    value_model = dreamer_v3_agent.build_value(cfg=cfg)
    loss_module = DreamerV3ValueLoss(
        value_model, value_loss="two_hot", num_value_bins=BINS, slow_critic_regularization=1.0
    )
    updater = SoftUpdate(loss_module, tau=0.02)

    mlp = value_model.module[0].module
    prefix = "module.0.module."
    param_keys = [k for k, _ in value_model.named_parameters()]
    fast_params = loss_module.value_model_params
    slow_params = loss_module.target_value_model_params

    def named(td):
        return [(k, td.get(tuple(k.split(".")))) for k in param_keys]

    kinds = {prefix + k: v for k, v in _kinds(mlp).items()}
    perturb(named(fast_params), named(slow_params), kinds)

    belief = torch.as_tensor(h)
    state = torch.as_tensor(z).reshape(T, B, STOCH)
    data = TensorDict(
        {
            "belief": belief,
            "state": state,
            "lambda_target": torch.as_tensor(target)[..., None],
            "discount_weight": torch.as_tensor(weights)[..., None],
        },
        batch_size=[T, B],
    )
    seen, handle = _input_capture(mlp.model)
    cap = _GradCapture(mlp)
    loss_td, _ = loss_module(data.clone())
    cap.remove()
    handle.remove()
    logits = cap.outputs[0]
    loss = loss_td["loss_value"]
    loss.backward()

    def run(params):
        td = TensorDict({"belief": belief, "state": state}, batch_size=[T, B])
        with torch.no_grad(), params.to_module(loss_module.value_model, preserve_module_state=False):
            loss_module.value_model(td)
        return td["state_value_logits"], td["state_value"][..., 0]

    _, value = run(fast_params)
    slow_logits, slow_value = run(slow_params)

    out = {
        "h": h,
        "z": z,
        "target": target,
        "weights": weights,
        "latent": _np(seen[0]),
        "logits": _np(logits),
        "slow_logits": _np(slow_logits),
        "value": _np(value),
        "slow_value": _np(slow_value),
        "bins": _np(loss_module.value_bins),
        "loss": np.float32(loss.item()),
        "grad_logits": _np(logits.grad),
    }
    out.update(_state("fast", named(fast_params)))
    out.update(_state("slow", named(slow_params)))
    updater.step()
    out.update(_state("slow_after", named(slow_params)))
    if modules is not None:  # fresh value models of the same build, loaded strictly
        fresh = {False: dreamer_v3_agent.build_value(cfg=cfg), True: dreamer_v3_agent.build_value(cfg=cfg)}

        def load(fast, slow):
            fresh[False].load_state_dict({k: torch.as_tensor(v) for k, v in fast.items()})
            fresh[True].load_state_dict({k: torch.as_tensor(v) for k, v in slow.items()})

        def fresh_logits(slow):
            td = TensorDict({"belief": belief, "state": state}, batch_size=[T, B])
            with torch.no_grad():
                fresh[slow](td)
            return _np(td["state_value_logits"])

        modules["load"], modules["logits"] = load, fresh_logits
    out["meta"] = np.str_(
        "torchrl 0.14.1 sota build_value (DreamerV3MLP + SymExpTwoHot) + DreamerV3ValueLoss(two_hot, "
        "slow_critic_regularization=1.0) + SoftUpdate(tau=0.02), 2x32; latent = cat(belief=h, state=z_flat); "
        "hidden Linear HAS a bias, norm = RMSNorm scale only (eps 1e-4); bins = symexp grid in REAL space "
        "(two-hot interpolated in raw space); value/slow_value in REAL space; target in REAL space; "
        "keys are the value model's state_dict keys (in the loss module's state_dict they are prefixed "
        "value_model_params. / target_value_model_params.); slow_after = SoftUpdate.step()"
    )
    return out


# --------------------------------------------------------------------------- RLlib's learner, end to end
def rllib_learner_updates(swap_in_multicritic: bool, steps: int = 2):
    """``steps`` updates of RLlib's own ``DreamerV3TorchLearner`` (model_size "nano", B=2, T=8, H=5, seed 0) on a
    fixed random batch; returns the critic losses and the critic's ``state_dict`` (RLlib's layout) after.

    With ``swap_in_multicritic``, the RL module's ``CriticNetwork`` (dreamerv3_rl_module.py:61) is built as
    RLlib's own, then replaced by a multicritic critic holding its weights, through
    ``multicritic.interop.rllib.rllib_torch_module`` (before the learner builds its optimizers over
    ``critic.parameters()``, dreamerv3_torch_learner.py:84); the learner, its losses, clipping and
    ``update_ema`` (dreamerv3_learner.py:31) run unchanged.
    """

    import gymnasium as gym
    import torch
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config
    from ray.rllib.algorithms.dreamerv3 import dreamerv3_rl_module
    from ray.rllib.policy.sample_batch import SampleBatch

    from multicritic.interop.rllib import export_rllib_torch, rllib_torch_critic, rllib_torch_module
    from multicritic.model.sizes import get_model_dims

    rllib_critic = dreamerv3_rl_module.CriticNetwork

    def multicritic_critic(**kwargs):
        theirs = rllib_critic(**kwargs)
        dims = get_model_dims(kwargs["model_size"])
        ours = rllib_torch_critic(
            theirs.state_dict(),
            gru_units=dims["gru_units"],
            num_z_categoricals=dims["num_z_categoricals"],
            num_z_classes=dims["num_z_classes"],
        )
        return rllib_torch_module(ours)

    if swap_in_multicritic:
        dreamerv3_rl_module.CriticNetwork = multicritic_critic
    try:
        torch.manual_seed(0)
        config = (
            DreamerV3Config()
            .environment(
                observation_space=gym.spaces.Box(-1.0, 1.0, (4,), np.float32), action_space=gym.spaces.Discrete(2)
            )
            .training(model_size="nano", training_ratio=1, batch_size_B=2, batch_length_T=8, horizon_H=5)
            .learners(num_learners=0)
            .debugging(seed=0)
        )
        learner = config.build_learner()
    finally:
        dreamerv3_rl_module.CriticNetwork = rllib_critic
    critic = learner.module["default_policy"].unwrapped().critic
    rng = np.random.default_rng(0)
    b, t = 2, 8
    actions = rng.integers(0, 2, (b, t))
    batch = {
        "obs": rng.uniform(-1, 1, (b, t, 4)).astype(np.float32),
        "actions_ints": actions,
        "actions": np.eye(2, dtype=np.float32)[actions],
        "rewards": rng.normal(size=(b, t)).astype(np.float32),
        "is_first": np.zeros((b, t), bool),
        "is_last": np.zeros((b, t), bool),
        "is_terminated": np.zeros((b, t), bool),
        "is_truncated": np.zeros((b, t), bool),
    }
    batch["is_first"][:, 0] = True
    losses = []
    for step in range(steps):
        results = learner.update(
            batch=SampleBatch(batch).as_multi_agent(), timesteps={"num_env_steps_sampled_lifetime": b * t * (step + 1)}
        )
        loss = results["default_policy"]["CRITIC_L_total"]
        losses.append(float(loss.peek() if hasattr(loss, "peek") else loss))
    state = (
        export_rllib_torch(critic.critic)
        if swap_in_multicritic
        else {k: _np(v) for k, v in critic.state_dict().items()}
    )
    return losses, state
