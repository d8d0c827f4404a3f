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
import argparse
import copy
import hashlib
import json
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
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


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default=os.environ.get("NM512_SRC", os.path.join(HERE, "src")))
    p.add_argument("--out-dir", default=HERE)
    p.add_argument("--allow-source-mismatch", action="store_true")
    return p.parse_args()


def check_source(src, allow):
    got = {}
    for name, want in SOURCE_SHA256.items():
        with open(os.path.join(src, name), "rb") as f:
            got[name] = hashlib.sha256(f.read()).hexdigest()
        if got[name] != want:
            msg = f"{name}: sha256 {got[name]} != expected {want} (commit {COMMIT})"
            if not allow:
                raise SystemExit(msg + "; pass --allow-source-mismatch to go on")
            print("WARNING:", msg)
    return got


def import_nm512(src):
    sys.path.insert(0, os.path.abspath(src))
    try:
        import torch.utils.tensorboard  # noqa: F401  (tools.py needs it at import)
    except ImportError:
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = None  # only tools.Logger uses it
        sys.modules["torch.utils.tensorboard"] = stub
        print("note: tensorboard missing; stubbed torch.utils.tensorboard")
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


def sd_numpy(module):
    return {k: v.detach().cpu().numpy().astype(np.float32).copy() for k, v in module.state_dict().items()}


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
    args = parse_args()
    src_sha = check_source(args.src, args.allow_source_mismatch)
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
    init_sd = sd_numpy(value_mod)
    init_slow_sd = sd_numpy(behavior._slow_value)
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
    lg = 2.0 * rng2.normal(size=(T, B, cfg.dyn_stoch, cfg.dyn_discrete))
    stoch = np.exp(lg - lg.max(-1, keepdims=True))
    stoch = (stoch / stoch.sum(-1, keepdims=True)).astype(np.float32)
    deter = np.tanh(rng2.normal(size=(T, B, cfg.dyn_deter))).astype(np.float32)
    state = {"stoch": torch.from_numpy(stoch), "deter": torch.from_numpy(deter)}
    feat = rssm.get_feat(state)
    assert feat.shape == (T, B, feat_size), feat.shape
    feat_np = feat.detach().numpy().astype(np.float32)
    flat = stoch.reshape(T, B, -1)
    feat_order_ok = bool(
        np.array_equal(feat_np[..., : flat.shape[-1]], flat)
        and np.array_equal(feat_np[..., flat.shape[-1]:], deter)
    )
    assert feat_order_ok

    # --- targets and weights (numpy default_rng(1)) ---
    rng1 = np.random.default_rng(1)
    target_np = rng1.uniform(-50.0, 50.0, size=(T, B)).astype(np.float32)
    # symlog(0) = 0 is the middle bucket; torch's float32 linspace puts bucket 127
    # at 7.45e-8, so DiscDist.log_prob sees below=126, above=127 (weight ~1 on 127)
    target_np[0, 0] = 0.0
    weights_np = rng1.uniform(0.5, 1.0, size=(T, B)).astype(np.float32)
    target = torch.from_numpy(target_np)[..., None]
    weights = torch.from_numpy(weights_np)[..., None]

    value_sd = sd_numpy(value_mod)
    slow_sd = sd_numpy(behavior._slow_value)

    # cross-check first (it works on a deepcopy taken before any slow update)
    train_loss, b_after = train_call_loss(behavior, rssm, state, feat.detach(), target, weights, cfg)

    # --- loss with the exact expression, real DiscDist ---
    for p in value_mod.parameters():
        p.grad = None
    value, slow_target, loss = value_loss_expr(behavior, feat, target, weights)
    loss.backward()
    grad_logits = value.logits.grad.detach().numpy().astype(np.float32)
    logits = value.logits.detach().numpy().astype(np.float32)
    slow_logits = slow_target.logits.detach().numpy().astype(np.float32)
    v_mode = value.mode().detach()[..., 0].numpy().astype(np.float32)
    v_mean = value.mean().detach()[..., 0].numpy().astype(np.float32)
    s_mode = slow_target.mode().detach()[..., 0].numpy().astype(np.float32)
    s_mean = slow_target.mean().detach()[..., 0].numpy().astype(np.float32)
    assert np.array_equal(v_mode, v_mean) and np.array_equal(s_mode, s_mean)
    lp_target = value.log_prob(target).detach().numpy().astype(np.float32)
    lp_slow = value.log_prob(slow_target.mode().detach()).detach().numpy().astype(np.float32)
    buckets = value.buckets.numpy().astype(np.float32)

    # --- one slow update by the real method (_updates == 0 -> applies) ---
    assert behavior._updates == 0
    behavior._update_slow_target()
    slow_after_sd = sd_numpy(behavior._slow_value)
    mix = critic["slow_target_fraction"]
    for k in slow_sd:
        ref = mix * value_sd[k] + (1 - mix) * slow_sd[k]
        np.testing.assert_allclose(slow_after_sd[k], ref, rtol=1e-6, atol=1e-7)
    # _train's slow update must agree, and its loss must be the expression's
    # loss evaluated with the updated slow critic.
    b_after_sd = sd_numpy(b_after._slow_value)
    for k in slow_after_sd:
        assert np.array_equal(b_after_sd[k], slow_after_sd[k]), k
    _, _, loss_with_updated_slow = value_loss_expr(behavior, feat, target, weights)
    np.testing.assert_allclose(
        train_loss.numpy(), loss_with_updated_slow.detach().numpy(), rtol=1e-6, atol=0
    )

    out = {}
    desc = {}

    def put(key, arr, text):
        out[key] = np.asarray(arr, dtype=np.float32)
        desc[key] = text

    for k, v in value_sd.items():
        put(f"value/{k}", v, "value critic param (torch state_dict layout; Linear [out, in])")
    for k, v in slow_sd.items():
        put(f"slow_value/{k}", v, "slow critic param before the update")
    for k, v in slow_after_sd.items():
        put(f"slow_after/{k}", v, "slow critic param after ONE real ImagBehavior._update_slow_target() (_updates=0)")
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

    os.makedirs(args.out_dir, exist_ok=True)
    npz_path = os.path.join(args.out_dir, "nm512_goldens.npz")
    np.savez(npz_path, **out)
    manifest = {
        "source": "https://github.com/NM512/dreamerv3-torch",
        "commit": COMMIT,
        "source_sha256": src_sha,
        "generator": "generate_nm512_goldens.py",
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
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
        "seeds": {
            "torch.manual_seed": 0,
            "perturbation": "np.random.default_rng(0)",
            "inputs": "np.random.default_rng(2)",
            "target_weights": "np.random.default_rng(1)",
        },
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
        "keys": {k: {"shape": list(v.shape), "dtype": str(v.dtype), "desc": desc[k]} for k, v in out.items()},
    }
    with open(os.path.join(args.out_dir, "nm512_goldens_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {npz_path} ({os.path.getsize(npz_path)} bytes), {len(out)} keys")
    print(f"loss={loss.item():.7f} train_call_loss={train_loss.item():.7f}")


if __name__ == "__main__":
    main()
