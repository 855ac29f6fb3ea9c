"""The component's entry point: connects `policy.py` to the host through the WIT bindings that
componentize-py generates. Written by `perennial plugin new`; edit `policy.py` instead."""

import perennial_policy as pp
from componentize_py_types import Err
from policy import Policy
from wit_world import exports
from wit_world.exports import trigger
from wit_world.imports import host, types

pp.log.use_host(lambda level, message: host.log(types.Level[level.upper()], message))
_policy = None


class Trigger(exports.Trigger):
    def configure(self, config: str) -> None:
        global _policy
        try:
            _policy = Policy(config)
        except pp.ConfigError as err:
            raise Err(str(err))

    def decide(self, stats: trigger.Stats) -> trigger.Decision:
        seen = pp.Stats(
            pending_train=stats.pending_train,
            pending_eval=stats.pending_eval,
            total_samples=stats.total_samples,
            rounds_completed=stats.rounds_completed,
            seconds_since_last_round=stats.seconds_since_last_round,
            wall_clock_secs=stats.wall_clock_secs,
            utc_offset_secs=stats.utc_offset_secs,
            deployed_metrics={m.name: m.value for m in stats.deployed_metrics},
        )
        decision = _policy.decide(seen)
        return trigger.Decision(decision.train, decision.reason, decision.recheck_after_secs)
