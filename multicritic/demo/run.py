"""`multicritic demo`: policy evaluation of a random finite MDP across reward scales.

The critic is trained with DreamerV3's critic update (imagined rollouts of
horizon 15, lambda-returns from its own values, dream loss weights, the EMA
regulariser) but with demo hyperparameters for a small MDP, not DreamerV3's:
learning rate 3e-3 with cosine decay (DreamerV3: a constant 3e-5) and gamma
0.9 (DreamerV3: 0.997); see `DemoConfig`. The hyperparameters are the same for
every reward scale, and the critic is scored against the exact values of a
linear solve.

With an ensemble (`DemoConfig.ensemble` K > 1) the scored value is the
members' aggregate (`critic.aggregate`; their mean for "members"), and the
members' disagreement is tested as an uncertainty signal: per state, the
spread (standard deviation over members of the real-space values) against
the absolute error of the aggregate, as Pearson and Spearman correlations
across the states (`ScaleResult.member_spread_error_pearson` / `_spearman`).
"""

from __future__ import annotations

import random

import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence, Tuple

import keras
import numpy as np

from multicritic.training import presets
from multicritic.math.bins import inverse_symlog
from multicritic.model.critic import CriticNetwork
from multicritic.model.normalizer import ReturnNormalizer
from multicritic.training.optimizers import LaProp
from multicritic.math.returns import lambda_returns
from multicritic.demo.config import DEFAULT_SCALES, DemoConfig, check_config, demo_mdp
from multicritic.demo.mdp import MDP, encode_states
from multicritic.demo import numerics
from multicritic.model.sizes import get_model_dims
from multicritic.training.trainer import CriticTrainer, predict_function

__all__ = [
    "DEFAULT_SCALES",
    "DemoConfig",
    "ScaleResult",
    "pearson",
    "plot",
    "relative_rmse",
    "run_demo",
    "spearman",
    "summary_table",
    "to_json",
    "train_one_scale",
]


@dataclass
class ScaleResult:
    reward_scale: float
    relative_rmse: float
    steps: int
    seconds: float
    curve: List[List[float]] = field(default_factory=list)  # [step, relative_rmse]
    true_values: List[float] = field(default_factory=list)
    learned_values: List[float] = field(default_factory=list)
    # Ensembles only (None with one member): per state, the members' spread
    # (std over members of the real-space values) against the aggregate's
    # absolute error |learned - true|, correlated across the states.
    member_spread_error_pearson: Optional[float] = None
    member_spread_error_spearman: Optional[float] = None
    mean_member_spread: Optional[float] = None  # mean over states, in value units
    relative_member_spread: Optional[float] = None  # RMS spread / RMS exact value (comparable to relative_rmse)
    member_spreads: Optional[List[float]] = None  # per state
    # With a preset: its return normaliser's scale after training, fed each step's lambda-returns
    # (what an actor would divide its advantages by).
    return_scale: Optional[float] = None


def relative_rmse(learned: np.ndarray, true: np.ndarray) -> float:
    return float(np.sqrt(np.mean((learned - true) ** 2)) / np.sqrt(np.mean(true**2)))


def pearson(x, y) -> float:
    """Pearson's correlation of two 1-D samples; NaN when either is constant (or shorter than 2)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"pearson: expected two 1-D arrays of one length, got shapes {x.shape} and {y.shape}")
    if x.size < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    norm = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
    if not norm > 0:
        return float("nan")
    return float(np.clip(np.sum(dx * dy) / norm, -1.0, 1.0))


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (as scipy.stats.rankdata's default)."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # the last (1-based) rank of each group of equal values
    return (ends - (counts - 1) / 2.0)[inverse.reshape(-1)]


def spearman(x, y) -> float:
    """Spearman's rank correlation: Pearson's of the ranks (ties averaged); NaN when either is constant."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman: expected two 1-D arrays of one length, got shapes {x.shape} and {y.shape}")
    return pearson(_ranks(x), _ranks(y))


def _to_numpy(x) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def _learned_values(predict, critic: CriticNetwork, h, z, seed: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """The scored real-space values `[S]` (the members' aggregate) and, for an ensemble, the members' `[K, S]`."""
    value, _ = predict(h, z)
    if critic.ensemble_size == 1:
        return _to_numpy(inverse_symlog(value)), None
    if critic.aggregation == "members":
        aggregate = keras.ops.mean(value, axis=0)
    else:  # the seed fixes the members "min_of_random" draws, the same at every evaluation
        aggregate = critic.aggregate(value, seed=seed)
    return _to_numpy(inverse_symlog(aggregate)), _to_numpy(inverse_symlog(value))


class Session:
    """One critic, trainer and forward pass, reset for every reward scale: each scale trains a freshly
    initialised critic, and the steps compiled for the first scale (`torch.compile`, `jax.jit`,
    `tf.function`) serve the others."""

    def __init__(self, config: DemoConfig):
        self.config = config
        self.options = None if config.preset is None else presets.options(config.preset)
        self.critic = self.trainer = self.predict = None
        self._initial = None  # the trainer's state when new (optimizer slots, counters)
        # Thousands of steps of one batch shape: the step is compiled from its first call on every backend
        # ("auto" would keep PyTorch's eager and TensorFlow's plain graph on a CPU).
        self.jit_compile = True
        self._stepped = False

    def _new_critic(self) -> CriticNetwork:
        config, architecture = self.config, {}
        if self.options is not None:
            dims = (
                "model_size",
                "gru_units",
                "dense_hidden_units",
                "num_dense_layers",
                "num_z_categoricals",
                "num_z_classes",
            )
            architecture = {k: v for k, v in self.options["critic"].items() if k not in dims}
        return CriticNetwork(
            **{"bin_scheme": config.bin_scheme, **architecture},
            model_size=config.size,
            head=config.head,
            trunk=config.trunk,
            ensemble_size=config.ensemble,
            aggregation=config.aggregation,
        )

    def reset(self) -> None:
        """A fresh critic (the same initial weights as a new one) and a fresh trainer state."""
        config = self.config
        # Python's and numpy's streams are what a new critic's weights and the demo's draws read; not
        # keras.utils.set_random_seed, which imports TensorFlow wherever it is installed.
        random.seed(config.seed)
        np.random.seed(config.seed)
        fresh = self._new_critic()
        if self.critic is not None:
            self.critic.set_weights(fresh.get_weights())
            for var, value in zip(self.trainer.state_variables[len(self.critic.weights) :], self._initial):
                var.assign(value)
            return
        trainer_options = {}
        if self.options is not None:
            trainer_options = {
                k: v for k, v in self.options["trainer"].items() if k not in ("optimizer", "gamma", "lambda_")
            }
        schedule = keras.optimizers.schedules.CosineDecay(config.learning_rate, config.steps, alpha=0.02)
        if config.preset == "dreamerv3-2024":
            optimizer = LaProp(schedule)
        else:
            optimizer = keras.optimizers.Adam(schedule, epsilon=1e-5)
        self.critic = fresh
        self.trainer = CriticTrainer(
            fresh,
            optimizer,
            **{
                "gamma": config.gamma,
                "lambda_": config.lambda_,
                "jit_compile": self.jit_compile,
                "seed": config.seed if config.aggregation == "min_of_random" else None,
                **trainer_options,
            },
        )
        self._initial = [
            np.array(keras.ops.convert_to_numpy(v.value)) for v in self.trainer.state_variables[len(fresh.weights) :]
        ]
        self.predict = predict_function(fresh)

    def train_on_dream(self, *batch):
        """One step. Where the step cannot be compiled here (PyTorch's inductor without a C++ compiler, say),
        the first step warns and starts again from a fresh critic with `jit_compile="auto"`, which falls back
        to the uncompiled step (a failed step changes nothing)."""
        try:
            metrics = self.trainer.train_on_dream(*batch)
        except Exception as err:  # whatever the compiler raised; a second failure is raised
            if self._stepped or self.jit_compile is not True:
                raise
            warnings.warn(
                f"multicritic demo: the step could not be compiled ({err}); it runs as jit_compile='auto' does.",
                RuntimeWarning,
                stacklevel=2,
            )
            self.jit_compile, self.critic = "auto", None
            self.reset()
            metrics = self.trainer.train_on_dream(*batch)
        self._stepped = True
        return metrics


def _terminal() -> bool:
    """Whether stdout shows a progress bar as one: a terminal or a notebook. Keras's Progbar redraws on any POSIX
    stdout, which piped or redirected to a file is one long line of control codes per scale."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty is not None and isatty()) or "ipykernel" in sys.modules


def train_one_scale(
    config: DemoConfig, mdp: MDP, h: np.ndarray, z: np.ndarray, progress: bool = True, session: Optional[Session] = None
) -> ScaleResult:
    """Trains a fresh critic on `mdp` (through `session`'s critic and trainer, reset first, when given)."""
    rng = np.random.default_rng(config.seed + 1)
    session = Session(config) if session is None else session
    session.reset()
    options = session.options
    normalizer = None if options is None else ReturnNormalizer(**options["normalizer"])
    true = mdp.values()
    bar = keras.utils.Progbar(config.steps, stateful_metrics=["rel_rmse"], verbose=1 if progress and _terminal() else 0)
    result = ScaleResult(reward_scale=0.0, relative_rmse=float("nan"), steps=config.steps, seconds=0.0)
    start = time.perf_counter()
    for step in range(1, config.steps + 1):
        states, rewards, continues = mdp.rollouts(rng, rng.integers(mdp.num_states, size=config.batch), config.horizon)
        session.train_on_dream(h[states], z[states], rewards, continues)
        critic, predict = session.critic, session.predict  # (new ones if the first step fell back)
        if normalizer is not None:
            flat = states.reshape(-1)
            values = predict(h[flat], z[flat])[0]
            if critic.ensemble_size > 1:
                values = keras.ops.mean(values, axis=0)
            values = keras.ops.reshape(inverse_symlog(values), states.shape)
            normalizer.update(lambda_returns(rewards, continues, values, config.gamma, config.lambda_))
        if step % config.eval_every == 0 or step == config.steps:
            error = relative_rmse(_learned_values(predict, critic, h, z, config.seed)[0], true)
            result.curve.append([step, error])
            bar.update(step, values=[("rel_rmse", error)])
    result.seconds = time.perf_counter() - start
    learned, members = _learned_values(predict, critic, h, z, config.seed)
    result.relative_rmse = relative_rmse(learned, true)
    if normalizer is not None:
        result.return_scale = float(_to_numpy(normalizer.scale()))
    result.true_values = true.tolist()
    result.learned_values = learned.tolist()
    if members is not None:
        spread, error = members.std(axis=0), np.abs(learned - true)
        result.member_spread_error_pearson = pearson(spread, error)
        result.member_spread_error_spearman = spearman(spread, error)
        result.mean_member_spread = float(spread.mean())
        result.relative_member_spread = float(np.sqrt(np.mean(spread**2)) / np.sqrt(np.mean(true**2)))
        result.member_spreads = spread.tolist()
    return result


def run_demo(config: DemoConfig, progress: bool = True, log=print, pin_numerics: bool = True) -> List[ScaleResult]:
    """Trains one fresh critic per reward scale on the same MDP; returns the results.

    `progress`: a progress bar per scale where stdout is a terminal or a notebook (none when it is piped or
    redirected, whatever `progress` says).

    `pin_numerics`: on JAX, before JAX has started in this process, fix what the numbers would otherwise take
    from the CPU (`multicritic.demo.numerics.pin`: XLA's threads, instruction set and math, for the whole
    process), so that they are the same on every x86-64 CPU.

    Raises a `ValueError` before any work for a setting `check_config` refuses.
    """
    check_config(config)
    if pin_numerics:  # before the first JAX computation, which starts XLA's CPU client with the settings it keeps
        log(numerics.describe(numerics.pin(keras.backend.backend())))
    rng = np.random.default_rng(config.seed)
    base = demo_mdp(config, rng)
    dims = get_model_dims(config.size)
    h, z = encode_states(rng, config.num_states, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"])
    results = []
    session = Session(config)
    for scale in config.scales:
        mdp = base.scaled(scale)
        true = mdp.values()
        log(f"reward scale {scale:g}: exact values in [{true.min():.4g}, {true.max():.4g}]")
        result = train_one_scale(config, mdp, h, z, progress=progress, session=session)
        result.reward_scale = float(scale)
        results.append(result)
    return results


def _fmt(x: Optional[float], spec: str, width: int, suffix: str = "") -> str:
    return f"{'n/a' if x is None else format(x, spec) + suffix:>{width}}"


def summary_table(results: Sequence[ScaleResult]) -> str:
    """One row per reward scale; with an ensemble, also the members' relative spread and its
    Pearson / Spearman correlation with the absolute error across states (n/a with one member)."""
    ensemble = any(r.member_spread_error_pearson is not None for r in results)
    scaled = any(r.return_scale is not None for r in results)
    head = f"{'reward scale':>12}  {'relative RMSE':>13}  {'steps':>6}  {'seconds':>8}"
    if scaled:
        head += f"  {'return scale S':>14}  {'S / reward scale':>16}"
    if ensemble:
        head += f"  {'rel. spread':>11}  {'spread~error r':>14}  {'Spearman':>8}"
    lines = [head]
    for r in results:
        line = f"{r.reward_scale:>12g}  {100 * r.relative_rmse:>12.2f}%  {r.steps:>6d}  {r.seconds:>8.1f}"
        if scaled:
            ratio = None if r.return_scale is None else r.return_scale / r.reward_scale
            line += f"  {_fmt(r.return_scale, '.4g', 14)}  {_fmt(ratio, '.4g', 16)}"
        if ensemble:
            spread = None if r.relative_member_spread is None else 100 * r.relative_member_spread
            line += (
                f"  {_fmt(spread, '.2f', 11, '%')}"
                f"  {_fmt(r.member_spread_error_pearson, '.3f', 14)}"
                f"  {_fmt(r.member_spread_error_spearman, '.3f', 8)}"
            )
        lines.append(line)
    return "\n".join(lines)


def to_json(config: DemoConfig, results: Sequence[ScaleResult], include_values: bool = True) -> dict:
    scales = []
    for r in results:
        item = asdict(r)
        if not include_values:
            item.pop("true_values")
            item.pop("learned_values")
            item.pop("member_spreads")
        scales.append(item)
    return {
        "backend": keras.backend.backend(),
        "config": asdict(config) | {"scales": list(config.scales)},
        "scales": scales,
        # What the numbers depend on besides the config (versions, CPU, the pins): issue 72.
        "environment": numerics.environment(keras.backend.backend()),
    }


def plot(results: Sequence[ScaleResult], path: str, title: Optional[str] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(1, n + 1, figsize=(4.2 * (n + 1), 4.0))
    for ax, r in zip(axes, results):
        true, learned = np.asarray(r.true_values), np.asarray(r.learned_values)
        if r.member_spreads is not None:  # an ensemble: +-1 member std
            ax.errorbar(true, learned, yerr=np.asarray(r.member_spreads), fmt="o", ms=3.5, elinewidth=1)
        else:
            ax.scatter(true, learned, s=14)
        lo, hi = float(min(true.min(), learned.min())), float(max(true.max(), learned.max()))
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_title(f"reward scale {r.reward_scale:g}: rel. RMSE {100 * r.relative_rmse:.2f}%")
        ax.set_xlabel("exact value (linear solve)")
        ax.set_ylabel("critic value")
    ax = axes[-1]
    for r in results:
        curve = np.asarray(r.curve)
        ax.plot(curve[:, 0], curve[:, 1], label=f"scale {r.reward_scale:g}")
    ax.set_yscale("log")
    ax.set_xlabel("train step")
    ax.set_ylabel("relative RMSE")
    ax.set_title("learning curves")
    ax.legend()
    fig.suptitle(title or f"multicritic demo ({keras.backend.backend()})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
