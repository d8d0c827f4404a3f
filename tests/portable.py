"""Options and data of the committed cross-backend checkpoint goldens."""

import numpy as np

OPTIONS = dict(
    model_size="micro",
    num_buckets=101,
    lower_bound=-15.0,
    upper_bound=15.0,
    ema_decay=0.9,
    bin_scheme="symexp",
    name="golden_critic",
)
# Heads and ensembles across backends (the cross-backend session): an
# HL-Gauss ensemble, reduced by "min" (the draws of "min_of_random" come from
# each backend's own random generator).
ENSEMBLE_OPTIONS = dict(
    model_size="micro",
    num_buckets=101,
    lower_bound=-15.0,
    upper_bound=15.0,
    ema_decay=0.9,
    head="hl_gauss",
    ensemble_size=3,
    aggregation="min",
    name="golden_ensemble",
)
KINDS = {"single": OPTIONS, "ensemble": ENSEMBLE_OPTIONS}


def _part_kinds():
    # Every registered part the kinds above leave out, as a 2-member ensemble of it (keras-free names).
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    covered = {("head", "two_hot"), ("head", ENSEMBLE_OPTIONS["head"]), ("trunk", "mlp")}
    parts = [("head", n) for n in HEADS] + [("trunk", n) for n in TRUNKS]
    return {
        f"{kind}_{name}": dict(
            model_size="micro",
            ema_decay=0.9,
            ensemble_size=2,
            aggregation="min",
            name=f"golden_{kind}_{name}",
            **{kind: name},
        )
        for kind, name in parts
        if (kind, name) not in covered
    }


KINDS.update(_part_kinds())
# A critic of one feature vector (no `(h, z)`): its files and trainer across backends as the others'.
KINDS["features"] = dict(model_size="micro", input_size=40, ema_decay=0.9, num_buckets=101, name="golden_features")

# The trainer's options of the goldens (before heads and ensembles, they were
# saved in the critic's config; restoring maps them to the trainer's).
TRAINER_OPTIONS = dict(
    ema_update_period=2,
    ema_regularizer_weight=0.7,
    ema_regularizer="two_hot_mean",
    ema_targets=False,
)


def golden_batch(critic, step, n=24):
    """`(h, z, targets, weights)`, a features critic's `(x, targets, weights)`."""
    rng = np.random.default_rng(100 + step)
    if critic.input_layout == "features":
        inputs = (rng.normal(size=(n, critic.input_size)).astype(np.float32),)
    else:
        h = rng.normal(size=(n, critic.gru_units)).astype(np.float32)
        inputs = (h, rng.random(size=(n, critic.num_z_categoricals, critic.num_z_classes)).astype(np.float32))
    targets = (50 * rng.normal(size=n)).astype(np.float32)
    weights = rng.uniform(0.5, 1.0, size=n).astype(np.float32)
    return (*inputs, targets, weights)
