// Native tests of the policy: `node --test` (no WebAssembly involved).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Batch, EVAL, SKIP, TRAIN } from "./perennial-policy.js";
import { Policy } from "./policy.js";

test("every nth sample goes to eval", () => {
  const policy = new Policy('{"evalEvery": 2}');
  assert.deepEqual(policy.split(Batch.ofLines(10, ["a", "b", "", "d"])), [EVAL, TRAIN, SKIP, TRAIN]);
});

test("a bad config names the field", () => {
  assert.throws(() => new Policy('{"evalEvery": "two"}'), /^ConfigError: evalEvery: /);
});
