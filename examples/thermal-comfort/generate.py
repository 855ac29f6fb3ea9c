#!/usr/bin/env python3
"""Thermal-comfort sensor generator: appends bursts of ATCII-like readings to a CSV index.

Every BURST_INTERVAL_SECONDS it appends BURST_SIZE rows to INDEX_FILE, with ONE write() of whole
lines on a file opened for appending, so a reader never sees half a burst as whole lines. The
header is written first when the file is new or empty. On start, an existing file's rows are
counted and the sequence continues from there, so a restarted generator carries on with the
drift instead of repeating it. Every row is a pure function of (SEED, row number).

Labels: a PMV-like score of the readings against a comfortable temperature; the occupants of
each of BUILDINGS buildings like it up to 3.5 C warmer or cooler than usual (so a model needs to
see each building a good number of times: it gets better with more rounds). Drift: the
comfortable temperature also follows a "season" that advances with the row number (one year
every SEASON_ROWS rows), so later bursts are labelled differently from earlier ones. About
LABEL_NOISE of the labels are flipped to another class.

Env (defaults): INDEX_FILE (required), BURST_SIZE (100), BURST_INTERVAL_SECONDS (1.0), SEED (55),
MAX_ROWS (0: no limit; stop with exit 0 once the file holds that many rows), SEASON_ROWS (12000),
LABEL_NOISE (0.08), BUILDINGS (24).
"""

import math
import os
import random
import signal
import sys
import threading

HEADER = [
    "time_step",
    "building",
    "temperature_c",
    "relative_humidity",
    "air_velocity",
    "clothing_clo",
    "metabolic_rate",
    "thermal_sensation",
]
FEATURES = HEADER[2:-1]  # the numeric features; "building" is categorical
LABEL = HEADER[-1]
CLASSES = [-1, 0, 1]  # cool, neutral, warm (ATCII's thermal sensation, rounded to 3 classes)
CLASS_NAMES = {-1: "cool", 0: "neutral", 1: "warm"}


def season(n, season_rows):
    """The season at row n: -1 (winter) .. 1 (summer); row 0 is spring, heading into summer."""
    return math.sin(2.0 * math.pi * n / season_rows)


def building_name(b):
    return f"b{b + 1:02d}"


def building_offset(seed, building):
    """How much warmer (or cooler) than usual a building's occupants like it, in degrees C
    (ATCII's buildings differ by climate, culture and HVAC habits)."""
    return random.Random(f"thermal-comfort:{seed}:building:{building}").uniform(-3.5, 3.5)


def comfort_temperature(s, offset=0.0):
    """Adaptive comfort: the neutral temperature is higher in summer than in winter."""
    return 23.5 + 2.5 * s + offset


def thermal_score(features, s, offset=0.0):
    """A PMV-like score; below -0.5 is cool, above 0.5 is warm."""
    return (
        0.32 * (features["temperature_c"] - comfort_temperature(s, offset))
        + 1.8 * (features["metabolic_rate"] - 1.2)
        + 1.6 * (features["clothing_clo"] - 0.7)
        - 1.4 * (math.sqrt(features["air_velocity"]) - 0.35)
        + 0.012 * (features["relative_humidity"] - 50.0)
    )


def label_of(score):
    return -1 if score < -0.5 else (1 if score > 0.5 else 0)


def clip(x, lo, hi):
    return lo if x < lo else (hi if x > hi else x)


def reading(seed, n, season_rows=12000, label_noise=0.08, buildings=24, stream=""):
    """Row n of the sequence: a dict with the columns and the season. Another `stream` draws
    other readings from the same buildings, season and rule."""
    rng = random.Random(f"thermal-comfort:{seed}:{stream}{n}")
    s = season(n, season_rows)
    building = building_name(rng.randrange(buildings))
    features = {
        "temperature_c": round(clip(rng.gauss(23.5 + 2.0 * s, 2.8), 14.0, 34.0), 1),
        "relative_humidity": round(clip(rng.gauss(48.0 + 8.0 * s, 11.0), 10.0, 95.0), 1),
        "air_velocity": round(clip(0.03 + rng.expovariate(1.0 / 0.18), 0.02, 1.5), 2),
        "clothing_clo": round(clip(rng.gauss(0.72 - 0.18 * s, 0.16), 0.3, 1.5), 2),
        "metabolic_rate": round(clip(rng.gauss(1.2, 0.14), 0.8, 2.0), 2),
    }
    label = label_of(thermal_score(features, s, building_offset(seed, building)))
    if rng.random() < label_noise:
        label = rng.choice([c for c in CLASSES if c != label])
    return {"time_step": n, "building": building, **features, LABEL: label, "season": s}


def csv_line(row):
    return ",".join(str(row[c]) for c in HEADER) + "\n"


def env_num(name, default, kind=float):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        sys.exit(f"generate: {name}={value!r} is not a number")


def existing_rows(path):
    """(data rows already in the file, whether its last line is complete)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0, True
    if not data.strip():
        return 0, True
    lines = data.count(b"\n")
    complete = data.endswith(b"\n")
    # Line 1 is the header; an unterminated last line is counted as a row once it is ended.
    rows = lines - 1 + (0 if complete else 1)
    return max(rows, 0), complete


def append_once(path, lines):
    """Appends whole lines with ONE write() to the file opened for appending (unbuffered: the
    bytes are with the OS when it returns). The header goes first when the file is empty (new,
    or deleted and re-created while we run)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        text = (",".join(HEADER) + "\n" + lines) if os.fstat(fd).st_size == 0 else lines
        data = text.encode()
        written = os.write(fd, data)
        while written < len(data):  # a short write to a regular file is rare; finish the lines
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def main():
    path = os.environ.get("INDEX_FILE", "").strip()
    if not path:
        sys.exit("generate: INDEX_FILE is not set")
    burst = env_num("BURST_SIZE", 100, int)
    interval = env_num("BURST_INTERVAL_SECONDS", 1.0)
    seed = env_num("SEED", 55, int)
    max_rows = env_num("MAX_ROWS", 0, int)
    season_rows = env_num("SEASON_ROWS", 12000, int)
    noise = env_num("LABEL_NOISE", 0.08)
    buildings = env_num("BUILDINGS", 24, int)
    if burst < 1 or interval < 0 or season_rows < 1 or buildings < 1:
        sys.exit("generate: BURST_SIZE, SEASON_ROWS and BUILDINGS must be >= 1, BURST_INTERVAL_SECONDS >= 0")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    n, complete = existing_rows(path)
    prefix = "" if complete else "\n"
    if not complete:
        print(f"generate: the last line of {path} was cut off; ended it", flush=True)
    print(f"generate: {path}: {n} rows already, bursts of {burst} every {interval}s (seed {seed})", flush=True)

    while not stop.is_set():
        count = burst if max_rows <= 0 else min(burst, max_rows - n)
        if count <= 0:
            print(f"generate: {n} rows, MAX_ROWS reached", flush=True)
            return 0
        text = prefix + "".join(csv_line(reading(seed, i, season_rows, noise, buildings)) for i in range(n, n + count))
        append_once(path, text)
        prefix = ""
        n += count
        if n % (burst * 10) < count:
            print(f"generate: {n} rows, season {season(n, season_rows):+.2f}", flush=True)
        stop.wait(interval)
    print(f"generate: stopped at {n} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
