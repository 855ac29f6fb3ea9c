"""The component's entry point: connects `policy.py` to the host through the WIT bindings that
componentize-py generates. Written by `perennial plugin new`; edit `policy.py` instead."""

import perennial_policy as pp
from componentize_py_types import Err
from policy import Policy
from wit_world import exports
from wit_world.exports import selector
from wit_world.imports import host, types

pp.log.use_host(lambda level, message: host.log(types.Level[level.upper()], message))
_policy = None


def _model(model: types.Model) -> pp.Model:
    return pp.Model(model.url, model.format, {m.name: m.value for m in model.metrics})


class Selector(exports.Selector):
    def configure(self, config: str) -> None:
        global _policy
        try:
            _policy = Policy(config)
        except pp.ConfigError as err:
            raise Err(str(err))

    def select(self, deployed, candidates) -> selector.Choice:
        choice = _policy.select(_model(deployed) if deployed else None, [_model(m) for m in candidates])
        return selector.Choice(choice.deploy, choice.reason)
