"""Test subsystems registered through the plugin interface (`agent run --plugin`).

They stand in for subsystems whose real versions need daemons: one whose
preparation resolves a name (and hangs when the resolver never answers), one
whose service fails to start.
"""

from __future__ import annotations

import os
import socket

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.subsystems.base import Facts, Plan, Scope, Step, StepError, Subsystem
from trueup.system.netlink import Netlink


class ResolverProbe(Subsystem):
    """Like a VPN subsystem: resolves its endpoint's name while preparing."""

    name = "resolver-probe"
    tier = Tier.OPTIONAL

    def __init__(self) -> None:
        self.endpoint: str | None = None
        self.started = False

    def prepare(self, document: DeviceState) -> None:
        host = os.environ.get("TRUEUP_TEST_RESOLVE", "vpn.example.invalid")
        infos = socket.getaddrinfo(host, 51820, type=socket.SOCK_DGRAM)
        self.endpoint = str(infos[0][4][0])

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        return {"spec.x-resolver-probe.running": True}

    def observe(self, netlink: Netlink, scope: Scope) -> Facts:
        return {"spec.x-resolver-probe.running": self.started}

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        if desired == observed:
            return Plan(self.name, [], ["running"])
        return Plan(
            self.name,
            [
                Step(
                    self.name, "start", "spec.x-resolver-probe.running", {"endpoint": self.endpoint}
                )
            ],
        )

    def execute(self, netlink: Netlink, step: Step) -> None:
        self.started = True


class FailingService(Subsystem):
    """An optional service whose daemon exits at once."""

    name = "failing-service"
    tier = Tier.OPTIONAL

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        return {"spec.x-failing-service.running": True}

    def observe(self, netlink: Netlink, scope: Scope) -> Facts:
        return {"spec.x-failing-service.running": False}

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        return Plan(self.name, [Step(self.name, "start", "spec.x-failing-service.running")])

    def execute(self, netlink: Netlink, step: Step) -> None:
        raise StepError(step, "daemon exited with status 1 right after start")


class NeedsMissingBinary(FailingService):
    name = "needs-missing-binary"
    required_binaries = ("trueup-test-no-such-binary",)
    required_files = ("/nonexistent/trueup-test/hook.so",)
