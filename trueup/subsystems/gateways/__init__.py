"""Gateway monitoring and multi-WAN failover (`spec.gateways`).

`section` (the document's model: pure data, loaded through the catalog),
`health` (the per-uplink state machine and the decision, pure), `subsystem`
(the default routes the decision implies) and `monitor` (the probes and the
prompt switch). Importing the package loads the section only.
"""

from __future__ import annotations

from trueup.subsystems.gateways.section import GatewaysSection

__all__ = ["GatewaysSection"]
