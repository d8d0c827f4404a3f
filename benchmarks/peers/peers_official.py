"""The official DreamerV3 (JAX) critic update, timed; optionally paired with multicritic's JAX step.

The official code (github.com/danijar/dreamerv3, commit e3f02248693a79dc8b0ebd62c93683888ddaccfe; not on
PyPI) needs its own environment (jax 0.4.33, numpy < 2), where multicritic (Keras 3, newer JAX) cannot
be imported. Build it as tests/data/interop/official/generate_official_critic_goldens.py says:

    git clone https://github.com/danijar/dreamerv3 /tmp/official_work/repo
    mkdir -p /tmp/official_work/src
    git -C /tmp/official_work/repo archive e3f02248693a79dc8b0ebd62c93683888ddaccfe \\
        | tar -x -C /tmp/official_work/src
    python3 -m venv /tmp/official_work/venv
    /tmp/official_work/venv/bin/pip install "jax[cpu]==0.4.33" "numpy<2" chex==0.1.90 optax==0.2.5 \\
        ninjax==3.6.3 elements==3.22.4 portal==3.8.3 granular==0.24.2 scope==0.8.1 jaxtyping einops \\
        tqdm ruamel.yaml

then, from the repository root:

    /tmp/official_work/venv/bin/python benchmarks/peers/peers_official.py --size XS --batch 256 4096 15360 \\
        --pair-python /work/venv/bin/python --json official.json

`--pair-python` is a Python with multicritic and JAX installed: this script starts
``benchmarks/peers/peers.py --serve dreamerv3`` under it (KERAS_BACKEND=jax) and times multicritic's
``CriticTrainer.train_step`` there with the official options (multicritic.interop.dreamerv3.CRITIC_OPTIONS,
``multicritic.training.optimizers.official_optimizer()``, grad_clip=None, EMA decay 0.98), on the same N latents
(benchmarks.peers.peers.latents(N, ..., seed=N)), in blocks interleaved with the official ones (official, ours,
ours, official, ...); only each block's own loop is timed in each process. The table and JSON have the
columns of benchmarks/peers/peers.py (peer "official"; ratio = official time / multicritic time). Without
`--pair-python` only the official times are given (multicritic_ms null); pair them by hand with multicritic's
JAX step measured separately at the same size, batch and options, e.g. ``KERAS_BACKEND=jax python
benchmarks/peers/peers.py --serve dreamerv3 --size XS`` fed ``{"batch": N, "count": c}`` lines, not with
benchmarks/ours/train_step.py, whose critic has the 2023 options.

What one official step is (paths under the official source; sizes: multicritic's `--size`: deter =
gru_units, stoch x classes = num_z_categoricals x num_z_classes, value MLP num_dense_layers x
dense_hidden_units, 255 bins):

* config: dreamerv3/configs.yaml ``defaults`` with agent.dyn.rssm.deter/stoch/classes and
  agent.value.layers/units set to the size (the other networks only need to be constructible and are
  never called), wrapped as dreamerv3/main.py:138-149 does; ``val`` (``embodied.jax.MLPHead``, output
  symexp_twohot, RMSNorm, biases, trunc-normal fan-in, zero-initialised head) and ``slowval``
  (``embodied.jax.SlowModel``, rate 0.02, every 1; copied from val on first use, embodied/jax/utils.py:94-127)
  built by ``dreamerv3.agent.Agent.__init__`` itself (agent.py:65-68) on an instance made with
  ``object.__new__`` (as the goldens script does);
* optimizer: ``embodied.jax.Optimizer([val], agent._make_opt(**config.opt))`` (embodied/jax/opt.py:16-81,
  agent.py:342-379: per-tensor AGC 0.3, RMS scaling (beta2 0.999, eps 1e-20), momentum 0.9, lr 4e-5 with
  1000 linear warm-up steps), i.e. the agent's ``self.opt`` (agent.py:76-78) restricted to the value head;
  it also computes its metrics (grad norm, rms of grads, updates and params) as it does in the agent;
* step, jitted as one function (``jax.jit(nj.pure(train))``, the state donated): ``opt(loss)`` with
  loss = the value part of ``imag_loss`` (agent.py:419-422): val and slowval forward on the [B, T + 1]
  imagined features (as agent.py:203-214, feat = ``agent.feat2tensor`` = cat(deter, stoch flat)),
  weight[:, :-1] * (val.loss(targets padded to T + 1) + 1.0 * val.loss(sg(slowval.pred())))[:, :-1],
  reduced as agent.py:215 and :240 (mean, loss scale value = 1); then ``slowval.update()`` (agent.py:142,
  utils.py:113-119). Not included (on either side): imagination, lambda-returns, the return/value
  normalisers (valnorm is ``none`` by default), the replay value loss (repval).
* compute dtype float32 (as multicritic's step; the official default is bfloat16, set by
  embodied/jax/internal.py:setup from ``jax.compute_dtype``; ``--compute-dtype bfloat16`` for that).
* inputs: the first T * B rows of benchmarks.peers.peers.latents(N) laid out [B, T] batch-major (T from
  benchmarks.peers.peers.horizon_split: the divisor of N nearest the horizon 15), plus the horizon's last row
  (t = H), which the loss drops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.peers.peers import BINS, horizon_split, interleave, latents, table  # noqa: E402  (stdlib-only)

COMMIT = "e3f02248693a79dc8b0ebd62c93683888ddaccfe"
# multicritic/model/sizes.py `_MODEL_DIMS` (multicritic cannot be imported here; tests/benchmarks/test_peers.py
# checks that the two agree): (gru_units, dense_hidden_units, num_dense_layers, num_z_categoricals,
# num_z_classes).
MODEL_DIMS = {
    "nano": (16, 16, 1, 4, 4),
    "micro": (32, 32, 1, 8, 8),
    "mini": (64, 64, 1, 16, 16),
    "XXS": (128, 128, 1, 32, 32),
    "XS": (256, 256, 1, 32, 32),
    "S": (512, 512, 2, 32, 32),
    "M": (1024, 640, 3, 32, 32),
    "L": (2048, 768, 4, 32, 32),
    "XL": (4096, 1024, 5, 32, 32),
}
DIM_KEYS = ("gru_units", "dense_hidden_units", "num_dense_layers", "num_z_categoricals", "num_z_classes")


def find_src(src=None):
    src = src or os.environ.get("OFFICIAL_SRC") or "/tmp/official_work/src"
    if not os.path.isfile(os.path.join(src, "dreamerv3", "agent.py")):
        raise SystemExit(
            f"no official source at {src}: extract danijar/dreamerv3 at {COMMIT} there "
            "(see this script's docstring) or give --src / OFFICIAL_SRC"
        )
    return src


def make_official(dims, n, src, compute_dtype="float32"):
    """run_block(count) for the official value-head update at batch n; and the (T + 1, B) layout."""
    if src not in sys.path:
        sys.path.insert(0, src)
    import elements
    import jax
    import jax.numpy as jnp
    import ninjax as nj
    import numpy as np
    import ruamel.yaml as yaml

    import embodied
    import embodied.jax.nets as nets
    from dreamerv3 import agent as agentlib

    nets.COMPUTE_DTYPE = getattr(jnp, compute_dtype)
    sg = jax.lax.stop_gradient
    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    cats, classes = dims["num_z_categoricals"], dims["num_z_classes"]

    configs = yaml.YAML(typ="safe").load(elements.Path(os.path.join(src, "dreamerv3", "configs.yaml")).read())
    config = elements.Config(configs["defaults"])
    config = config.update({r".*\.units": 32, r".*\.depth": 2}).update(
        {
            "agent.dyn.rssm.deter": gru,
            "agent.dyn.rssm.stoch": cats,
            "agent.dyn.rssm.classes": classes,
            "agent.dyn.rssm.hidden": 32,
            "agent.value.layers": layers,
            "agent.value.units": units,
            "agent.value.bins": BINS,
        }
    )
    agent_config = elements.Config(  # dreamerv3/main.py:138-149
        **config.agent,
        logdir="/tmp/unused",
        seed=config.seed,
        jax=config.jax,
        batch_size=config.batch_size,
        batch_length=config.batch_length,
        replay_context=config.replay_context,
        report_length=config.report_length,
        replica=config.replica,
        replicas=config.replicas,
    )
    assert agent_config.slowvalue.rate == 0.02 and agent_config.slowvalue.every == 1
    obs_space = {
        "vec": elements.Space(np.float32, (3,)),
        "reward": elements.Space(np.float32),
        "is_first": elements.Space(bool),
        "is_last": elements.Space(bool),
        "is_terminal": elements.Space(bool),
    }
    act_space = {"action": elements.Space(np.int32, (), 0, 3)}
    agent = object.__new__(agentlib.Agent)
    agentlib.Agent.__init__(agent, obs_space, act_space, agent_config)
    val, slowval = agent.val, agent.slowval
    opt = embodied.jax.Optimizer([val], agent._make_opt(**agent_config.opt), summary_depth=1, name="valopt")
    slowreg = float(agent_config.imag_loss.slowreg)
    scale = float(agent_config.loss_scales.value)

    def lossfn(feat, ret, weight):  # agent.py:203-215, 419-422, 240
        value, slowvalue = val(feat, 2), slowval(feat, 2)
        tar_padded = jnp.concatenate([ret, 0 * ret[:, -1:]], 1)
        losses = sg(weight[:, :-1]) * (value.loss(sg(tar_padded)) + slowreg * value.loss(sg(slowvalue.pred())))[:, :-1]
        return losses.mean(1).mean() * scale

    def train(feat, ret, weight):
        metrics = opt(lossfn, feat, ret, weight)  # agent.py:139-140
        slowval.update()  # agent.py:142
        return metrics["valopt/loss"]

    h, z, targets, weights = latents(n, gru, cats, classes, seed=n)
    t, b = horizon_split(n)
    deter = h.reshape(t, b, gru).transpose(1, 0, 2)
    stoch = z.reshape(t, b, cats, classes).transpose(1, 0, 2, 3)
    deter = np.concatenate([deter, deter[:, :1]], 1)  # + the horizon's last row (t = H), dropped by the loss
    stoch = np.concatenate([stoch, stoch[:, :1]], 1)
    feat = agent.feat2tensor({"deter": jnp.asarray(deter), "stoch": jnp.asarray(stoch)})
    ret = jnp.asarray(targets.reshape(t, b).T)
    weight = jnp.asarray(np.concatenate([weights.reshape(t, b), np.ones((1, b), np.float32)], 0).T)

    with contextlib.redirect_stdout(sys.stderr):  # the Optimizer prints its parameter count on creation
        state = nj.init(train)({}, feat, ret, weight, seed=0)
    pure = nj.pure(train)
    step = jax.jit(lambda state, *args: pure(state, *args), donate_argnums=0)
    holder = {"state": state}

    def run_block(count):
        start = time.perf_counter()
        for _ in range(count):
            holder["state"], loss = step(holder["state"], feat, ret, weight)
        loss.block_until_ready()
        return (time.perf_counter() - start) / count

    note = (
        f"official e3f0224 val/slowval MLPHead {layers}x{units} (symexp_twohot, {compute_dtype}), in "
        f"deter|stoch {gru}+{cats * classes}; Optimizer(AGC {agent_config.opt.agc}, RMS eps "
        f"{agent_config.opt.eps}, lr {agent_config.opt.lr}, warmup {agent_config.opt.warmup}); "
        f"SlowModel rate {agent_config.slowvalue.rate}; jax {jax.__version__}"
    )
    return run_block, (t + 1, b), note


class PairedMulticritic:
    """multicritic's JAX step in a child process (`benchmarks/peers/peers.py --serve dreamerv3`)."""

    def __init__(self, python, size):
        env = dict(
            os.environ,
            KERAS_BACKEND="jax",
            JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
            TF_CPP_MIN_LOG_LEVEL="3",
        )
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            [python, os.path.join(HERE, "peers.py"), "--serve", "dreamerv3", "--size", size],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def block(self, n):
        def run_block(count):
            self.proc.stdin.write(json.dumps({"batch": n, "count": count}) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith("PEERS "):
                    return json.loads(line[len("PEERS ") :])["seconds"]
            raise RuntimeError(f"the multicritic child exited ({self.proc.wait()})")

        return run_block

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run(size, batches, repeats, block_seconds, src, compute_dtype, pair_python):
    dims = dict(zip(DIM_KEYS, MODEL_DIMS[size]))
    paired = PairedMulticritic(pair_python, size) if pair_python else None
    records = []
    try:
        for n in batches:
            official, layout, note = make_official(dims, n, src, compute_dtype)
            blocks = {"official": official}
            if paired:
                blocks["multicritic"] = paired.block(n)
            times, count = interleave(blocks, repeats, block_seconds)
            ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
            ours = ms.get("multicritic")
            records.append(
                {
                    "peer": "official",
                    "backend": "jax",
                    "size": size,
                    "dims": dims,
                    "batch": n,
                    "layout": list(layout),
                    "constructor": note
                    + (
                        "; multicritic: CRITIC_OPTIONS of interop.dreamerv3, official_optimizer()"
                        if paired
                        else "; multicritic not paired"
                    ),
                    "peer_ms": ms["official"],
                    "multicritic_ms": ours,
                    "ratio": ms["official"] / ours if ours else None,
                    "peer_samples": [v * 1e3 for v in times["official"]],
                    "multicritic_samples": [v * 1e3 for v in times.get("multicritic", [])],
                    "repeats": repeats,
                    "steps_per_block": count,
                    "compute_dtype": compute_dtype,
                }
            )
            print(
                f"official N={n}: {ms['official']:.3f} ms" + (f", multicritic {ours:.3f} ms" if ours else ""),
                file=sys.stderr,
            )
    finally:
        if paired:
            paired.close()
    return records


def _table(records):
    if all(r["multicritic_ms"] is not None for r in records):
        return table(records)
    lines = ["| peer | batch N | rows (T x B) | official ms |", "|---|---:|---:|---:|"]
    lines += [
        f"| official | {r['batch']} | {r['layout'][0]} x {r['layout'][1]} | {r['peer_ms']:.3f} |" for r in records
    ]
    lines += ["", f"- official: {records[0]['constructor']}"] if records else []
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="XS", choices=list(MODEL_DIMS), help="multicritic model size")
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096, 15360])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=1.0)
    parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--src", help="the official source tree (default: $OFFICIAL_SRC or /tmp/official_work/src)")
    parser.add_argument(
        "--pair-python",
        metavar="PYTHON",
        help="a Python with multicritic + JAX: time multicritic's JAX step there, interleaved",
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    records = run(
        args.size,
        args.batch,
        args.repeats,
        args.block_seconds,
        find_src(args.src),
        args.compute_dtype,
        args.pair_python,
    )
    print(_table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
