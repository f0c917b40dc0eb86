"""The CLI's commands declared once: names, arguments, options and help.

`trueup`'s own commands (`plan`, `apply`, `status`, …, `agent run`, `audit
verify`) and the one-line help of each group are declared here, standard
library only. Both CLIs derive from this table:

- the typer app (`trueup.cli.main`) registers each command with its name and
  help from `COMMANDS` and builds each option from its `Option` here
  (`trueup.cli.main.option`); the Python type and default stay in the
  command's signature;
- the fast path (`trueup.cli.fast`) parses the commands marked `fast` with
  the options declared here (those taking a value; a flag hands over to typer);
- `trueup --help` without typer (`trueup.cli.helptext`) is generated from the
  typer app, and `tests/unit/test_cli_commands.py` checks that the app, the
  fast path's parser and that generated help all say what this table says.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["COMMANDS", "GROUPS", "ROOT", "Command", "Group", "Option"]


class Option:
    """One option: its flags (`-o`, `--output`), the parameter it fills, its help."""

    __slots__ = ("dest", "envvar", "flags", "help", "metavar", "takes_value")

    def __init__(
        self,
        dest: str,
        flags: tuple[str, ...],
        help: str,
        *,
        takes_value: bool = True,
        envvar: str | None = None,
        metavar: str | None = None,
    ) -> None:
        self.dest = dest
        self.flags = flags
        self.help = help
        self.takes_value = takes_value
        self.envvar = envvar
        self.metavar = metavar

    def __repr__(self) -> str:
        return f"Option({self.dest!r}, {self.flags!r})"


class Command:
    """A command: its name (`agent run` for a group's), positional arguments, options, help.

    `fast`: the fast path answers it against a running agent; `fast_requires`:
    the options it must have been given for that (otherwise typer decides).
    `usage_exit_1`: its exit 2 means something (changes, drift), so a usage error
    exits 1 (`trueup.cli.exitcodes.DetailedExitCommand`).
    """

    __slots__ = ("arguments", "fast", "fast_requires", "help", "name", "options", "usage_exit_1")

    def __init__(
        self,
        name: str,
        help: str,
        arguments: tuple[str, ...] = (),
        options: Iterable[Option] = (),
        *,
        fast: bool = False,
        fast_requires: tuple[str, ...] = (),
        usage_exit_1: bool = False,
    ) -> None:
        self.name = name
        self.help = help
        self.arguments = arguments
        self.options = tuple(options)
        self.fast = fast
        self.fast_requires = fast_requires
        self.usage_exit_1 = usage_exit_1

    def option(self, dest: str) -> Option:
        for option in self.options:
            if option.dest == dest:
                return option
        raise KeyError(f"{self.name}: no option {dest!r}")

    @property
    def short_help(self) -> str:
        """The first paragraph: the command's line in `trueup --help`."""
        return self.help.split("\n\n", 1)[0]

    def __repr__(self) -> str:
        return f"Command({self.name!r})"


class Group:
    """A group of commands (`trueup fleet …`) and its line in `trueup --help`."""

    __slots__ = ("help", "name")

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help


# -- options several commands take -----------------------------------------------------
STATE_DIR = Option(
    "state_dir",
    ("--state-dir",),
    "The agent's state directory (made by `trueup agent run` or `trueup apply --init`).",
    envvar="TRUEUP_STATE_DIR",
)
# For the commands that may make the state directory (`agent run`, `apply --init`, …).
NEW_STATE_DIR = Option(
    "state_dir", ("--state-dir",), "The agent's state directory.", envvar="TRUEUP_STATE_DIR"
)
OUTPUT = Option("output", ("-o", "--output"), "json | yaml | table")
OVERRIDE = Option(
    "override",
    ("--override",),
    "on a device managed by a control plane: apply locally anyway, reported "
    "upstream as a local override with this reason",
)
CONFIRM_WITHIN = Option(
    "confirm_within", ("--confirm-within",), "roll back unless `trueup confirm` within SECONDS"
)
PLUGIN = "extra subsystem MODULE:FACTORY"

ROOT = Command(
    "",
    "Keep Linux edge routers at their desired configuration.",
    options=[
        Option(
            "version",
            ("--version",),
            "Print trueup's version (and the running agent's) and exit.",
            takes_value=False,
        ),
        Option(
            "debug", ("--debug",), "Print the traceback when a command fails.", takes_value=False
        ),
        Option(
            "device",
            ("--device",),
            "Refuse another device's state directory (also TRUEUP_DEVICE).",
            metavar="NAME",
        ),
    ],
)

_COMMANDS = [
    Command(
        "validate",
        "Validate a desired-state document: exit 0 valid, 1 invalid (every problem with its path).",
        ("file",),
    ),
    Command("schema", "Print the JSON Schema of the desired-state document."),
    Command(
        "plan",
        "Show what applying FILE would change: exit 0 no changes, 2 changes, 1 error."
        "\n\n"
        "With an agent running on the state directory, the agent observes (the same system "
        "`apply` changes); without one, this process observes its own network namespace and "
        "says so.",
        ("file",),
        [STATE_DIR, OUTPUT],
        fast=True,
        usage_exit_1=True,
    ),
    Command(
        "apply",
        "Apply FILE as one journaled transaction.",
        ("file",),
        [
            NEW_STATE_DIR,
            Option("mode", ("--mode",), "atomic | best-effort"),
            Option(
                "expect_version", ("--expect-version",), "refuse unless the applied version is this"
            ),
            CONFIRM_WITHIN,
            OVERRIDE,
            Option(
                "init",
                ("--init",),
                "make the state directory if it is not one yet (first apply; "
                "an empty or missing directory)",
                takes_value=False,
            ),
            OUTPUT,
        ],
    ),
    Command(
        "rollback",
        "Apply an earlier accepted revision again (as a new version).",
        options=[
            STATE_DIR,
            Option("to", ("--to",), "an accepted revision; default the previous"),
            CONFIRM_WITHIN,
            OVERRIDE,
            OUTPUT,
        ],
    ),
    Command(
        "confirm", "Keep the version applied with --confirm-within.", options=[STATE_DIR], fast=True
    ),
    Command(
        "status",
        "Versions, management readiness, per-subsystem health, reason codes.",
        options=[STATE_DIR, OUTPUT],
        fast=True,
    ),
    Command(
        "drift",
        "Differences between observed and applied state: exit 0 in sync, 2 drift.",
        options=[STATE_DIR, OUTPUT],
        fast=True,
        usage_exit_1=True,
    ),
    Command(
        "reconcile",
        "Converge now to the applied version (and close an open circuit breaker).",
        options=[STATE_DIR, Option("subsystem", ("--subsystem",), "only this subsystem"), OUTPUT],
    ),
    Command(
        "ack",
        "Stop healing SUBSYSTEM (never detection) until the acknowledgement expires; "
        "--clear ends it.",
        ("subsystem",),
        [
            Option("for_", ("--for",), "how long, e.g. 2h"),
            Option("reason", ("--reason",), "why healing stops (audited)"),
            Option(
                "clear",
                ("--clear",),
                "withdraw SUBSYSTEM's acknowledgement now (audited)",
                takes_value=False,
            ),
            STATE_DIR,
        ],
        fast=True,
        fast_requires=("for_", "reason"),
    ),
    Command(
        "evidence",
        "Collect the runbook's evidence bundle; works with the agent stopped or hung.",
        options=[
            Option("out", ("--out",), "where to write the tar.gz (0600)"),
            STATE_DIR,
            Option(
                "upload", ("--upload",), "also upload it to the control plane", takes_value=False
            ),
            Option(
                "control_plane",
                ("--control-plane",),
                "control-plane URL (default: the one the agent last synced with)",
                envvar="TRUEUP_CONTROL_PLANE",
            ),
            Option(
                "token_file",
                ("--token-file",),
                "the agent's device credential file",
                envvar="TRUEUP_TOKEN_FILE",
            ),
        ],
    ),
    Command(
        "preflight",
        "Check startup prerequisites before an agent is replaced; changes nothing.",
        options=[
            NEW_STATE_DIR,
            Option("config", ("--config",), "the document the new agent will use"),
            Option("management_fallback", ("--management-fallback",), "installer fallback"),
            Option("plugin", ("--plugin",), PLUGIN),
            OUTPUT,
        ],
    ),
    Command(
        "doctor",
        "Run the runbook's safe checks: each finding with its code and corrective action."
        "\n\n"
        "Exit 0 when every check passes, 1 otherwise (also when no agent runs).",
        options=[
            STATE_DIR,
            OUTPUT,
            Option(
                "until_stable",
                ("--until-stable",),
                "wait until the stop conditions hold for this long (e.g. 5m)",
            ),
            Option(
                "timeout",
                ("--timeout",),
                "with --until-stable: give up after this long (default twice the window plus 60s)",
            ),
        ],
    ),
    Command(
        "agent run",
        "Run the agent: management first, then recovery, subsystems and the reconcile loop.",
        options=[
            Option("config", ("--config",), "desired-state document"),
            NEW_STATE_DIR,
            Option("control_plane", ("--control-plane",), "control-plane URL"),
            Option("token_file", ("--token-file",), "device credential file"),
            Option(
                "management_fallback",
                ("--management-fallback",),
                "installer document used when nothing was accepted yet",
            ),
            Option("listen_port", ("--listen-port",), "override spec.management.api.port"),
            Option("plugin", ("--plugin",), f"{PLUGIN} (repeatable)"),
            Option("log_level", ("--log-level",), "debug | info | warning"),
        ],
    ),
    Command(
        "agent enroll",
        "Exchange a one-time enrollment bundle for this device's credential.",
        options=[
            Option("bundle", ("--bundle",), "enrollment bundle from `trueup server device enroll`"),
            Option("token_file", ("--token-file",), "where to store the device credential (0600)"),
            Option("control_plane", ("--control-plane",), "override the URL in the bundle"),
        ],
    ),
    Command(
        "agent token",
        "Create a bearer token for the management port (printed once; stored hashed).",
        options=[Option("name", ("--name",), "who the token is for"), STATE_DIR],
    ),
    Command(
        "audit verify",
        "Check the audit log's hash chain; name the first line edited, removed or reordered.",
        options=[STATE_DIR],
    ),
]
COMMANDS: dict[str, Command] = {command.name: command for command in _COMMANDS}

# The groups in `trueup --help`, in its order after the commands above.
GROUPS: dict[str, Group] = {
    group.name: group
    for group in [
        Group("agent", "Run and administer the router agent."),
        Group("audit", "The agent's hash-chained audit log."),
        Group("server", "The trueup control plane."),
        Group(
            "fleet",
            "The fleet on the control plane: devices, profiles and variables, the fleet plan.",
        ),
        Group(
            "management",
            "The management address from the console: works with the agent stopped, hung or "
            "crash-looping.",
        ),
        Group("dhcp", "DHCP (Kea): leases and the allocator fence."),
        Group("backup", "Back the router up into one archive; send it to the control plane."),
        Group("restore", "Analyse (and restore) a backup archive."),
        Group("secret", "The agent's secret store (keys documents refer to by name)."),
        Group(
            "limitation", "Known limitations: permanent, reviewed records of accepted differences."
        ),
    ]
}
