#!/usr/bin/env python3
"""EVAL worker: measures the round's model(s) on the eval samples of the last few batches.

For each model in MODEL_URLS (";"-separated), writes a copy with the eval metrics inside to
OUTPUT_URL (model.json for the first, model-2.json, ... for the others) and reports it with
metrics {"accuracy", "samples", "f1Macro"}.

Env: MODEL_URLS, TEST_DATASET_URL, OUTPUT_URL, plus the common ones (see README.md).
"""

import os
import sys

sys.dont_write_bytecode = True  # keep the example folder free of __pycache__

import sedna_worker as sw  # noqa: E402


def work():
    urls = [u.strip() for u in sw.env("MODEL_URLS", required=True).split(";") if u.strip()]
    data = sw.env("TEST_DATASET_URL", required=True)
    output = sw.local_path(sw.env("OUTPUT_URL", required=True))
    if not urls:
        raise sw.WorkerError("MODEL_URLS names no model")
    X, y, skipped = sw.load_samples(data)
    results = []
    for i, url in enumerate(urls):
        model = sw.load_model(url)
        path = os.path.join(output, "model.json" if i == 0 else f"model-{i + 1}.json")
        if X:
            metrics = sw.evaluate(model, X, y)
            reported = {k: metrics[k] for k in ("accuracy", "samples", "f1Macro")}
            said = f"accuracy {metrics['accuracy']:.3f}, macro F1 {metrics['f1Macro']:.3f} on {len(y)} samples"
        else:
            # No eval samples (e.g. trainProb 1): no accuracy to report. first-select still
            # deploys the model; metric-select does not (a missing metric is never deployed).
            metrics = reported = {"samples": 0}
            said = "no eval samples, no accuracy"
        model["eval"] = {**metrics, "dataset": data, "source": url}
        sw.save_json(path, model)
        sw.log(f"round {model.get('round')}: {said} ({skipped} rows skipped) -> {path}")
        results.append({"format": "json", "url": sw.model_url(path), "metrics": reported})
    return results


if __name__ == "__main__":
    sw.run("eval", work)
