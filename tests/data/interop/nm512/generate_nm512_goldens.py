"""Writes nm512_goldens.npz by running the REAL NM512/dreamerv3-torch code.

NM512/dreamerv3-torch is not on PyPI, so its numbers are committed: this
script imports NM512's own modules (models.py, networks.py, tools.py) and
feeds them small, seeded inputs; the tests compare
``multicritic.interop.nm512`` with what they wrote. Nothing numeric is
re-implemented here:

* the value critic is the ``networks.MLP`` that ``models.ImagBehavior.__init__``
  itself builds (the script constructs a real ``ImagBehavior`` from NM512's
  ``configs.yaml`` defaults plus a few size overrides), and the slow critic is
  its ``_slow_value``;
* the feature is ``networks.RSSM.get_feat`` of a real (small, CPU) RSSM;
* the distribution is ``tools.DiscDist`` returned by ``MLP.forward``; its
  ``mode()``/``mean()``/``log_prob()`` are called directly;
* the loss is the expression of ``ImagBehavior._train`` (models.py:324-332),
  written out with the real objects; as a cross-check the script also calls the
  real ``ImagBehavior._train`` (imagination/target/actor helpers replaced by
  stubs that return the same inputs, optimizers replaced by a recorder) and
  asserts that it gives the same number;
* the slow update is the real ``ImagBehavior._update_slow_target`` method.

Source: https://github.com/NM512/dreamerv3-torch at commit
6ef8646d807cd10ce0c88e10a7e943211e7fc44c (sha256 of the four files used are
checked, see SOURCE_SHA256).

To re-run (CPU, ~10 s; torch 2.13.0 was used, any torch >= 2.0 should do):

    git clone https://github.com/NM512/dreamerv3-torch src
    git -C src checkout 6ef8646d807cd10ce0c88e10a7e943211e7fc44c
    python3 -m venv venv && venv/bin/pip install torch numpy ruamel.yaml
    NM512_SRC=src venv/bin/python generate_nm512_goldens.py --out-dir .

(or ``--src PATH``; default src/ next to this script). ``tensorboard`` is
optional: NM512's tools.py imports SummaryWriter at module level, and if
tensorboard is missing a stub is installed (it is only used by tools.Logger).
It writes nm512_goldens.npz and nm512_goldens_manifest.json (every key
described) into --out-dir (default: next to this script).
"""
import copy
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))  # goldens_common.py, shared with r2dreamer's generator
import goldens_common as common  # noqa: E402

COMMIT = "6ef8646d807cd10ce0c88e10a7e943211e7fc44c"
SOURCE_SHA256 = {
    "networks.py": "6111a4f3d4332dd4cbe8c4bc319222b384419a8110e8a27b5d041f1075ad493a",
    "models.py": "4cb8c2c858481c3d762162aee8a7bf05347d1f9713e6dc7c7a3e65e7077da49a",
    "tools.py": "32266d2d3b741e6b0afe2a2033ec37aa2849e759f39c147020042920df73c7c5",
    "configs.yaml": "6ddfa13ed0f0329a7dd079a01c80ac5eca3cca2238ee01c5f6b2bf3b13762779",
}

# Small config (overrides of configs.yaml `defaults`; everything else, in
# particular the whole `critic` block, stays at NM512's defaults).
OVERRIDES = dict(
    dyn_stoch=4,  # NM512: number of categoricals
    dyn_discrete=5,  # NM512: classes per categorical
    dyn_deter=24,
    dyn_hidden=32,
    units=32,  # the critic MLP uses config.units (models.py:249)
    device="cpu",
    compile=False,
    num_actions=2,  # set from the env in dreamer.py:248; only the actor uses it
)
T, B = 3, 4
EMBED = 16  # RSSM posterior input size; unused by get_feat


def import_nm512(src):
    sys.path.insert(0, os.path.abspath(src))
    # tools.py imports it at module level; only tools.Logger uses it.
    common.stub_missing("torch.utils.tensorboard", "SummaryWriter")
    import models
    import networks
    import tools

    return models, networks, tools


def load_config(src, tools):
    """configs.yaml `defaults` + OVERRIDES, as dreamer.py:342-365 builds it."""
    from ruamel.yaml import YAML

    with open(os.path.join(src, "configs.yaml")) as f:
        configs = YAML(typ="safe", pure=True).load(f)
    defaults = {}

    def recursive_update(base, update):  # dreamer.py:350-355
        for key, value in update.items():
            if isinstance(value, dict) and key in base:
                recursive_update(base[key], value)
            else:
                base[key] = value

    recursive_update(defaults, configs["defaults"])
    recursive_update(defaults, OVERRIDES)
    # dreamer.py:362-365: argparse default=tools.args_type(value)(value)
    return types.SimpleNamespace(
        **{k: tools.args_type(v)(v) for k, v in sorted(defaults.items())}
    )


def build_rssm(networks, cfg):
    # Same positional arguments as models.WorldModel.__init__ (models.py:38-54).
    return networks.RSSM(
        cfg.dyn_stoch,
        cfg.dyn_deter,
        cfg.dyn_hidden,
        cfg.dyn_rec_depth,
        cfg.dyn_discrete,
        cfg.act,
        cfg.norm,
        cfg.dyn_mean_act,
        cfg.dyn_std_act,
        cfg.dyn_min_std,
        cfg.unimix_ratio,
        cfg.initial,
        cfg.num_actions,
        EMBED,
        cfg.device,
    )


def value_loss_expr(behavior, feat, target, weights):
    """models.py:324-332 verbatim, with the real modules / DiscDist objects."""
    value_input = feat  # value_input[:-1] in _train; here feat is already [T, B, F]
    value = behavior.value(value_input.detach())
    value.logits.retain_grad()
    # (time, batch, 1), (time, batch, 1) -> (time, batch)
    value_loss = -value.log_prob(target.detach())
    slow_target = behavior._slow_value(value_input.detach())
    if behavior._config.critic["slow_target"]:
        value_loss -= value.log_prob(slow_target.mode().detach())
    # (time, batch, 1), (time, batch, 1) -> (1,)
    value_loss = torch.mean(weights * value_loss[:, :, None])
    return value, slow_target, value_loss


def train_call_loss(behavior, rssm, state, feat, target, weights, cfg):
    """Runs the real ImagBehavior._train on a deepcopy; returns the value loss it
    hands to its value optimizer and the deepcopy (whose _slow_value has been
    updated once by _train's own _update_slow_target call)."""
    # tools.Optimizer holds a parameter generator, which deepcopy cannot copy;
    # they are replaced below anyway.
    opts = behavior._actor_opt, behavior._value_opt
    behavior._actor_opt = behavior._value_opt = None
    try:
        b = copy.deepcopy(behavior)
    finally:
        behavior._actor_opt, behavior._value_opt = opts
    ext = lambda x: torch.cat([x, x[-1:]], 0)  # _train uses [:-1]: add a step
    imag_feat = ext(feat)
    imag_state = {k: ext(v) for k, v in state.items()}
    imag_state["logit"] = torch.log(imag_state["stoch"])
    imag_action = torch.zeros(T + 1, B, cfg.num_actions)
    weights_ext = ext(weights)
    base = torch.zeros(T, B, 1)
    # lambda_return returns a tuple over batch of [time, 1]; _train stacks on dim 1
    target_tuple = torch.unbind(target.permute(1, 0, 2), dim=0)
    b._imagine = lambda start, policy, horizon: (imag_feat, imag_state, imag_action)
    b._compute_target = lambda f, s, r: (target_tuple, weights_ext, base)
    b._compute_actor_loss = lambda *a, **k: (torch.zeros(T, B, 1), {})
    b._actor_opt = lambda loss, params: {}
    seen = {}

    def value_opt(loss, params):
        seen["loss"] = loss.detach().clone()
        return {}

    b._value_opt = value_opt
    objective = lambda f, s, a: torch.zeros(f.shape[0], f.shape[1], 1)
    b._train(None, objective)
    return seen["loss"], b


def main():
    args = common.parse_args(__doc__.split("\n")[0], "NM512_SRC", HERE)
    src_sha = common.check_source(args.src, SOURCE_SHA256, COMMIT, args.allow_source_mismatch)
    models, networks, tools = import_nm512(args.src)
    torch.set_num_threads(1)
    cfg = load_config(args.src, tools)
    critic = dict(cfg.critic)
    assert critic["dist"] == "symlog_disc" and critic["slow_target"], critic

    # --- NM512 construction (torch RNG: seed 0, RSSM first as in Dreamer) ---
    torch.manual_seed(0)
    rssm = build_rssm(networks, cfg)
    world_model = types.SimpleNamespace(dynamics=rssm, heads={})
    behavior = models.ImagBehavior(cfg, world_model)  # builds value + deepcopy slow
    value_mod = behavior.value
    feat_size = cfg.dyn_stoch * cfg.dyn_discrete + cfg.dyn_deter
    init_sd = common.sd_numpy(value_mod)
    init_slow_sd = common.sd_numpy(behavior._slow_value)
    assert all(np.array_equal(init_sd[k], init_slow_sd[k]) for k in init_sd)
    head_init_zero = bool(
        np.all(init_sd["mean_layer.weight"] == 0) and np.all(init_sd["mean_layer.bias"] == 0)
    )

    # --- deterministic perturbation (numpy default_rng(0), in this order) ---
    rng0 = np.random.default_rng(0)
    perturb_order = []
    with torch.no_grad():
        for name in ("mean_layer.weight", "mean_layer.bias"):
            p = dict(value_mod.named_parameters())[name]
            p.copy_(torch.from_numpy(rng0.normal(0.0, 0.05, p.shape).astype(np.float32)))
            perturb_order.append(f"{name} = N(0, 0.05)")
        for i in range(critic["layers"]):
            for kind, off in (("weight", 1.0), ("bias", 0.0)):
                name = f"layers.Value_norm{i}.{kind}"
                p = dict(value_mod.named_parameters())[name]
                p.copy_(torch.from_numpy((off + rng0.normal(0.0, 0.1, p.shape)).astype(np.float32)))
                perturb_order.append(f"{name} = {off} + N(0, 0.1)")
        behavior._slow_value = copy.deepcopy(value_mod)
        for name, p in behavior._slow_value.named_parameters():
            p.add_(torch.from_numpy(rng0.normal(0.0, 0.01, p.shape).astype(np.float32)))
            perturb_order.append(f"slow {name} += N(0, 0.01)")

    # --- inputs (numpy default_rng(2)) ---
    rng2 = np.random.default_rng(2)
    stoch, deter = common.latents(rng2, (T, B), cfg.dyn_stoch, cfg.dyn_discrete, cfg.dyn_deter)
    state = {"stoch": torch.from_numpy(stoch), "deter": torch.from_numpy(deter)}
    feat = rssm.get_feat(state)
    assert feat.shape == (T, B, feat_size), feat.shape
    feat_np = common.numpy32(feat)
    feat_order_ok = common.stoch_then_deter(feat_np, stoch, deter)
    assert feat_order_ok

    # --- targets and weights (numpy default_rng(1)) ---
    target_np, weights_np = common.targets_and_weights((T, B))
    # symlog(0) = 0 is the middle bucket; torch's float32 linspace puts bucket 127
    # at 7.45e-8, so DiscDist.log_prob sees below=126, above=127 (weight ~1 on 127)
    target_np[0, 0] = 0.0
    target = torch.from_numpy(target_np)[..., None]
    weights = torch.from_numpy(weights_np)[..., None]

    value_sd = common.sd_numpy(value_mod)
    slow_sd = common.sd_numpy(behavior._slow_value)

    # cross-check first (it works on a deepcopy taken before any slow update)
    train_loss, b_after = train_call_loss(behavior, rssm, state, feat.detach(), target, weights, cfg)

    # --- loss with the exact expression, real DiscDist ---
    value, slow_target, loss, logits, grad_logits = common.loss_and_grads(
        value_mod, lambda: value_loss_expr(behavior, feat, target, weights)
    )
    slow_logits = common.numpy32(slow_target.logits)
    v_mode, v_mean = common.numpy32(value.mode()[..., 0]), common.numpy32(value.mean()[..., 0])
    s_mode, s_mean = common.numpy32(slow_target.mode()[..., 0]), common.numpy32(slow_target.mean()[..., 0])
    assert np.array_equal(v_mode, v_mean) and np.array_equal(s_mode, s_mean)
    lp_target = common.numpy32(value.log_prob(target))
    lp_slow = common.numpy32(value.log_prob(slow_target.mode().detach()))
    buckets = value.buckets.numpy().astype(np.float32)

    # --- one slow update by the real method (_updates == 0 -> applies) ---
    assert behavior._updates == 0
    behavior._update_slow_target()
    slow_after_sd = common.sd_numpy(behavior._slow_value)
    common.check_mixed(slow_after_sd, value_sd, slow_sd, critic["slow_target_fraction"])
    # _train's slow update must agree, and its loss must be the expression's
    # loss evaluated with the updated slow critic.
    b_after_sd = common.sd_numpy(b_after._slow_value)
    for k in slow_after_sd:
        assert np.array_equal(b_after_sd[k], slow_after_sd[k]), k
    _, _, loss_with_updated_slow = value_loss_expr(behavior, feat, target, weights)
    np.testing.assert_allclose(
        train_loss.numpy(), loss_with_updated_slow.detach().numpy(), rtol=1e-6, atol=0
    )

    goldens = common.Goldens()
    put = goldens.put
    texts = (
        "value critic param (torch state_dict layout; Linear [out, in])",
        "slow critic param before the update",
        "slow critic param after ONE real ImagBehavior._update_slow_target() (_updates=0)",
    )
    goldens.put_states(value_sd, slow_sd, slow_after_sd, texts)
    put("stoch", stoch, "state['stoch'] [T,B,dyn_stoch,dyn_discrete] categorical probs")
    put("deter", deter, "state['deter'] [T,B,dyn_deter]")
    put("feat", feat_np, "RSSM.get_feat(state) = cat([stoch.reshape(T,B,stoch*discrete), deter], -1)")
    put("buckets", buckets, "DiscDist.buckets = linspace(-20, 20, 255) (symlog space)")
    put("logits", logits, "value(feat).logits [T,B,255]")
    put("slow_logits", slow_logits, "slow_value(feat).logits [T,B,255]")
    put("value", v_mode, "value(feat).mode() [T,B] real space; DiscDist.mean() is identical code")
    put("slow_value", s_mode, "slow_value(feat).mode() [T,B] real space (the slow regulariser target)")
    put("target", target_np, "lambda-return stand-in [T,B]; target[0,0]=0 (bucket 127 is 7.45e-8 in torch float32)")
    put("weights", weights_np, "weights[:-1] stand-in [T,B]")
    put("logprob_target", lp_target, "value.log_prob(target[...,None]) [T,B]")
    put("logprob_slow", lp_slow, "value.log_prob(slow_value.mode()) [T,B]")
    put("loss", loss.detach().numpy(), "mean(weights * (-log_prob(target) - log_prob(slow.mode()))) with slow_value/* params")
    put("grad_logits", grad_logits, "d loss / d logits [T,B,255]")
    put("train_call_loss", train_loss.numpy(),
        "value loss from the real ImagBehavior._train, which calls _update_slow_target FIRST, "
        "so it equals `loss` evaluated with slow_after/* params")

    manifest = {
        **common.provenance("https://github.com/NM512/dreamerv3-torch", COMMIT, src_sha, "generate_nm512_goldens.py"),
        "config_overrides": OVERRIDES,
        "config_used": {
            "critic": critic,
            "units": cfg.units,
            "act": cfg.act,
            "norm": cfg.norm,
            "dyn_stoch": cfg.dyn_stoch,
            "dyn_discrete": cfg.dyn_discrete,
            "dyn_deter": cfg.dyn_deter,
            "precision": cfg.precision,
            "feat_size": feat_size,
            "layernorm_eps": 1e-3,
            "hidden_linear_bias": False,
            "head_linear_bias": True,
            "num_buckets": 255,
            "bucket_range": [-20.0, 20.0],
        },
        "T": T,
        "B": B,
        "seeds": common.SEEDS,
        "perturbation_order": perturb_order,
        "nm512_head_init_all_zero": head_init_zero,
        "feat_concat_order_stoch_then_deter": feat_order_ok,
        "mode_equals_mean": True,
        "notes": [
            "Built by constructing a real models.ImagBehavior(cfg, world_model) with a "
            "SimpleNamespace world_model holding a real small networks.RSSM (used only for get_feat).",
            "loss is models.py:324-332 with value_input = feat (i.e. feat plays value_input[:-1]).",
            "train_call_loss: real ImagBehavior._train on a deepcopy with _imagine/_compute_target/"
            "_compute_actor_loss stubbed to return these inputs and optimizers replaced by a recorder.",
        ],
    }
    goldens.write(args.out_dir, "nm512_goldens", manifest, compressed=False)
    print(f"loss={loss.item():.7f} train_call_loss={train_loss.item():.7f}")


if __name__ == "__main__":
    main()
