"""The policy: where each new sample goes. Edit this file; `app.py` connects it to the host."""

from perennial_policy import EVAL, SKIP, TRAIN, Batch, Config


class Policy:
    """Every `evalEvery`-th sample of the job goes to eval, the others to train; empty lines are
    skipped. By sequence number, so the split does not depend on how samples are batched."""

    def __init__(self, config: str):
        config = Config(config)
        self.eval_every = config.integer("evalEvery", default=5, minimum=2)
        config.finish()

    def split(self, batch: Batch) -> list[int]:
        assignments = []
        for i, line in enumerate(batch.lines()):
            if not line.strip():
                assignments.append(SKIP)
            elif batch.seq(i) % self.eval_every == 0:
                assignments.append(EVAL)
            else:
                assignments.append(TRAIN)
        return assignments
