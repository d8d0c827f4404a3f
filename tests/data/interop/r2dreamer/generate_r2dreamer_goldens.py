"""Writes r2dreamer_goldens.npz by running the REAL NM512/r2dreamer code.

r2dreamer (NM512's active DreamerV3-family codebase, ICLR 2026) is not on
PyPI, so its numbers are committed: this script imports r2dreamer's own
modules (dreamer.py, networks.py, rssm.py, distributions.py, tools.py,
optim/) and feeds them small, seeded inputs; the tests compare
``multicritic.interop.r2dreamer`` with what they wrote. Nothing numeric is
re-implemented here:

* the agent is a real ``dreamer.Dreamer(config.model, obs_space, act_space)``
  (proprioceptive encoder, ``rep_loss="r2dreamer"``, ``compile=False``) built
  from ``configs/model/_base_.yaml`` + ``size12M.yaml`` with a few size
  overrides; its ``value`` is the ``networks.MLPHead(config.critic, ...)``
  that ``Dreamer.__init__`` builds, its ``_slow_value`` the deepcopy it makes;
* the feature is the real ``rssm.RSSM.get_feat`` of the agent's RSSM;
* the distribution is the ``distributions.TwoHot`` (``symexp_twohot``) the
  head returns; its ``mode()`` and ``log_prob()`` are called directly;
* the loss is the value-loss expression of ``Dreamer._cal_grad``
  (dreamer.py:472-480; the replay value loss, ``repval``, at dreamer.py:513-520,
  is the same expression), written out with the real objects;
* the slow update is the real ``Dreamer._update_slow_target`` method, which
  ``Dreamer.update`` calls before ``_cal_grad``;
* the replay value loss's targets are the real ``Dreamer._lambda_return``.

Source: https://github.com/NM512/r2dreamer at commit
546e4fab8146ea4b14e1d7726bbc1a8a1d50322f (sha256 of the files used are
checked, see SOURCE_SHA256).

To re-run (CPU, a few seconds; torch 2.13.0 was used, any torch >= 2.4 with
``nn.RMSNorm`` should do; numpy and pyyaml; tensordict and tensorboard are
stubbed when missing: dreamer.py imports TensorDict and tools.py
SummaryWriter at module level, and neither is used here):

    git clone https://github.com/NM512/r2dreamer /tmp/r2dreamer
    mkdir -p /tmp/r2src
    git -C /tmp/r2dreamer archive 546e4fab8146ea4b14e1d7726bbc1a8a1d50322f | tar -x -C /tmp/r2src
    python tests/data/interop/r2dreamer/generate_r2dreamer_goldens.py --src /tmp/r2src

(or ``R2DREAMER_SRC=/tmp/r2src``). It writes r2dreamer_goldens.npz and
r2dreamer_goldens_manifest.json (every key described) into --out-dir
(default: next to this script).
"""

import copy
import os
import re
import sys
import types

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))  # goldens_common.py, shared with NM512's dreamerv3-torch generator
import goldens_common as common  # noqa: E402

COMMIT = "546e4fab8146ea4b14e1d7726bbc1a8a1d50322f"
SOURCE_SHA256 = {
    "dreamer.py": "7114e03ce5a0d4abe500823de7d7f7bedddfbd0fff5323c19251ba8e0d4a7547",
    "networks.py": "14a440a237fc0a2f1e386d9496202009e81804a97b3c79a6c4136784e61cd04c",
    "distributions.py": "adf1107fc999e2f61a92609b7c00c0db3e7fc7cf488e5f1e42d6150a58c3543d",
    "tools.py": "b91a12e9d03d803ed40545b9bf957c293c4008bfcd6b5b48ea98ad3bca999350",
    "rssm.py": "9fd1171c39cad2faa7edb3065bdd36b5d39fad343a00e358636a72c8473001f6",
    "configs/model/_base_.yaml": "ef3ca28fae346f4751b28aa64986b834ac4d68b9df58c40e1d76750d6fe5eae9",
    "configs/model/size12M.yaml": "464475444f3652d04ab17f427aa22b0572b6c8e458d25494c116c759828bfe24",
}
# Small sizes (overrides of the size12M model config; the whole `critic` block stays at r2dreamer's defaults).
OVERRIDES = dict(deter=24, hidden=32, discrete=5, depth=4, units=32, compile=False, warmup=0)
RSSM_OVERRIDES = dict(stoch=4)  # categoricals; `discrete` (5) is each one's classes
OBS_SIZE, ACTIONS = 6, 2
PEAK, PEAK_SLOPE = 140, 0.3  # the head bias's peak (bin 140: symexp(2.05) = 6.8) and its fall per bin
B, T = 4, 3


class Config(dict):
    """Attribute access over a dict, as the hydra `DictConfig` r2dreamer gets (`dict(config.x)`, `**config.x`)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    __setattr__ = dict.__setitem__


def import_r2dreamer(src):
    sys.path.insert(0, os.path.abspath(src))
    common.stub_missing("torch.utils.tensorboard", "SummaryWriter")  # only the logger uses it
    common.stub_missing("tensordict", "TensorDict")  # only the replay buffer uses it
    import dreamer

    return dreamer


def load_config(src):
    """configs/model/_base_.yaml + size12M.yaml + OVERRIDES, interpolations (`${model.units}`) resolved as
    hydra does for `python train.py model=size12M env=dmc_proprio device=cpu`."""
    with open(os.path.join(src, "configs/model/_base_.yaml")) as f:
        model = yaml.safe_load(f)
    with open(os.path.join(src, "configs/model/size12M.yaml")) as f:
        model.update({k: v for k, v in yaml.safe_load(f).items() if k != "defaults"})
    model.update(OVERRIDES)
    model["rssm"].update(RSSM_OVERRIDES)
    env = {"encoder": {"mlp_keys": ".*", "cnn_keys": "$^"}, "decoder": {"mlp_keys": ".*", "cnn_keys": "$^"}}
    root = {"model": model, "env": env, "device": "cpu"}

    def lookup(path):
        node = root
        for part in path.split("."):
            node = node[part]
        return node

    def resolve(node):
        if isinstance(node, dict):
            return Config({k: resolve(v) for k, v in node.items()})
        if isinstance(node, list):
            return [resolve(v) for v in node]
        if isinstance(node, str):
            m = re.fullmatch(r"\$\{(.+)\}", node)
            if m:
                return resolve(lookup(m[1]))
            # OmegaConf's YAML loader reads `4e-5` as a float; PyYAML's YAML 1.1 rules read it as a string.
            return float(node) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", node) else node
        return node

    return resolve(model)


def value_loss_expr(agent, feat, target, weight):
    """dreamer.py:472-480 with the real modules and TwoHot objects (feat plays imag_feat[:, :-1]: the padding
    and [:, :-1] slicing around it are shape plumbing)."""
    slow_value = agent._frozen_slow_value(feat).mode()
    value_dist = agent.value(feat)
    value_dist.logits.retain_grad()
    loss = torch.mean(
        weight.detach()
        * (-value_dist.log_prob(target.detach()) - value_dist.log_prob(slow_value.detach())).unsqueeze(-1)
    )
    return value_dist, slow_value, loss


def main():
    args = common.parse_args(__doc__.split("\n")[0], "R2DREAMER_SRC", HERE)
    src_sha = common.check_source(args.src, SOURCE_SHA256, COMMIT, args.allow_source_mismatch)
    dreamer = import_r2dreamer(args.src)
    torch.set_num_threads(1)
    cfg = load_config(args.src)
    critic_cfg = copy.deepcopy(dict(cfg.critic))
    assert critic_cfg["dist"]["name"] == "symexp_twohot" and critic_cfg["outscale"] == 0.0, critic_cfg

    # --- the real agent (torch RNG: seed 0) ---
    torch.manual_seed(0)
    obs_space = types.SimpleNamespace(
        spaces={
            "state": types.SimpleNamespace(shape=(OBS_SIZE,)),
            "reward": types.SimpleNamespace(shape=(1,)),
            "is_first": types.SimpleNamespace(shape=(1,)),
            "is_last": types.SimpleNamespace(shape=(1,)),
            "is_terminal": types.SimpleNamespace(shape=(1,)),
        }
    )
    act_space = types.SimpleNamespace(n=ACTIONS, discrete=True)
    agent = dreamer.Dreamer(cfg, obs_space, act_space)
    value_mod, slow_mod = agent.value, agent._slow_value
    feat_size = agent.rssm.feat_size
    init_sd, init_slow_sd = common.sd_numpy(value_mod), common.sd_numpy(slow_mod)
    assert all(np.array_equal(init_sd[k], init_slow_sd[k]) for k in init_sd)
    head_init_zero = bool(np.all(init_sd["last.weight"] == 0) and np.all(init_sd["last.bias"] == 0))
    biases_init_zero = all(bool(np.all(v == 0)) for k, v in init_sd.items() if k.endswith("bias"))
    norms_init_one = all(bool(np.all(v == 1)) for k, v in init_sd.items() if "_norm" in k)
    slow_requires_grad = any(p.requires_grad for p in slow_mod.parameters())
    agent_keys = list(agent.state_dict())

    # --- deterministic perturbation (numpy default_rng(0), in this order): the zero head, zero biases and unit
    # norm scales would hide a transposed or misplaced array ---
    rng0 = np.random.default_rng(0)
    perturb_order = []
    with torch.no_grad():
        params = dict(value_mod.named_parameters())
        for name, p in params.items():
            if name == "last.bias":
                # Peaked around bin PEAK, as a trained critic's: a near-uniform distribution over symexp bins
                # (+-4.85e8) decodes to a difference of huge sums, whose float32 rounding differs by framework.
                peak = -PEAK_SLOPE * np.abs(np.arange(p.shape[0]) - PEAK)
                p.copy_(torch.from_numpy((peak + rng0.normal(0.0, 0.05, p.shape)).astype(np.float32)))
                perturb_order.append(f"{name} = -{PEAK_SLOPE} * |i - {PEAK}| + N(0, 0.05)")
            elif name.startswith("last.") or name.endswith("bias"):
                p.copy_(torch.from_numpy(rng0.normal(0.0, 0.05, p.shape).astype(np.float32)))
                perturb_order.append(f"{name} = N(0, 0.05)")
            elif "_norm" in name:
                p.copy_(torch.from_numpy((1.0 + rng0.normal(0.0, 0.1, p.shape)).astype(np.float32)))
                perturb_order.append(f"{name} = 1 + N(0, 0.1)")
        for name, p in slow_mod.named_parameters():
            p.copy_(params[name] + torch.from_numpy(rng0.normal(0.0, 0.01, p.shape).astype(np.float32)))
            perturb_order.append(f"slow {name} = fast + N(0, 0.01)")

    # --- inputs (numpy default_rng(2)) through the agent's own RSSM.get_feat ---
    rng2 = np.random.default_rng(2)
    stoch_cfg = int(cfg.rssm.stoch)
    stoch, deter = common.latents(rng2, (B, T), stoch_cfg, int(cfg.rssm.discrete), int(cfg.rssm.deter))
    feat = agent.rssm.get_feat(torch.from_numpy(stoch), torch.from_numpy(deter))
    assert feat.shape == (B, T, feat_size), feat.shape
    feat_np = common.numpy32(feat)
    feat_order_ok = common.stoch_then_deter(feat_np, stoch, deter)
    assert feat_order_ok

    # --- targets and weights (numpy default_rng(1)) ---
    target_np, weights_np = common.targets_and_weights((B, T))
    target_np[0, 0] = 0.0  # exactly bin 127 (symexp(0) = 0)
    target_np[0, 1] = 1e9  # past the last bin (symexp(20) = 4.85e8): both weights on it
    target_np[0, 2] = -3e4
    target = torch.from_numpy(target_np)[..., None]
    weights = torch.from_numpy(weights_np)[..., None]

    value_sd, slow_sd = common.sd_numpy(value_mod), common.sd_numpy(slow_mod)

    # --- forward and loss, real TwoHot ---
    value, slow_mode, loss, logits, grad_logits = common.loss_and_grads(
        value_mod, lambda: value_loss_expr(agent, feat, target, weights)
    )
    slow_dist = agent._slow_value(feat)
    slow_logits = common.numpy32(slow_dist.logits)
    v_mode = common.numpy32(value.mode()[..., 0])
    s_mode = common.numpy32(slow_mode[..., 0])
    assert np.array_equal(s_mode, slow_dist.mode().detach()[..., 0].numpy())
    lp_target = common.numpy32(value.log_prob(target))
    bins = value.bins.numpy().astype(np.float32)

    # --- one slow update by the real method (counter 0 -> mixes), then the loss update() computes after it ---
    assert agent._slow_value_updates == 0
    agent._update_slow_target()
    slow_after_sd = common.sd_numpy(slow_mod)
    common.check_mixed(slow_after_sd, value_sd, slow_sd, float(cfg.slow_target_fraction))
    _, _, loss_after = value_loss_expr(agent, feat, target, weights)

    # --- the replay value loss's targets (repval): the real Dreamer._lambda_return (numpy default_rng(3)) ---
    rng3 = np.random.default_rng(3)
    last = (rng3.uniform(size=(B, T + 2, 1)) < 0.2).astype(np.float32)
    term = (rng3.uniform(size=(B, T + 2, 1)) < 0.1).astype(np.float32)
    reward = rng3.normal(size=(B, T + 2, 1)).astype(np.float32)
    boot = rng3.normal(scale=5.0, size=(B, T + 2, 1)).astype(np.float32)
    disc = 1 - 1 / float(cfg.horizon)
    replay_args = [torch.from_numpy(x) for x in (last, term, reward, boot, boot)]
    replay_returns = agent._lambda_return(*replay_args, disc, float(cfg.lamb)).numpy().astype(np.float32)

    goldens = common.Goldens()
    put = goldens.put
    texts = (
        "agent.value param (torch state_dict layout; Linear [out, in])",
        "agent._slow_value param before the update",
        "agent._slow_value param after ONE real Dreamer._update_slow_target()",
    )
    goldens.put_states(value_sd, slow_sd, slow_after_sd, texts)
    put("stoch", stoch, "stoch [B,T,rssm.stoch,rssm.discrete] categorical probs")
    put("deter", deter, "deter [B,T,rssm.deter]")
    put("feat", feat_np, "agent.rssm.get_feat(stoch, deter) = cat([stoch.reshape(B,T,-1), deter], -1)")
    put("bins", bins, "TwoHot.bins of symexp_twohot(bin_num=255): symexp(linspace(-20, 0, 128)) mirrored")
    put("logits", logits, "agent.value(feat).logits [B,T,255]")
    put("slow_logits", slow_logits, "agent._slow_value(feat).logits [B,T,255] (before the update)")
    put("value", v_mode, "agent.value(feat).mode() [B,T] real space")
    put("slow_value", s_mode, "agent._slow_value(feat).mode() [B,T] real space (the slow regulariser target)")
    put("target", target_np, "lambda-return stand-in [B,T]: 0 (bin 127), 1e9 (past the last bin), -3e4, U(-50, 50)")
    put("weights", weights_np, "weight[:, :-1] stand-in [B,T]")
    put("logprob_target", lp_target, "value.log_prob(target[..., None]) [B,T]")
    put("loss", loss.detach().numpy(), "mean(weight * (-log_prob(target) - log_prob(slow.mode()))), slow_value/*")
    put("grad_logits", grad_logits, "d loss / d logits [B,T,255]")
    put("loss_after_slow_update", loss_after.detach().numpy(), "`loss` with slow_after/* (update() mixes first)")

    put("replay_is_last", last[..., 0], "replay is_last [B,T+2]")
    put("replay_is_terminal", term[..., 0], "replay is_terminal [B,T+2]")
    put("replay_rewards", reward[..., 0], "replay rewards [B,T+2]")
    put("replay_boot", boot[..., 0], "imagined returns from each replay step (boot) [B,T+2]")
    put("replay_returns", replay_returns[..., 0], "Dreamer._lambda_return(last, term, reward, boot, boot) [B,T+1]")

    manifest = {
        **common.provenance("https://github.com/NM512/r2dreamer", COMMIT, src_sha, "generate_r2dreamer_goldens.py"),
        "config_overrides": {"model": OVERRIDES, "model.rssm": RSSM_OVERRIDES},
        "config_used": {
            "critic": critic_cfg,
            "slow_target_update": cfg.slow_target_update,
            "slow_target_fraction": cfg.slow_target_fraction,
            "loss_scales": {"value": cfg.loss_scales["value"], "repval": cfg.loss_scales["repval"]},
            "replay_discount": 1 - 1 / float(cfg.horizon),
            "lamb": float(cfg.lamb),
            "rssm": {"stoch": stoch_cfg, "discrete": int(cfg.rssm.discrete), "deter": int(cfg.rssm.deter)},
            "feat_size": feat_size,
        },
        "B": B,
        "T": T,
        "seeds": {**common.SEEDS, "replay": "np.random.default_rng(3)"},
        "perturbation_order": perturb_order,
        "init": {
            "head_all_zero": head_init_zero,
            "biases_all_zero": biases_init_zero,
            "norm_scales_all_one": norms_init_one,
            "slow_requires_grad": slow_requires_grad,
        },
        "feat_concat_order_stoch_then_deter": feat_order_ok,
        "agent_state_dict_keys": agent_keys,
    }
    goldens.write(args.out_dir, "r2dreamer_goldens", manifest, compressed=True)
    print(f"loss={loss.item():.7f} loss_after_slow_update={loss_after.item():.7f}")


if __name__ == "__main__":
    main()
