#!/usr/bin/env python3
"""INFERENCE worker: serves the deployed model until stopped.

Loads MODEL_URLS (<outputDir>/deploy/index.pkl: a JSON model, despite Sedna's fixed file name),
then every second classifies a few synthetic live readings and appends the predictions to
OUTPUT_URL/inference/predictions.csv. It polls the model file's mtime every second and reloads
it when it changes. Exits 0 on SIGTERM or SIGINT. It never reports.

Env: MODEL_URLS, OUTPUT_URL, plus the common ones (see README.md). Tunables: READINGS_PER_SECOND
(5); SEED (55), SEASON_ROWS (12000), LABEL_NOISE (0.08), BUILDINGS (24): set them as the
generator's, so the live readings come from the same buildings and rule (time steps continue
from the last one the model was trained on, with their own draws).
"""

import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True  # keep the example folder free of __pycache__

import sedna_worker as sw  # noqa: E402
from generate import CLASS_NAMES, FEATURES, reading  # noqa: E402

COLUMNS = ["unix_time", "model_round", "time_step", "building", *FEATURES, "predicted", "expected"]


def describe(model):
    accuracy = (model.get("eval") or {}).get("accuracy")
    acc = f"accuracy {accuracy:.3f}" if isinstance(accuracy, (int, float)) else "accuracy unknown"
    return f"round {model.get('round')} model ({model.get('trainSamples')} train samples, {acc})"


def main():
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        model_path = sw.local_path(sw.env("MODEL_URLS", required=True).split(";")[0].strip())
        output = sw.local_path(sw.env("OUTPUT_URL", required=True))
        per_second = sw.env_num("READINGS_PER_SECOND", 5, int)
        seed = sw.env_num("SEED", 55, int)
        season_rows = sw.env_num("SEASON_ROWS", 12000, int)
        label_noise = sw.env_num("LABEL_NOISE", 0.08)
        buildings = sw.env_num("BUILDINGS", 24, int)
    except sw.WorkerError as err:
        print(f"inference: {err}", file=sys.stderr)
        return 1

    model, mtime, warned, said_waiting = None, None, None, False
    predictions = os.path.join(output, "inference", "predictions.csv")
    os.makedirs(os.path.dirname(predictions), exist_ok=True)
    if not os.path.exists(predictions) or os.path.getsize(predictions) == 0:
        with open(predictions, "a") as f:
            f.write(",".join(COLUMNS) + "\n")
    step, served, right = 0, 0, 0

    while not stop.is_set():
        try:
            current = os.stat(model_path).st_mtime_ns
        except FileNotFoundError:
            current = None
        if current is not None and current != mtime:
            try:
                loaded = sw.load_model(model_path)
            except (OSError, ValueError, sw.WorkerError) as err:
                # Half-written or not a model: keep serving the old one, try again next second.
                if warned != current:
                    print(f"inference: cannot load {model_path}: {err}", file=sys.stderr, flush=True)
                    warned = current
            else:
                verb = "serving" if model is None else "reloaded, now serving"
                model, mtime = loaded, current
                step = max(step, int(model.get("lastTimeStep") or 0))
                sw.log(f"{verb} the {describe(model)} from {model_path}")
        elif current is None and model is None and not said_waiting:
            sw.log(f"waiting for {model_path}")
            said_waiting = True
        if model is not None:
            lines = []
            for _ in range(per_second):
                step += 1
                live = reading(seed, step, season_rows, label_noise, buildings, stream="live:")
                x = [live[c] for c in FEATURES]
                predicted = sw.predict(model, x, live["building"])
                served += 1
                right += predicted == live["thermal_sensation"]
                values = [f"{time.time():.3f}", model.get("round"), step, live["building"], *x]
                values += [CLASS_NAMES[predicted], CLASS_NAMES[live["thermal_sensation"]]]
                lines.append(",".join(str(v) for v in values) + "\n")
            with open(predictions, "a") as f:
                f.write("".join(lines))
        stop.wait(1.0)
    if served:
        sw.log(f"stopping: {served} readings classified, {right / served:.3f} as labelled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
