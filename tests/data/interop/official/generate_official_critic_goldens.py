"""Writes official_critic_goldens.npz by running the OFFICIAL DreamerV3 code.

Source: danijar/dreamerv3 (JAX), commit e3f02248693a79dc8b0ebd62c93683888ddaccfe
(2024 revision; not on PyPI, so the numbers are committed and this script is
only needed to regenerate them). Everything numeric is computed by the
official modules; this file only feeds them fixed, seeded inputs and
overwrites some parameters with seeded draws. Compute dtype is float32 (the
official default, set by embodied/jax/internal.py:setup, is bfloat16).

What is official here:
  * the config: dreamerv3/configs.yaml `defaults`, updated with small sizes
    through elements.Config.update, then wrapped as dreamerv3/main.py:138
    (make_agent) does;
  * val, slowval, feat2tensor: built by the official dreamerv3.agent.Agent
    .__init__ itself (agent.py:51-53, 65-68), called on an instance made with
    object.__new__ so that embodied.jax.Agent.__new__ (device meshes, jit,
    full-agent param init) is skipped. The feat is obj.feat2tensor, i.e. the
    official lambda object;
  * parameter init: ninjax init of val / slowval (embodied/jax/nets.py
    Initializer, SlowModel copy-on-first-use utils.py:121-127);
  * output distribution: the head's outs.TwoHot (pred, loss);
  * slow update: SlowModel.update (utils.py:113-119).

To re-run (CPU, ~10 s), from any folder:

    # official source (here: the `fetch` tool's mirror, or a git clone)
    git clone https://github.com/danijar/dreamerv3 /tmp/official_work/repo
    mkdir -p /tmp/official_work/src
    git -C /tmp/official_work/repo archive e3f02248693a79dc8b0ebd62c93683888ddaccfe \
        | tar -x -C /tmp/official_work/src
    python3 -m venv /tmp/official_work/venv
    /tmp/official_work/venv/bin/pip install "jax[cpu]==0.4.33" "numpy<2" chex==0.1.90 \
        optax==0.2.5 ninjax==3.6.3 elements==3.22.4 portal==3.8.3 granular==0.24.2 \
        scope==0.8.1 jaxtyping einops tqdm ruamel.yaml
    OFFICIAL_SRC=/tmp/official_work/src JAX_PLATFORMS=cpu \
        /tmp/official_work/venv/bin/python \
        tests/data/interop/official/generate_official_critic_goldens.py

OFFICIAL_SRC defaults to ./src next to this script, then /tmp/official_work/src.
Writes official_critic_goldens.npz and official_critic_goldens_manifest.json
next to this script (or to the folder given as the first argument).
"""
import json
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
HERE = os.path.dirname(os.path.abspath(__file__))
COMMIT = 'e3f02248693a79dc8b0ebd62c93683888ddaccfe'
SRC = os.environ.get('OFFICIAL_SRC') or next(
    (p for p in (os.path.join(HERE, 'src'), '/tmp/official_work/src')
     if os.path.isdir(p)), None)
assert SRC and os.path.isfile(os.path.join(SRC, 'dreamerv3', 'agent.py')), (
    'set OFFICIAL_SRC to an extracted danijar/dreamerv3 tree at ' + COMMIT)
sys.path.insert(0, SRC)
OUTDIR = sys.argv[1] if len(sys.argv) > 1 else HERE

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import ruamel.yaml as yaml

import embodied.jax.nets as nets
import embodied.jax.outs as outs
from dreamerv3 import agent as agentlib

nets.COMPUTE_DTYPE = jnp.float32  # official: bfloat16 (internal.setup)
sg = jax.lax.stop_gradient

T, B = 3, 4
DETER, STOCH, CLASSES = 24, 4, 5
SMALL = {
    'agent.dyn.rssm.deter': DETER, 'agent.dyn.rssm.stoch': STOCH,
    'agent.dyn.rssm.classes': CLASSES, 'agent.dyn.rssm.hidden': 8,
    'agent.value.layers': 2, 'agent.value.units': 32,
    # other nets only need to be constructible (they are never called):
    r'.*\.units': 32, r'.*\.depth': 2,
}

configs = yaml.YAML(typ='safe').load(
    elements.Path(os.path.join(SRC, 'dreamerv3', 'configs.yaml')).read())


def make_config(*names, **overrides):
  config = elements.Config(configs['defaults'])
  for name in names:
    config = config.update(configs[name])
  # keep the value-head keys exact: apply the regex first, then the exact keys
  pats = {k: v for k, v in overrides.items() if k.startswith('.*')}
  exact = {k: v for k, v in overrides.items() if not k.startswith('.*')}
  return config.update(pats).update(exact) if overrides else config


config = make_config(**SMALL)
# As dreamerv3/main.py:138-149 (make_agent) builds the agent config.
agent_config = elements.Config(
    **config.agent, logdir='/tmp/unused', seed=config.seed, jax=config.jax,
    batch_size=config.batch_size, batch_length=config.batch_length,
    replay_context=config.replay_context, report_length=config.report_length,
    replica=config.replica, replicas=config.replicas)

obs_space = {
    'vec': elements.Space(np.float32, (3,)),
    'reward': elements.Space(np.float32),
    'is_first': elements.Space(bool), 'is_last': elements.Space(bool),
    'is_terminal': elements.Space(bool)}
act_space = {'action': elements.Space(np.int32, (), 0, 3)}

# Official Agent.__init__ on a bare instance (skips embodied.jax.Agent.__new__).
agent = object.__new__(agentlib.Agent)
agentlib.Agent.__init__(agent, obs_space, act_space, agent_config)
val, slowval, feat2tensor = agent.val, agent.slowval, agent.feat2tensor
assert feat2tensor.__code__.co_filename.endswith('dreamerv3/agent.py')

G, M = {}, {}


def put(key, value, desc):
  G[key] = np.asarray(value, np.float32)
  M[key] = dict(desc=desc, shape=list(G[key].shape))


# ---------------------------------------------------------------- inputs
rin = np.random.default_rng(2)
deter = np.tanh(rin.normal(0, 1, (T, B, DETER))).astype(np.float32)
stoch = jax.nn.softmax(rin.normal(0, 3, (T, B, STOCH, CLASSES)), -1)
stoch = np.asarray(stoch, np.float32)
feat = np.asarray(feat2tensor({'deter': jnp.asarray(deter),
                               'stoch': jnp.asarray(stoch)}))
assert feat.dtype == np.float32 and feat.shape == (T, B, DETER + STOCH * CLASSES)
np.testing.assert_array_equal(
    feat, np.concatenate([deter, stoch.reshape(T, B, -1)], -1))

# ---------------------------------------------------------------- params
def init_both(x):
  val(x, 2)
  slowval(x, 2)    # SlowModel._initonce: copies val's values into slowval

state = nj.init(init_both)({}, jnp.asarray(feat), seed=0)
state = {k: np.asarray(v) for k, v in state.items()}
init_keys = sorted(state)
vkeys = sorted(k for k in state if k.startswith('val/'))
skeys = sorted(k for k in state if k.startswith('slowval/'))
assert [k[len('slowval/'):] for k in skeys] == [k[len('val/'):] for k in vkeys]
official_init = {k: state[k].copy() for k in vkeys}

rng = np.random.default_rng(0)
for k in vkeys:                   # sorted order -> deterministic draws
  v = state[k]
  if k.startswith('val/head/'):   # logits kernel + bias: zeros officially
    state[k] = rng.normal(0, 0.05, v.shape)
  elif k.endswith('/scale'):
    state[k] = 1 + rng.normal(0, 0.1, v.shape)
  elif k.endswith('/bias'):
    state[k] = rng.normal(0, 0.1, v.shape)
  # mlp kernels: keep the official trunc_normal_in init (jax seed 0)
  state[k] = state[k].astype(np.float32)
for k in skeys:
  state[k] = (state['val/' + k[len('slowval/'):]] +
              rng.normal(0, 0.01, state[k].shape)).astype(np.float32)
state = {k: jnp.asarray(v) for k, v in state.items()}

for k in vkeys + skeys:
  put(k, state[k], 'param (official path, official [in, out] layout), '
      'perturbed as described in the manifest')
for k in vkeys:
  if 'head' not in k:
    put('official_init/' + k, official_init[k],
        'unperturbed official init (mlp kernels are used as-is)')

# ---------------------------------------------------------------- forward
rret = np.random.default_rng(1)
ret = rret.uniform(-50, 50, (T, B)).astype(np.float32)
ret[0, 0], ret[0, 1] = 0.0, 0.37    # near/at the centre bin
weight = rret.uniform(0, 1, (T, B)).astype(np.float32)
put('deter', deter, 'RSSM deter [T,B,deter]')
put('stoch', stoch, 'RSSM stoch probabilities [T,B,stoch,classes]')
put('feat', feat, 'official Agent.feat2tensor({deter, stoch}) [T,B,D]')
put('ret', ret, 'value targets (real space)')
put('weight', weight, 'per-position loss weight')


def forward(x, ret, weight):
  out = val(x, 2)
  slow = slowval(x, 2)
  slow_pred = sg(slow.pred())
  loss_ret = out.loss(ret)
  loss_slow = out.loss(slow_pred)
  bins = out.bins

  def total(lg):
    o = outs.TwoHot(lg, bins)
    return (weight * (o.loss(ret) + o.loss(slow_pred))).sum()

  grad_logits = jax.grad(total)(out.logits)
  return dict(logits=out.logits, slow_logits=slow.logits, value=out.pred(),
              slow_value=slow.pred(), loss_ret=loss_ret, loss_slow=loss_slow,
              grad_logits=grad_logits, bins=bins, total=total(out.logits))


def param_grads(x, ret, weight):
  def lossfn(x):
    out = val(x, 2)
    slow_pred = sg(slowval(x, 2).pred())
    return (weight * (out.loss(ret) + out.loss(slow_pred))).sum()
  _, _, grads = nj.grad(lossfn, [val])(x)
  return grads


args = (jnp.asarray(feat), jnp.asarray(ret), jnp.asarray(weight))
_, fw = nj.pure(forward)(state, *args, seed=0)
_, grads = nj.pure(param_grads)(state, *args, seed=0)
put('logits', fw['logits'], 'val head logits [T,B,255]')
put('slow_logits', fw['slow_logits'], 'slowval head logits [T,B,255]')
put('value', fw['value'], 'val TwoHot.pred() (real space) [T,B]')
put('slow_value', fw['slow_value'], 'slowval TwoHot.pred() [T,B]')
put('bins', fw['bins'], 'Head.symexp_twohot bins [255]')
put('loss_ret', fw['loss_ret'], 'val TwoHot.loss(ret) [T,B]')
put('loss_slow', fw['loss_slow'],
    'val TwoHot.loss(sg(slowval pred)) [T,B]  (slowreg term, slowreg=1)')
put('total_loss', fw['total'], 'sum(weight * (loss_ret + loss_slow))')
put('grad_logits', fw['grad_logits'], 'd total_loss / d logits [T,B,255]')
for k, v in grads.items():
  put('grad/' + k, v, 'd total_loss / d val param (slowval held fixed)')

# ---------------------------------------------------------------- slow update
RATE = float(agent_config.slowvalue.rate)
assert RATE == 0.02 and int(agent_config.slowvalue.every) == 1
assert slowval.rate == RATE
assert not [k for k in state if k.endswith('_count')]
# The step counter `slowval_count` (utils.py:102-103) is created, as zeros, on
# the first update; in the agent that is the first train step (agent.py:142).
after, _ = nj.pure(lambda: slowval.update())(state, seed=0, create=True)
for k in skeys:
  put('slow_after/' + k, after[k], 'slowval param after one SlowModel.update '
      '(rate 0.02, every 1, count 0 -> mix = rate)')
count_key = sorted(set(after) - set(state))
assert count_key == ['slowval_count/value'], count_key
assert int(after['slowval_count/value']) == 1
for k in skeys:   # sanity: official rule is rate*src + (1-rate)*dst
  src = np.asarray(state['val/' + k[len('slowval/'):]], np.float64)
  ref = RATE * src + (1 - RATE) * np.asarray(state[k], np.float64)
  np.testing.assert_allclose(np.asarray(after[k]), ref, atol=1e-6)

# ---------------------------------------------------------------- presets
# Value-head parameter shapes under the official size presets (abstract
# init via jax.eval_shape: nothing is allocated).
presets = {}
for name in ['defaults', 'size1m', 'size12m', 'size25m', 'size50m',
             'size100m', 'size200m', 'size400m']:
  c = make_config(*([] if name == 'defaults' else [name]))
  r, v = c.agent.dyn.rssm, c.agent.value
  D = r.deter + r.stoch * r.classes
  head = agentlib.embodied.jax.MLPHead(
      elements.Space(np.float32, ()), **v, name='val')
  shapes = jax.eval_shape(
      lambda x: nj.init(lambda x: head(x, 1) and None)({}, x, seed=0),
      jax.ShapeDtypeStruct((1, D), jnp.float32))
  presets[name] = dict(
      rssm=dict(deter=r.deter, stoch=r.stoch, classes=r.classes),
      value=dict(v), slowvalue=dict(c.agent.slowvalue),
      imag_loss=dict(c.agent.imag_loss), repl_loss=dict(c.agent.repl_loss),
      loss_scales=dict(c.agent.loss_scales), feat_dim=D,
      param_shapes={k: list(s.shape) for k, s in sorted(shapes.items())})

os.makedirs(OUTDIR, exist_ok=True)
npz = os.path.join(OUTDIR, 'official_critic_goldens.npz')
np.savez_compressed(npz, **G)
manifest = dict(
    commit=COMMIT, source='github.com/danijar/dreamerv3',
    compute_dtype='float32', T=T, B=B,
    rssm=dict(deter=DETER, stoch=STOCH, classes=CLASSES),
    value=dict(agent_config.value), slowvalue=dict(agent_config.slowvalue),
    imag_loss=dict(agent_config.imag_loss),
    feat='concat([deter, stoch.reshape(T,B,stoch*classes)], -1)  '
         '(agent.py:51-53)',
    official_state_keys=init_keys,
    perturbation=(
        'numpy default_rng(0), val keys in sorted order: val/head/* ~ '
        'N(0,0.05); */scale = 1+N(0,0.1); other */bias ~ N(0,0.1); mlp '
        'kernels = official init (jax seed 0). Then slowval/<p> = val/<p> + '
        'N(0,0.01), slowval keys in sorted order, same generator.'),
    inputs=('deter = tanh(N(0,1)), stoch = softmax(N(0,3)) over classes, '
            'numpy default_rng(2); ret ~ U(-50,50) with ret[0,0]=0, '
            'ret[0,1]=0.37, weight ~ U(0,1), numpy default_rng(1)'),
    presets=presets, keys=M)
with open(os.path.join(OUTDIR, 'official_critic_goldens_manifest.json'),
          'w') as f:
  json.dump(manifest, f, indent=1)
print('wrote', npz, os.path.getsize(npz), 'bytes,', len(G), 'arrays')
