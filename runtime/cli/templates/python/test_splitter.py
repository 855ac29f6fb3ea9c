"""Native tests of the policy: `python3 -m unittest` (no WebAssembly involved)."""

import unittest

from perennial_policy import EVAL, SKIP, TRAIN, Batch, ConfigError
from policy import Policy


class PolicyTest(unittest.TestCase):
    def test_every_nth_sample_goes_to_eval(self):
        policy = Policy('{"evalEvery": 2}')
        self.assertEqual(policy.split(Batch.of_lines(10, ["a", "b", "", "d"])), [EVAL, TRAIN, SKIP, TRAIN])

    def test_a_bad_config_names_the_field(self):
        with self.assertRaisesRegex(ConfigError, "^evalEvery: "):
            Policy('{"evalEvery": "two"}')


if __name__ == "__main__":
    unittest.main()
