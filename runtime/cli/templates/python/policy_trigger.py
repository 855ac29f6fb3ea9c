"""The policy: when to start a training round. Edit this file; `app.py` connects it to the host."""

from perennial_policy import Config, Decision, Stats, log


class Policy:
    """Train once `samples` new train samples are waiting, or `maxAgeHours` after the last round
    when at least one is."""

    def __init__(self, config: str):
        config = Config(config)
        self.samples = config.integer("samples", default=100, minimum=1)
        self.max_age_secs = config.integer("maxAgeHours", default=24, minimum=1) * 3600
        config.finish()

    def decide(self, stats: Stats) -> Decision:
        if stats.pending_train >= self.samples:
            return Decision.train_now(f"{stats.pending_train} new samples (at least {self.samples})")
        age = stats.seconds_since_last_round
        if age is not None and age >= self.max_age_secs and stats.pending_train > 0:
            return Decision.train_now(f"the last round is {age // 3600} h old")
        log.debug(f"{stats.pending_train} of {self.samples} samples")
        return Decision.wait(f"{stats.pending_train} of {self.samples} new samples", recheck_after_secs=600)
