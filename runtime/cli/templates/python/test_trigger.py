"""Native tests of the policy: `python3 -m unittest` (no WebAssembly involved)."""

import unittest

from perennial_policy import ConfigError, Stats
from policy import Policy


class PolicyTest(unittest.TestCase):
    def test_trains_once_enough_samples_wait(self):
        policy = Policy('{"samples": 3}')
        self.assertFalse(policy.decide(Stats(pending_train=2)).train)
        self.assertTrue(policy.decide(Stats(pending_train=3)).train)

    def test_trains_when_the_last_round_is_old(self):
        policy = Policy('{"samples": 100, "maxAgeHours": 1}')
        self.assertTrue(policy.decide(Stats(pending_train=1, seconds_since_last_round=3600)).train)

    def test_a_bad_config_names_the_field(self):
        with self.assertRaisesRegex(ConfigError, "^samples: "):
            Policy('{"samples": 0}')
        with self.assertRaisesRegex(ConfigError, "^sample: unknown field"):
            Policy('{"sample": 3}')


if __name__ == "__main__":
    unittest.main()
