"""The policy: which evaluated model to deploy. Edit this file; `app.py` connects it to the host."""

import math
from typing import Optional

from perennial_policy import Choice, Config, Model


class Policy:
    """Deploy the candidate with the highest `metric` when it beats the deployed model by at least
    `minDelta` (a model without the metric, or with a value that is not a number, NaN or infinite,
    is never chosen)."""

    def __init__(self, config: str):
        config = Config(config)
        self.metric = config.string("metric", default="accuracy")
        self.min_delta = config.number("minDelta", default=0.0, minimum=0.0)
        config.finish()

    def select(self, deployed: Optional[Model], candidates: list[Model]) -> Choice:
        scored = [(value, i) for i, m in enumerate(candidates) if _finite(value := m.metrics.get(self.metric))]
        if not scored:
            return Choice.keep(f"no candidate has a finite {self.metric}")
        best, index = max(scored)
        current = deployed.metrics.get(self.metric) if deployed else None
        # A deployed model without a finite value is beaten by any candidate that has one.
        if _finite(current) and best < current + self.min_delta:
            return Choice.keep(f"best {self.metric} {best:.4f} does not beat the deployed {current:.4f} by {self.min_delta}")
        return Choice.deploy_model(index, f"{self.metric} {best:.4f}")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
