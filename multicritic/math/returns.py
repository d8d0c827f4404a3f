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


def replay_lambda_returns(
    rewards, is_last, is_terminal, boot, discount: float = 1.0 - 1.0 / 333, lambda_: float = 0.95
):
    """TD(lambda) returns along replayed trajectories, bootstrapped from imagined returns (DreamerV3 2024 `repval`).

    `R_{T-1} = boot_{T-1}` and, for t = T-2 .. 0, with
    `live = (1 - is_terminal_{t+1}) * discount` and `mix = (1 - is_last_{t+1}) * lambda`:
    `R_t = r_{t+1} + (1 - mix) * live * boot_{t+1} + mix * live * R_{t+1}`.
    `boot_t` is the imagined lambda-return of the imagined trajectory that
    starts at replay step t: each replay return mixes it with the replayed
    continuation, an episode boundary (`is_last`) bootstraps from it alone,
    and a terminal step cuts the return.

    Args:
        rewards: `[T, ...]` time-major replayed rewards.
        is_last: `[T, ...]` episode-boundary flags (0/1).
        is_terminal: `[T, ...]` terminal flags (0/1).
        boot: `[T, ...]` imagined returns from each replay step.
        discount: the replay discount (`1 - 1/333`, the official `horizon`).
        lambda_: TD(lambda) mixing.

    Returns:
        float32 `[T-1, ...]`, the targets for replay steps 0 .. T-2.

    Reference:
        Hafner et al., the DreamerV3 code's `repl_loss` and `lambda_return`
        (github.com/danijar/dreamerv3, 2024).
    """
    rewards, is_last, is_terminal, boot = (
        ops.cast(ops.convert_to_tensor(x), "float32") for x in (rewards, is_last, is_terminal, boot)
    )
    check_same_shapes({"rewards": rewards, "is_last": is_last, "is_terminal": is_terminal, "boot": boot})
    length = shape_of(boot)[0] if len(shape_of(boot)) else None
    if length is None or length < 2:
        raise ValueError(
            f"rewards/is_last/is_terminal/boot: got shape {list(shape_of(boot))}, "
            "expected time-major [T, ...] with a known T >= 2."
        )
    live = (1.0 - is_terminal[1:]) * discount
    mix = (1.0 - is_last[1:]) * lambda_
    partial = rewards[1:] + (1.0 - mix) * live * boot[1:]
    ret = boot[-1]
    out = []
    for t in reversed(range(length - 1)):
        ret = partial[t] + mix[t] * live[t] * ret
        out.append(ret)
    return ops.stack(out[::-1], axis=0)
