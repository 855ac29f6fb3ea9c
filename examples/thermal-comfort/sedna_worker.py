"""Shared helpers for the thermal-comfort workers: Sedna's worker contract, the data, the model.

Standard library only. The workers (train.py, eval.py, inference.py) import this module from
their own folder.

Contract (Sedna's): the worker reads its inputs from the environment and, for train and eval,
reports once at the end with POST {LC_SERVER}/sedna/workers/{WORKER_NAME}/info.
"""

import csv
import json
import math
import os
import random
import sys
import time
import urllib.error
import urllib.request

from generate import CLASS_NAMES, CLASSES, FEATURES, LABEL

BUILDING = "building"

# --- environment ---------------------------------------------------------------------------


def env(name, default=None, required=False):
    value = os.environ.get(name)
    if value is None or value == "":
        if required:
            raise WorkerError(f"{name} is not set")
        return default
    return value


def env_num(name, default, kind=float):
    value = env(name)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise WorkerError(f"{name}={value!r} is not a number") from None


def local_path(url):
    """Embedded mode gives plain absolute paths; accept file:// too."""
    return url[len("file://") :] if url.startswith("file://") else url


def round_of(output_url, default=None):
    """The round number from OUTPUT_URL's last path segment (.../train/3 -> 3)."""
    last = os.path.basename(os.path.normpath(output_url or ""))
    return int(last) if last.isdigit() else default


def log(message):
    print(f"[{env('WORKER_NAME', os.path.basename(sys.argv[0]))}] {message}", flush=True)


class WorkerError(Exception):
    pass


class ReportError(WorkerError):
    """The report did not get through."""


class Refused(ReportError):
    """The local controller answered 4xx: final, not retried."""


# --- data ----------------------------------------------------------------------------------


def load_samples(path):
    """Reads a CSV sample file (header first). Returns (X, y, skipped): X a list of
    (numeric features in FEATURES order, building) pairs, y the labels. Rows that do not parse
    are skipped and counted."""
    X, y, skipped = [], [], 0
    with open(local_path(path), newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in [BUILDING, *FEATURES, LABEL] if c not in (reader.fieldnames or [])]
        if missing:
            raise WorkerError(f"{path}: the header lacks {', '.join(missing)}")
        for row in reader:
            try:
                features = [float(row[c]) for c in FEATURES]
                label = int(float(row[LABEL]))
                building = row[BUILDING].strip()
            except (AttributeError, TypeError, ValueError):
                skipped += 1
                continue
            if label not in CLASSES or not all(math.isfinite(v) for v in features):
                skipped += 1
                continue
            X.append((features, building))
            y.append(label)
    return X, y, skipped


# --- model: multinomial logistic regression, trained by SGD, warm-started round after round --
#
# p(class | x) = softmax(weights . z + bias + buildingBias[building]), where z are the numeric
# features standardized with a scaler frozen in round 1 (so weights keep their meaning), and
# buildingBias is a per-building offset learned as buildings show up (one-hot, stored sparsely).


def new_model(X):
    """A zero model whose scaler (feature means and spreads) comes from the first round's data."""
    n, d = len(X), len(FEATURES)
    means = [sum(x[j] for x, _ in X) / n for j in range(d)]
    stds = [math.sqrt(sum((x[j] - means[j]) ** 2 for x, _ in X) / max(n - 1, 1)) or 1.0 for j in range(d)]
    return {
        "kind": "softmax-regression",
        "features": FEATURES,
        "categorical": BUILDING,
        "label": LABEL,
        "classes": CLASSES,
        "classNames": [CLASS_NAMES[c] for c in CLASSES],
        "scaler": {"mean": means, "std": stds},
        "weights": [[0.0] * d for _ in CLASSES],
        "bias": [0.0] * len(CLASSES),
        "buildingBias": {},
        "round": 0,
        "trainSamples": 0,
        "history": [],
    }


def _scale(model, x):
    mean, std = model["scaler"]["mean"], model["scaler"]["std"]
    return [(v - m) / s for v, m, s in zip(x, mean, std)]


def _probabilities(model, z, building):
    offsets = model["buildingBias"].get(building) or [0.0] * len(model["bias"])
    logits = [
        b + o + sum(w * v for w, v in zip(ws, z)) for ws, b, o in zip(model["weights"], model["bias"], offsets)
    ]
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def predict(model, x, building):
    p = _probabilities(model, _scale(model, x), building)
    return model["classes"][max(range(len(p)), key=p.__getitem__)]


def train(model, X, y, epochs, learning_rate, l2, seed):
    """Continues training `model` in place on (X, y): `epochs` passes of SGD in a seeded order,
    the step size decaying within the round. Returns the mean cross-entropy of the last pass."""
    index = {c: k for k, c in enumerate(model["classes"])}
    Z = [(_scale(model, x), building) for x, building in X]
    order = list(range(len(Z)))
    rng = random.Random(seed)
    classes = len(model["classes"])
    loss = 0.0
    for epoch in range(epochs):
        rng.shuffle(order)
        lr = learning_rate / (1.0 + 0.5 * epoch)
        loss = 0.0
        for i in order:
            (z, building), target = Z[i], index[y[i]]
            p = _probabilities(model, z, building)
            loss -= math.log(max(p[target], 1e-12))
            offsets = model["buildingBias"].setdefault(building, [0.0] * classes)
            for k, ws in enumerate(model["weights"]):
                g = p[k] - (1.0 if k == target else 0.0)
                for j in range(len(ws)):
                    ws[j] -= lr * (g * z[j] + l2 * ws[j])
                model["bias"][k] -= lr * g
                offsets[k] -= lr * (g + l2 * offsets[k])
        loss /= max(len(Z), 1)
    return loss


def evaluate(model, X, y):
    """Accuracy, macro F1 and per-class recall of `model` on (X, y)."""
    predicted = [predict(model, x, building) for x, building in X]
    correct = sum(p == t for p, t in zip(predicted, y))
    f1s, recalls = [], {}
    for c in model["classes"]:
        tp = sum(p == c and t == c for p, t in zip(predicted, y))
        fp = sum(p == c and t != c for p, t in zip(predicted, y))
        fn = sum(p != c and t == c for p, t in zip(predicted, y))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
        recalls[CLASS_NAMES[c]] = round(tp / (tp + fn), 4) if tp + fn else None
    return {
        "accuracy": round(correct / len(y), 4),
        "f1Macro": round(sum(f1s) / len(f1s), 4),
        "samples": len(y),
        "recall": recalls,
    }


def load_model(path):
    with open(local_path(path)) as f:
        model = json.load(f)
    if model.get("kind") != "softmax-regression":
        raise WorkerError(f"{path}: not a thermal-comfort model")
    return model


def save_json(path, data):
    """Writes atomically (a temporary file renamed over the target)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# --- reporting to the local controller -----------------------------------------------------


def model_url(path):
    """The url to report: Sedna's lib strips DATA_PATH_PREFIX from the front when it is set."""
    prefix = env("DATA_PATH_PREFIX", "")
    return path[len(prefix) :] if prefix and path.startswith(prefix) else path


def report(kind, status, results=None, retries=5, timeout=10.0):
    """POSTs the worker's result to {LC_SERVER}/sedna/workers/{WORKER_NAME}/info.

    A 4xx reply is final: its Message is raised. A connection error, a timeout (`timeout` s per
    request) or a 5xx is retried up to `retries` times, 1 s apart."""
    server = env("LC_SERVER", required=True).rstrip("/")
    name = env("WORKER_NAME", required=True)
    body = {
        "name": name,
        "namespace": env("NAMESPACE", "default"),
        "ownerName": env("JOB_NAME", required=True),
        "ownerKind": "lifelonglearningjob",
        "kind": kind,
        "status": status,
        "results": results or [],
    }
    data = json.dumps(body).encode()
    url = f"{server}/sedna/workers/{name}/info"
    last = None
    attempts = retries + 1
    for attempt in range(1, attempts + 1):
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                reply.read()
                return
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            try:
                message = json.loads(text).get("Message", text)
            except (ValueError, AttributeError):
                message = text
            if 400 <= err.code < 500:
                raise Refused(f"the local controller refused the report ({err.code}): {message}") from None
            last = f"{err.code}: {message}"
        except (urllib.error.URLError, OSError) as err:
            last = str(getattr(err, "reason", err))
        if attempt < attempts:
            time.sleep(1.0)
    raise ReportError(f"could not report to {url} after {attempts} attempts: {last}")


def run(kind, work):
    """Runs `work()` (which returns the results to report) and reports them. When `work()` fails,
    reports status failed (best effort) and exits 1; when the report fails, exits 1."""
    try:
        results = work()
    except Exception as err:  # noqa: BLE001 - any failure is reported, then the worker exits 1
        print(f"{kind} worker failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        try:
            report(kind, "failed", retries=1)
        except Exception as again:  # noqa: BLE001
            print(f"could not report the failure: {again}", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        report(kind, "completed", results)
    except ReportError as err:
        print(f"{kind} worker: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
