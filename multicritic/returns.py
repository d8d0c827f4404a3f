"""Lambda-returns and dream loss weights over imagined trajectories (time-major)."""

from __future__ import annotations

from keras import ops

from multicritic.validation import check_same_shapes, shape_of


def lambda_returns(rewards, continues, values, gamma: float = 0.997, lambda_: float = 0.95):
    """TD(lambda) returns of a dreamed trajectory, bootstrapped from its last value.

    `R_H = v_H` and, for t = H-1 .. 0,
    `R_t = r_{t+1} + gamma * c_{t+1} * ((1 - lambda) * v_{t+1} + lambda * R_{t+1})`:
    the reward and continue flag that lead into a state come with that state
    (RLlib's convention), so `rewards[0]` and `continues[0]` are not used.

    Args:
        rewards: real-space rewards `[H+1, ...]`.
        continues: continue flags or probabilities in [0, 1], `[H+1, ...]`.
        values: real-space (not symlog) value estimates `[H+1, ...]`.
        gamma: discount.
        lambda_: TD(lambda) mixing; 1 gives Monte-Carlo returns bootstrapped
            from `values[H]`, 0 gives one-step TD targets.

    Returns:
        float32 `[H, ...]`, the targets for states 0 .. H-1.

    Reference:
        Hafner et al. 2023, eq. 7 (arXiv 2301.04104).
    """
    rewards, continues, values = (ops.cast(ops.convert_to_tensor(x), "float32") for x in (rewards, continues, values))
    check_same_shapes({"rewards": rewards, "continues": continues, "values": values})
    length = shape_of(values)[0] if len(shape_of(values)) else None
    if length is None or length < 2:
        raise ValueError(
            f"rewards/continues/values: got shape {list(shape_of(values))}, "
            "expected time-major [H+1, ...] with a known H+1 >= 2."
        )
    discount = continues[1:] * gamma
    # Operation order of the reference, so results match it bit for bit.
    partial = rewards[1:] + discount * (1.0 - lambda_) * values[1:]
    ret = values[-1]
    out = []
    for t in reversed(range(length - 1)):
        ret = partial[t] + discount[t] * lambda_ * ret
        out.append(ret)
    return ops.stack(out[::-1], axis=0)


def dream_loss_weights(continues, gamma: float = 0.997):
    """Loss weights of dreamed steps: `w_t = gamma^t * prod_{i<=t} c_i`.

    Steps after a predicted episode end get (close to) zero weight; setting
    `continues[0] = 0` removes a whole trajectory that starts terminal.

    Args:
        continues: `[H+1, ...]` continue flags or probabilities.
        gamma: discount.

    Returns:
        float32 `[H+1, ...]`; the critic loss uses the first H rows.
    """
    continues = ops.cast(ops.convert_to_tensor(continues), "float32")
    if len(shape_of(continues)) < 1:
        raise ValueError(f"continues: got shape {list(shape_of(continues))}, expected time-major [H+1, ...].")
    return ops.cumprod(gamma * continues, axis=0) / gamma
