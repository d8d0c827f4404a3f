"""Writes official_goldens.npz by running the OFFICIAL DreamerV3 code (danijar/dreamerv3, JAX).

The official code is not on PyPI at its 2024 revision, so its numbers are
committed: this script ran it, and the tests compare multicritic with them.
Everything numeric below is computed by the official modules; this file only
feeds them fixed, seeded inputs. Compute dtype is float32 (the official
default is bfloat16) so that comparisons can be tight.

To re-run (CPU, about 20 s):

    git clone https://github.com/danijar/dreamerv3 src
    git -C src checkout e3f02248693a79dc8b0ebd62c93683888ddaccfe
    python3 -m venv venv && venv/bin/pip install "jax[cpu]==0.4.33" "numpy<2" chex==0.1.90 optax==0.2.5 \
        ninjax==3.6.3 elements==3.22.4 portal==3.8.3 granular==0.24.2 scope==0.8.1 jaxtyping einops tqdm
    JAX_PLATFORMS=cpu venv/bin/python generate_official_goldens.py     # next to src/

It writes goldens.npz and goldens_manifest.json (every key described);
tests/data/official/ holds the subset the tests read (norm/, meanstd/,
twohot/, slow/, critic/batch/, critic/lr1e-3_nowarmup/), as
official_goldens.npz and official_goldens_manifest.json.
"""
import json
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, 'src'))

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np

import embodied.jax
import embodied.jax.nets as nets
import embodied.jax.outs as outs
from embodied.jax import heads, utils, opt as optlib
from dreamerv3 import agent as agentlib

nets.COMPUTE_DTYPE = jnp.float32  # official: bfloat16 (set by internal.setup)

G = {}       # goldens
M = {}       # manifest: key -> description


def put(key, value, desc):
  G[key] = np.asarray(value)
  M[key] = dict(desc=desc, shape=list(G[key].shape), dtype=str(G[key].dtype))


rng = np.random.default_rng(12345)
scalar = elements.Space(np.float32, ())

# ---------------------------------------------------------------------------
# (i) Normalize('perc') -- embodied/jax/utils.py:16-91
# ---------------------------------------------------------------------------
rets = [rng.normal(2.0, 3.0, (4, 15)).astype(np.float32) for _ in range(3)]
for i, r in enumerate(rets):
  put(f'norm/input_{i}', r, f'returns fed to update #{i + 1}')
for debias in (False, True):
  tag = 'debias' if debias else 'nodebias'
  norm = utils.Normalize(
      'perc', rate=0.01, limit=1.0, perclo=5.0, perchi=95.0, debias=debias,
      name=f'retnorm_{tag}')
  state = {}
  for i, r in enumerate(rets):
    fn = nj.pure(lambda x: norm(x, update=True))
    state, (off, scale) = fn(state, jnp.asarray(r), create=True)
    put(f'norm/{tag}/offset_{i}', off, f'offset returned after update #{i+1}')
    put(f'norm/{tag}/scale_{i}', scale, f'scale returned after update #{i+1}')
    for k, v in state.items():
      put(f'norm/{tag}/state_{i}/{k.split("/")[-2]}', v,
          f'raw state var {k} after update #{i+1}')
  # also percentiles of the inputs themselves for reference
put('norm/config', np.array([0.01, 1.0, 5.0, 95.0]), 'rate, limit, perclo, perchi')

# ---------------------------------------------------------------------------
# (ii) TwoHot over symexp bins -- heads.py:132-144, outs.py:273-330
# ---------------------------------------------------------------------------
def make_bins():
  h = heads.Head(scalar, 'symexp_twohot', bins=255, outscale=0.0, name='binhead')
  out = h(jnp.zeros((1, 3), jnp.float32))
  return out.bins
_, bins = nj.pure(make_bins)({}, create=True, seed=0)
put('twohot/bins', bins, 'bins from Head.symexp_twohot (255 bins)')
logits = rng.normal(0, 1.0, (6, 255)).astype(np.float32)
targets = np.array([0.0, 0.37, -3.2, 25.0, -1e4, 1e10], np.float32)
put('twohot/logits', logits, 'input logits')
put('twohot/targets', targets, 'targets (raw, unsquashed)')
lossfn = lambda lg: outs.TwoHot(lg, bins).loss(jnp.asarray(targets))
loss = lossfn(jnp.asarray(logits))
grad = jax.grad(lambda lg: lossfn(lg).sum())(jnp.asarray(logits))
put('twohot/loss', loss, 'TwoHot(logits,bins).loss(targets)  (= -logp)')
put('twohot/grad_sum_loss_wrt_logits', grad, 'd sum(loss) / d logits')
put('twohot/pred', outs.TwoHot(jnp.asarray(logits), bins).pred(),
    'TwoHot.pred() (symmetric sum of probs*bins)')
put('twohot/pred_uniform', outs.TwoHot(jnp.zeros((1, 255)), bins).pred(),
    'pred for all-zero logits (exactly 0)')

# ---------------------------------------------------------------------------
# (iii) SlowModel -- utils.py:94-127
# ---------------------------------------------------------------------------
VCFG = dict(layers=3, units=16, act='silu', norm='rms', output='symexp_twohot',
            outscale=0.0, winit='trunc_normal_in', bins=255)
D = 8
for rate, every in ((0.02, 1), (0.1, 2)):
  tag = f'rate{rate}_every{every}'
  src = heads.MLPHead(scalar, **VCFG, name='val')
  slow = utils.SlowModel(
      heads.MLPHead(scalar, **VCFG, name='slowval'),
      source=src, rate=rate, every=every)
  x = jnp.asarray(rng.normal(0, 1, (2, D)).astype(np.float32))
  # init both nets with official init, then overwrite with fixed random.
  st, _ = nj.pure(lambda: (src(x, 1), slow(x, 1)) and None)(
      {}, create=True, seed=1)
  st = {k: (jnp.asarray(rng.normal(0, 0.5, v.shape).astype(np.float32))
            if k.startswith(('val/', 'slowval/')) else v) for k, v in st.items()}
  for k, v in st.items():
    put(f'slow/{tag}/init/{k}', v, 'state before any update')
  for i in range(3):
    st, _ = nj.pure(lambda: slow.update())(st, create=True)
    for k, v in st.items():
      if k.startswith('slowval'):
        put(f'slow/{tag}/after_{i}/{k}', v, f'after SlowModel.update #{i+1}')
# copy-on-first-use
src = heads.MLPHead(scalar, **VCFG, name='val')
slow = utils.SlowModel(heads.MLPHead(scalar, **VCFG, name='slowval'),
                       source=src, rate=0.02, every=1)
x = jnp.asarray(rng.normal(0, 1, (2, D)).astype(np.float32))
st, _ = nj.pure(lambda: src(x, 1) and None)({}, create=True, seed=2)
st, _ = nj.pure(lambda: slow.update())(st, create=True)
put('slow/firstuse/maxabsdiff', np.array(max(
    float(np.abs(st['val/' + k[len('slowval/'):]] - v).max())
    for k, v in st.items() if k.startswith('slowval/'))),
    'max|slowval - val| after first update on an empty slow net: it is '
    'copied, then mixed 0.02*src+0.98*copy (equal up to f32 rounding)')

# ---------------------------------------------------------------------------
# (iv) Critic updates: imag_loss (value part) + repl_loss + Optimizer
#      dreamerv3/agent.py:65-68,139-142,203-240,342-490 ; opt.py
# ---------------------------------------------------------------------------
B, T, H = 2, 5, 4
K = T
BK = B * K
rep_inp = rng.normal(0, 1, (B, T, D)).astype(np.float32)
img_inp = rng.normal(0, 1, (BK, H + 1, D)).astype(np.float32)
img_inp[:, 0] = rep_inp.reshape(BK, D)   # imag starts at replay states
img_rew = rng.normal(0.5, 1.0, (BK, H + 1)).astype(np.float32)
img_con = rng.uniform(0.8, 1.0, (BK, H + 1)).astype(np.float32)
img_con[0, 2] = 0.0                           # one terminal in imagination
rep_rew = rng.normal(0.5, 1.0, (B, T)).astype(np.float32)
rep_last = np.zeros((B, T), bool); rep_last[1, 2] = True
rep_term = np.zeros((B, T), bool); rep_term[1, 2] = True
img_act = rng.integers(0, 3, (BK, H + 1)).astype(np.int32)
pol_logits = np.zeros((BK, H + 1, 3), np.float32)
batch = dict(rep_inp=rep_inp, img_inp=img_inp, img_rew=img_rew,
             img_con=img_con, rep_rew=rep_rew, rep_last=rep_last,
             rep_term=rep_term, img_act=img_act)
for k, v in batch.items():
  put(f'critic/batch/{k}', v, 'fixed batch (same for all 3 updates)')

IMAG = dict(slowtar=False, lam=0.95, actent=3e-4, slowreg=1.0)
REPL = dict(slowtar=False, lam=0.95, slowreg=1.0)
SCALES = dict(value=1.0, repval=0.3)


def run_critic(tag, optcfg, steps=3):
  val = heads.MLPHead(scalar, **VCFG, name='val')
  slowval = utils.SlowModel(heads.MLPHead(scalar, **VCFG, name='slowval'),
                            source=val, rate=0.02, every=1)
  retnorm = utils.Normalize('perc', rate=0.01, limit=1.0, perclo=5.0,
                            perchi=95.0, debias=False, name='retnorm')
  valnorm = utils.Normalize('none', rate=0.01, limit=1e-8, name='valnorm')
  advnorm = utils.Normalize('none', rate=0.01, limit=1e-8, name='advnorm')
  tx = agentlib.Agent._make_opt(None, **optcfg)
  opt = optlib.Optimizer([val], tx, summary_depth=1, name='opt')

  def lossfn(b, training):
    policy = {'action': outs.Categorical(jnp.asarray(pol_logits))}
    act = {'action': b['img_act']}
    los, imgout, _ = agentlib.imag_loss(
        act, b['img_rew'], b['img_con'], policy,
        val(b['img_inp'], 2), slowval(b['img_inp'], 2),
        retnorm, valnorm, advnorm, update=training,
        contdisc=True, horizon=333, **IMAG)
    value = los['value'].mean(1).reshape((B, K))       # agent.py:215
    boot = imgout['ret'][:, 0].reshape(B, K)            # agent.py:222
    rlos, repout, _ = agentlib.repl_loss(
        b['rep_last'], b['rep_term'], b['rep_rew'], boot,
        val(b['rep_inp'], 2), slowval(b['rep_inp'], 2), valnorm,
        update=training, horizon=333, **REPL)
    loss = value.mean() * SCALES['value'] + rlos['repval'].mean() * SCALES['repval']
    aux = dict(value_loss=value, repval_loss=rlos['repval'],
               imag_ret=imgout['ret'], repl_ret=repout['ret'],
               val_pred_img=val(b['img_inp'], 2).pred(),
               slow_pred_img=slowval(b['img_inp'], 2).pred(),
               loss=loss)
    return loss, aux

  def train(b):
    mets, aux = opt(lossfn, b, training=True, has_aux=True)   # agent.py:139
    slowval.update()                                           # agent.py:142
    return mets, aux

  def grads(b):
    _, _, g, _ = nj.grad(lambda b: lossfn(b, False), [val], has_aux=True)(b)
    return g

  b = {k: jnp.asarray(v) for k, v in batch.items()}
  # Official init (like Agent init: runs train with create=True, ignore=True).
  state = nj.init(train)({}, b, seed=0)
  # Give the output layer non-zero weights (official init has outscale=0 ->
  # zero kernel) so predictions are non-trivial; keep slowval == val as the
  # official copy-on-first-use does.
  st = dict(state)
  kk = 'val/head/logits/kernel'
  st[kk] = jnp.asarray(rng.normal(0, 0.05, st[kk].shape).astype(np.float32))
  for k in list(st):
    if k.startswith('slowval/'):
      st[k] = st['val/' + k[len('slowval/'):]]
  for k, v in st.items():
    put(f'critic/{tag}/init/{k}', v, 'state before update #1')
  ptrain = jax.jit(lambda st, b, seed: nj.pure(train)(st, b, seed=seed))
  pgrads = jax.jit(lambda st, b: nj.pure(grads)(st, b, ignore=True))
  for i in range(steps):
    _, g = pgrads(st, b)
    for k, v in g.items():
      put(f'critic/{tag}/step{i}/grad/{k}', v,
          f'grad of loss wrt val params at state before update #{i+1} '
          '(computed with training=False: retnorm not updated; value/repval '
          'losses do not depend on retnorm, so equal to the training grad)')
    st, (mets, aux) = ptrain(st, b, i)
    for k, v in aux.items():
      put(f'critic/{tag}/step{i}/aux/{k}', v, f'loss-internal values of update #{i+1}')
    for k, v in mets.items():
      put(f'critic/{tag}/step{i}/metric/{k}', v, f'Optimizer metric, update #{i+1}')
    for k, v in st.items():
      put(f'critic/{tag}/step{i}/state/{k}', v, f'state after update #{i+1}')


run_critic('official_opt', dict(
    lr=4e-5, agc=0.3, eps=1e-20, beta1=0.9, beta2=0.999, momentum=True,
    wd=0.0, schedule='const', warmup=1000, anneal=0))
run_critic('lr1e-3_nowarmup', dict(
    lr=1e-3, agc=0.3, eps=1e-20, beta1=0.9, beta2=0.999, momentum=True,
    wd=0.0, schedule='const', warmup=0, anneal=0))

# (v) Normalize('meanstd'), on the same returns as (i) (added after the rest: no other input changes).
for debias in (False, True):
  tag = 'debias' if debias else 'nodebias'
  norm = utils.Normalize('meanstd', rate=0.01, limit=1.0, debias=debias, name=f'meanstd_{tag}')
  state = {}
  for i, r in enumerate(rets):
    fn = nj.pure(lambda x: norm(x, update=True))
    state, (off, scale) = fn(state, jnp.asarray(r), create=True)
    put(f'meanstd/{tag}/offset_{i}', off, f'meanstd offset (mean) after update #{i+1}')
    put(f'meanstd/{tag}/scale_{i}', scale, f'meanstd scale (std, >= limit) after update #{i+1}')

out = os.path.join(HERE, 'goldens.npz')
np.savez(out, **G)
with open(os.path.join(HERE, 'goldens_manifest.json'), 'w') as f:
  json.dump(dict(
      commit='e3f02248693a79dc8b0ebd62c93683888ddaccfe',
      compute_dtype='float32', value_cfg=VCFG, input_dim=D,
      B=B, T=T, H=H, imag_loss=IMAG, repl_loss=REPL, scales=SCALES,
      slowvalue=dict(rate=0.02, every=1), keys=M), f, indent=1)
print('wrote', out, len(G), 'arrays')
