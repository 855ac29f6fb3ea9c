// The policy: which evaluated model to deploy. Edit this file; app.js connects it to the host.
import { Choice, Config } from "./perennial-policy.js";

/** Deploy the candidate with the highest `metric` when it beats the deployed model by at least
 * `minDelta` (a model without the metric, or with a value that is not a number, NaN or infinite,
 * is never chosen). Models: { url, format, metrics }. */
export class Policy {
  constructor(text) {
    const config = new Config(text);
    this.metric = config.string("metric", { fallback: "accuracy" });
    this.minDelta = config.number("minDelta", { fallback: 0, min: 0 });
    config.finish();
  }

  select(deployed, candidates) {
    let best;
    candidates.forEach((model, index) => {
      const score = model.metrics[this.metric];
      if (Number.isFinite(score) && (best === undefined || score > best.score)) best = { score, index };
    });
    if (best === undefined) return Choice.keep(`no candidate has a finite ${this.metric}`);
    const current = deployed?.metrics[this.metric];
    // A deployed model without a finite value is beaten by any candidate that has one.
    if (Number.isFinite(current) && best.score < current + this.minDelta) {
      return Choice.keep(`best ${this.metric} ${best.score.toFixed(4)} does not beat the deployed ${current.toFixed(4)}`);
    }
    return Choice.deploy(best.index, `${this.metric} ${best.score.toFixed(4)}`);
  }
}
