"""Test subsystems registered through the plugin interface (`agent run --plugin`).

They stand in for subsystems whose real versions need daemons: one whose
preparation resolves a name (and hangs when the resolver never answers), one
whose service fails to start.
"""

from __future__ import annotations

import os
import socket

from pydantic import RootModel

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, StepError, Subsystem
from trueup.system.netlink import Netlink
from trueup.system.watches import files


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


class MotdSection(RootModel[str]):
    """`spec.motd`: the text of a file (the path comes from TRUEUP_TEST_MOTD)."""


class MotdFile(Subsystem):
    """A file-backed subsystem, as Kea's or Knot's configuration will be: a files() watch."""

    name = "motd"
    tier = Tier.OPTIONAL
    section = ("motd", MotdSection)
    path = os.environ.get("TRUEUP_TEST_MOTD", "/nonexistent/trueup-test/motd")
    watches = (files(path),)

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("motd", MotdSection) is not None

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("motd", MotdSection)
        return {"spec.motd": section.root} if section is not None else {}

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        return {"spec.motd": sources.files.read(self.path)}

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        want = desired.get("spec.motd")
        if want is None or observed.get("spec.motd") == want:
            return Plan(self.name, [], ["in place"])
        return Plan(self.name, [Step(self.name, "write", "spec.motd", {"text": want})])

    def execute(self, sources: Sources, step: Step) -> None:
        self.run_step(step, lambda: sources.files.write(self.path, step.args["text"]))
