"""The policy: which evaluated model to deploy. Edit this file; `app.py` connects it to the host."""

from typing import Optional

from perennial_policy import Choice, Config, Model


class Policy:
    """Deploy the candidate with the highest `metric` when it beats the deployed model by at least
    `minDelta` (a model without the metric is never chosen)."""

    def __init__(self, config: str):
        config = Config(config)
        self.metric = config.string("metric", default="accuracy")
        self.min_delta = config.number("minDelta", default=0.0, minimum=0.0)
        config.finish()

    def select(self, deployed: Optional[Model], candidates: list[Model]) -> Choice:
        scored = [(m.metrics[self.metric], i) for i, m in enumerate(candidates) if self.metric in m.metrics]
        if not scored:
            return Choice.keep(f"no candidate has {self.metric}")
        best, index = max(scored)
        current = deployed.metrics.get(self.metric) if deployed else None
        if current is not None and best < current + self.min_delta:
            return Choice.keep(f"best {self.metric} {best:.4f} does not beat the deployed {current:.4f} by {self.min_delta}")
        return Choice.deploy_model(index, f"{self.metric} {best:.4f}")
