"""Keras callbacks for training a critic with `fit`."""

from __future__ import annotations

import json
import os

import keras


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore` that also resumes in the middle of an epoch, exactly.

    Keras's callback restores the weights, optimizer and epoch of the last
    backup, then replays the interrupted epoch from its first batch: with
    `save_freq=N` batches, the batches before the backup are trained on
    twice. Here a compiled critic also skips them, so an interrupted and
    resumed `fit` ends with the weights, EMA copy and optimizer state of an
    uninterrupted one (given the same data order: `shuffle=False` or a
    seeded pipeline; `steps_per_execution=1`).

    It takes the arguments of `keras.callbacks.BackupAndRestore` (`backup_dir`,
    `save_freq`, `double_checkpoint`, `delete_checkpoint`).

    Examples:
        >>> critic.compile()
        >>> critic.fit(dataset, epochs=10, shuffle=False,
        ...            callbacks=[BackupAndRestore("/tmp/backup", save_freq=100)])
    """

    def _load_model(self):
        super()._load_model()
        fit = getattr(self.model, "_fit", None)
        if self.save_freq == "epoch" or fit is None or not os.path.exists(self._training_metadata_path):
            return
        with open(self._training_metadata_path) as f:
            metadata = json.load(f)
        # A batch-level backup records the last batch it saw in its epoch.
        fit.skip_batches = int(metadata.get("batch", -1)) + 1
