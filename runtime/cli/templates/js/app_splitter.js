// The component's entry point: connects policy.js to the host through the WIT interfaces.
// Written by `perennial plugin new`; edit policy.js instead.
import { lines } from "perennial:policy/batch-data@0.1.0";
import { log as hostLog } from "perennial:policy/host@0.1.0";
import { Batch, log, unpackLines } from "./perennial-policy.js";
import { Policy } from "./policy.js";

log.useHost(hostLog);
let policy;

export const splitter = {
  configure(config) {
    try {
      policy = new Policy(config);
    } catch (err) {
      throw err instanceof Error ? err.message : String(err); // the message refuses the config
    }
  },
  split(batch) {
    const fetch = () => {
      const packed = lines();
      return unpackLines(packed.data, packed.ends);
    };
    return Uint8Array.from(policy.split(new Batch(Number(batch.firstSeq), batch.count, fetch)));
  },
};
