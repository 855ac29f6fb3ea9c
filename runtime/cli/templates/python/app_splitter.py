"""The component's entry point: connects `policy.py` to the host through the WIT bindings that
componentize-py generates. Written by `perennial plugin new`; edit `policy.py` instead."""

import perennial_policy as pp
from componentize_py_types import Err
from policy import Policy
from wit_world import exports
from wit_world.exports import splitter
from wit_world.imports import batch_data, host, types

pp.log.use_host(lambda level, message: host.log(types.Level[level.upper()], message))
_policy = None


def _lines() -> list[str]:
    packed = batch_data.lines()
    return pp.unpack_lines(packed.data, packed.ends)


class Splitter(exports.Splitter):
    def configure(self, config: str) -> None:
        global _policy
        try:
            _policy = Policy(config)
        except pp.ConfigError as err:
            raise Err(str(err))

    def split(self, batch: splitter.Batch) -> bytes:
        return bytes(_policy.split(pp.Batch(batch.first_seq, batch.count, _lines)))
