// The component's entry point: connects policy.js to the host through the WIT interfaces.
// Written by `perennial plugin new`; edit policy.js instead.
import { log as hostLog } from "perennial:policy/host@0.1.0";
import { log, metrics } from "./perennial-policy.js";
import { Policy } from "./policy.js";

log.useHost(hostLog);
let policy;

const model = (m) => ({ url: m.url, format: m.format, metrics: metrics(m.metrics) });

export const selector = {
  configure(config) {
    try {
      policy = new Policy(config);
    } catch (err) {
      throw err instanceof Error ? err.message : String(err); // the message refuses the config
    }
  },
  select(deployed, candidates) {
    const choice = policy.select(deployed === undefined ? undefined : model(deployed), candidates.map(model));
    return { deploy: choice.deploy, reason: choice.reason };
  },
};
