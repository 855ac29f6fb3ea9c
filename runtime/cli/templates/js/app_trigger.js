// The component's entry point: connects policy.js to the host through the WIT interfaces.
// Written by `perennial plugin new`; edit policy.js instead.
import { log as hostLog } from "perennial:policy/host@0.1.0";
import { log } from "./perennial-policy.js";
import { Policy } from "./policy.js";

log.useHost(hostLog);
let policy;

export const trigger = {
  configure(config) {
    try {
      policy = new Policy(config);
    } catch (err) {
      throw err instanceof Error ? err.message : String(err); // the message refuses the config
    }
  },
  decide(stats) {
    const decision = policy.decide({
      pendingTrain: Number(stats.pendingTrain),
      pendingEval: Number(stats.pendingEval),
      totalSamples: Number(stats.totalSamples),
      roundsCompleted: stats.roundsCompleted,
      secondsSinceLastRound: stats.secondsSinceLastRound === undefined ? undefined : Number(stats.secondsSinceLastRound),
      wallClockSecs: Number(stats.wallClockSecs),
      utcOffsetSecs: stats.utcOffsetSecs,
      deployedMetrics: Object.fromEntries(stats.deployedMetrics.map((m) => [m.name, m.value])),
    });
    const recheck = decision.recheckAfterSecs;
    return { train: decision.train, reason: decision.reason, recheckAfterSecs: recheck === undefined ? undefined : BigInt(recheck) };
  },
};
