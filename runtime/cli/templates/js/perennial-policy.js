// Helpers for Perennial policies written in JavaScript (vendored by `perennial plugin new`).
//
// - Config: reads the job's JSON config; every error names the field and what is wrong.
// - Decision (trigger), Batch and TRAIN/EVAL/SKIP (splitter), Choice (selector): plain objects, so
//   that a policy's logic is tested with `node --test`, with no WebAssembly involved.
// - log: lines attributed to the job on the host; the console when run natively.
//
// app.js (the component's entry) connects these to the WIT bindings.

/** A sample's assignment, as the splitter returns it: one per sample. */
export const TRAIN = 0;
export const EVAL = 1;
export const SKIP = 2;

/** A config the policy refuses; the host refuses the policy with this message. */
export class ConfigError extends Error {
  get name() {
    return "ConfigError";
  }
}

/** A policy's JSON config ("{}" when the job gives none), read field by field. Call finish()
 * after reading every field: an unknown field (a typo) is an error. */
export class Config {
  constructor(text) {
    let values;
    try {
      values = JSON.parse(text || "{}");
    } catch (err) {
      throw new ConfigError(`config: not JSON (${err.message})`);
    }
    if (values === null || typeof values !== "object" || Array.isArray(values)) {
      throw new ConfigError("config: expected a JSON object");
    }
    this.values = values;
    this.read = new Set();
  }

  get(name, fallback) {
    this.read.add(name);
    const value = this.values[name];
    if (value === undefined || value === null) {
      if (fallback === undefined) throw new ConfigError(`${name}: missing`);
      return fallback;
    }
    return value;
  }

  integer(name, { fallback, min, max } = {}) {
    const value = this.get(name, fallback);
    if (!Number.isInteger(value)) throw new ConfigError(`${name}: expected an integer, got ${JSON.stringify(value)}`);
    return checkRange(name, value, min, max);
  }

  number(name, { fallback, min, max } = {}) {
    const value = this.get(name, fallback);
    if (typeof value !== "number") throw new ConfigError(`${name}: expected a number, got ${JSON.stringify(value)}`);
    return checkRange(name, value, min, max);
  }

  string(name, { fallback, choices } = {}) {
    const value = this.get(name, fallback);
    if (typeof value !== "string") throw new ConfigError(`${name}: expected a string, got ${JSON.stringify(value)}`);
    if (choices && !choices.includes(value)) {
      throw new ConfigError(`${name}: ${JSON.stringify(value)} is not one of ${choices.join(", ")}`);
    }
    return value;
  }

  boolean(name, { fallback } = {}) {
    const value = this.get(name, fallback);
    if (typeof value !== "boolean") throw new ConfigError(`${name}: expected true or false, got ${JSON.stringify(value)}`);
    return value;
  }

  finish() {
    const unknown = Object.keys(this.values).filter((name) => !this.read.has(name)).sort();
    if (unknown.length > 0) {
      const known = [...this.read].sort().join(", ") || "none";
      throw new ConfigError(`${unknown[0]}: unknown field (this policy reads: ${known})`);
    }
  }
}

function checkRange(name, value, min, max) {
  if (min !== undefined && value < min) throw new ConfigError(`${name}: ${value} is below the minimum ${min}`);
  if (max !== undefined && value > max) throw new ConfigError(`${name}: ${value} is above the maximum ${max}`);
  return value;
}

/** A trigger's answer; the reason is shown on the job. */
export const Decision = {
  train: (reason) => ({ train: true, reason, recheckAfterSecs: undefined }),
  wait: (reason, recheckAfterSecs) => ({ train: false, reason, recheckAfterSecs }),
};

/** New samples for a splitter; their lines are fetched from the host on first use. */
export class Batch {
  constructor(firstSeq, count, fetch) {
    this.firstSeq = firstSeq;
    this.count = count;
    this.fetch = fetch;
    this.cached = undefined;
  }

  /** A batch for tests. */
  static ofLines(firstSeq, lines) {
    return new Batch(firstSeq, lines.length, () => [...lines]);
  }

  /** The job's sequence number of sample `index` of the batch. */
  seq(index) {
    return this.firstSeq + index;
  }

  lines() {
    if (this.cached === undefined) {
      this.cached = this.fetch();
      if (this.cached.length !== this.count) {
        throw new Error(`the host sent ${this.cached.length} lines for a batch of ${this.count}`);
      }
    }
    return this.cached;
  }
}

/** The host's packed lines (batch-data.lines): one string per sample. */
export function unpackLines(data, ends) {
  const decoder = new TextDecoder();
  const lines = [];
  let start = 0;
  for (const end of ends) {
    lines.push(decoder.decode(data.subarray(start, end)));
    start = end;
  }
  return lines;
}

/** A selector's answer: the index of the candidate to deploy, or undefined to keep the deployed one. */
export const Choice = {
  deploy: (index, reason) => ({ deploy: index, reason }),
  keep: (reason) => ({ deploy: undefined, reason }),
};

/** Metrics of a model as an object: { accuracy: 0.93 }. */
export function metrics(list) {
  return Object.fromEntries((list ?? []).map((metric) => [metric.name, metric.value]));
}

let hostLog;
const write = (level, message) => (hostLog ? hostLog(level, message) : console.error(`${level}: ${message}`));

/** Log lines attributed to the job. */
export const log = {
  useHost: (writer) => {
    hostLog = writer;
  },
  debug: (message) => write("debug", message),
  info: (message) => write("info", message),
  warn: (message) => write("warn", message),
  error: (message) => write("error", message),
};
