// Native tests of the policy: `node --test` (no WebAssembly involved).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Policy } from "./policy.js";

test("trains once enough samples wait", () => {
  const policy = new Policy('{"samples": 3}');
  assert.equal(policy.decide({ pendingTrain: 2 }).train, false);
  assert.equal(policy.decide({ pendingTrain: 3 }).train, true);
});

test("trains when the last round is old", () => {
  const policy = new Policy('{"samples": 100, "maxAgeHours": 1}');
  assert.equal(policy.decide({ pendingTrain: 1, secondsSinceLastRound: 3600 }).train, true);
});

test("a bad config names the field", () => {
  assert.throws(() => new Policy('{"samples": 0}'), /^ConfigError: samples: /);
  assert.throws(() => new Policy('{"sample": 3}'), /^ConfigError: sample: unknown field/);
});
