// The policy: where each new sample goes. Edit this file; app.js connects it to the host.
import { Config, EVAL, SKIP, TRAIN } from "./perennial-policy.js";

/** Every `evalEvery`-th sample of the job goes to eval, the others to train; empty lines are
 * skipped. By sequence number, so the split does not depend on how samples are batched. */
export class Policy {
  constructor(text) {
    const config = new Config(text);
    this.evalEvery = config.integer("evalEvery", { fallback: 5, min: 2 });
    config.finish();
  }

  split(batch) {
    return batch.lines().map((line, i) => {
      if (line.trim() === "") return SKIP;
      return batch.seq(i) % this.evalEvery === 0 ? EVAL : TRAIN;
    });
  }
}
