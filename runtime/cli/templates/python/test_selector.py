"""Native tests of the policy: `python3 -m unittest` (no WebAssembly involved)."""

import unittest

from perennial_policy import ConfigError, Model
from policy import Policy


class PolicyTest(unittest.TestCase):
    def test_deploys_the_best_candidate_that_beats_the_deployed_one(self):
        policy = Policy('{"metric": "accuracy", "minDelta": 0.01}')
        deployed = Model("m0", metrics={"accuracy": 0.90})
        candidates = [Model("m1", metrics={"accuracy": 0.905}), Model("m2", metrics={"accuracy": 0.95})]
        self.assertEqual(policy.select(deployed, candidates).deploy, 1)
        self.assertIsNone(policy.select(deployed, candidates[:1]).deploy)

    def test_never_picks_a_nan_or_infinite_or_missing_metric(self):
        policy = Policy("{}")
        nan, inf = float("nan"), float("inf")
        candidates = [Model("m1", metrics={"accuracy": nan}), Model("m2", metrics={"accuracy": 0.95}),
                      Model("m3", metrics={}), Model("m4", metrics={"accuracy": inf})]
        self.assertEqual(policy.select(None, candidates).deploy, 1)
        self.assertIsNone(policy.select(Model("m0", metrics={"accuracy": 0.5}), candidates[:1]).deploy)
        self.assertEqual(policy.select(Model("m0", metrics={"accuracy": nan}), candidates[1:2]).deploy, 0)

    def test_a_bad_config_names_the_field(self):
        with self.assertRaisesRegex(ConfigError, "^minDelta: "):
            Policy('{"minDelta": -1}')


if __name__ == "__main__":
    unittest.main()
