// Native tests of the policy: `node --test` (no WebAssembly involved).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Policy } from "./policy.js";

test("deploys the best candidate that beats the deployed one", () => {
  const policy = new Policy('{"metric": "accuracy", "minDelta": 0.01}');
  const deployed = { url: "m0", metrics: { accuracy: 0.9 } };
  const candidates = [
    { url: "m1", metrics: { accuracy: 0.905 } },
    { url: "m2", metrics: { accuracy: 0.95 } },
  ];
  assert.equal(policy.select(deployed, candidates).deploy, 1);
  assert.equal(policy.select(deployed, candidates.slice(0, 1)).deploy, undefined);
});

test("never picks a NaN, infinite or missing metric", () => {
  const policy = new Policy("{}");
  const candidates = [
    { url: "m1", metrics: { accuracy: NaN } },
    { url: "m2", metrics: { accuracy: 0.95 } },
    { url: "m3", metrics: {} },
    { url: "m4", metrics: { accuracy: Infinity } },
  ];
  assert.equal(policy.select(undefined, candidates).deploy, 1);
  assert.equal(policy.select({ url: "m0", metrics: { accuracy: 0.5 } }, candidates.slice(0, 1)).deploy, undefined);
  assert.equal(policy.select({ url: "m0", metrics: { accuracy: NaN } }, candidates.slice(1, 2)).deploy, 0);
});

test("a bad config names the field", () => {
  assert.throws(() => new Policy('{"minDelta": -1}'), /^ConfigError: minDelta: /);
});
