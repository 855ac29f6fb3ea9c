// The policy: when to start a training round. Edit this file; app.js connects it to the host.
import { Config, Decision, log } from "./perennial-policy.js";

/** Train once `samples` new train samples are waiting, or `maxAgeHours` after the last round
 * when at least one is. */
export class Policy {
  constructor(text) {
    const config = new Config(text);
    this.samples = config.integer("samples", { fallback: 100, min: 1 });
    this.maxAgeSecs = config.integer("maxAgeHours", { fallback: 24, min: 1 }) * 3600;
    config.finish();
  }

  decide(stats) {
    const pending = Number(stats.pendingTrain);
    if (pending >= this.samples) return Decision.train(`${pending} new samples (at least ${this.samples})`);
    const age = stats.secondsSinceLastRound === undefined ? undefined : Number(stats.secondsSinceLastRound);
    if (age !== undefined && age >= this.maxAgeSecs && pending > 0) {
      return Decision.train(`the last round is ${Math.floor(age / 3600)} h old`);
    }
    log.debug(`${pending} of ${this.samples} samples`);
    return Decision.wait(`${pending} of ${this.samples} new samples`, 600);
  }
}
