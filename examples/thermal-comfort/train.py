#!/usr/bin/env python3
"""TRAIN worker: learns a thermal-sensation classifier from the round's new train samples.

Round 1 starts a fresh model; later rounds (HAS_COMPLETED_INITIAL_TRAINING=true) continue from
the model the previous round's train worker reported (CLOUD_KB_INDEX), so the model keeps what it
knew and follows the drift. Writes OUTPUT_URL/model.json and reports it.

Env: TRAIN_DATASET_URL, OUTPUT_URL, HAS_COMPLETED_INITIAL_TRAINING, CLOUD_KB_INDEX, plus the
common ones (see README.md). Tunables: EPOCHS (first round, 8), WARM_EPOCHS (later rounds, 3),
LEARNING_RATE (0.05), L2 (0.0005).
"""

import csv
import os
import sys

sys.dont_write_bytecode = True  # keep the example folder free of __pycache__

import sedna_worker as sw  # noqa: E402


def work():
    data = sw.env("TRAIN_DATASET_URL", required=True)
    output = sw.local_path(sw.env("OUTPUT_URL", required=True))
    warm = sw.env("HAS_COMPLETED_INITIAL_TRAINING", "false").lower() == "true"
    X, y, skipped = sw.load_samples(data)
    if not X:
        raise sw.WorkerError(f"{data}: no samples")

    if warm:
        previous = sw.env("CLOUD_KB_INDEX", required=True)
        model = sw.load_model(previous)
        epochs = sw.env_num("WARM_EPOCHS", 3, int)
        start = f"continuing round {model.get('round')}'s model ({model.get('trainSamples')} samples)"
    else:
        model = sw.new_model(X)
        epochs = sw.env_num("EPOCHS", 8, int)
        start = "a new model"
    round_no = sw.round_of(output, default=int(model.get("round", 0)) + 1)
    loss = sw.train(
        model,
        X,
        y,
        epochs=epochs,
        learning_rate=sw.env_num("LEARNING_RATE", 0.05),
        l2=sw.env_num("L2", 0.0005),
        seed=round_no,
    )
    fit = sw.evaluate(model, X, y)
    model["round"] = round_no
    model["trainSamples"] = int(model.get("trainSamples", 0)) + len(X)
    model["lastTimeStep"] = _last_time_step(data, model.get("lastTimeStep", 0))
    model["history"] = (model.get("history") or [])[-19:] + [
        {"round": round_no, "samples": len(X), "epochs": epochs, "loss": round(loss, 4), "trainAccuracy": fit["accuracy"]}
    ]
    model.pop("eval", None)
    path = os.path.join(output, "model.json")
    sw.save_json(path, model)
    sw.log(
        f"round {round_no}: {start}, +{len(X)} samples ({skipped} skipped), {epochs} epochs, "
        f"loss {loss:.3f}, train accuracy {fit['accuracy']:.3f} -> {path}"
    )
    metrics = {
        "trainSamples": len(X),
        "totalTrainSamples": model["trainSamples"],
        "trainAccuracy": fit["accuracy"],
        "loss": round(loss, 4),
    }
    return [{"format": "json", "url": sw.model_url(path), "metrics": metrics}]


def _last_time_step(path, default):
    """The largest time_step in the sample file (the inference worker's synthetic readings start
    there, so they come from the season the model last saw)."""
    best = default or 0
    with open(sw.local_path(path), newline="") as f:
        for row in csv.DictReader(f):
            try:
                best = max(best, int(float(row.get("time_step") or 0)))
            except ValueError:
                pass
    return best


if __name__ == "__main__":
    sw.run("train", work)
